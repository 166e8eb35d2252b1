#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"

namespace pagellm {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Below this many top-k survivors a heap beats nth_element over the vocabulary.
constexpr int32_t kHeapTopK = 256;
// Top-p sorts all candidates up to this many; above, a histogram of weights
// finds the bucket holding the cut and only that bucket is sorted.
constexpr size_t kSortAllNucleus = 4096;
// Weights are in (0, 1], so their float bit patterns are ordered like the
// values; dropping the low 17 bits leaves 6 mantissa bits: buckets ~1.6% wide.
constexpr int kBucketShift = 17;
constexpr uint32_t kNumBuckets = (std::bit_cast<uint32_t>(1.0f) >> kBucketShift) + 1;

uint32_t weight_bucket(float w) { return std::bit_cast<uint32_t>(w) >> kBucketShift; }

// Rank order of top-p: heavier first, then lower id.
bool ranks_before(const TokenWeight& a, const TokenWeight& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

void check_id(const char* what, int32_t id, int32_t vocab) {
  if (id < 0 || id >= vocab) fail("sampler: {} token id {} is outside the vocabulary [0, {})", what, id, vocab);
}

// Undoes process_logits() when sample() leaves, also by an exception.
class RestoreOnExit {
 public:
  RestoreOnExit(Sampler& sampler, float* logits) : sampler_(sampler), logits_(logits) {}
  ~RestoreOnExit() { sampler_.restore_logits(logits_); }
  RestoreOnExit(const RestoreOnExit&) = delete;
  RestoreOnExit& operator=(const RestoreOnExit&) = delete;

 private:
  Sampler& sampler_;
  float* logits_;
};

}  // namespace

float log_softmax_topk(const float* logits, int32_t vocab, int32_t k,
                       std::vector<std::pair<int32_t, float>>& top) {
  top.clear();
  float max_logit = kNegInf;
  for (int32_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[i]) && logits[i] > max_logit) max_logit = logits[i];
  if (max_logit == kNegInf) return std::numeric_limits<float>::infinity();  // every logprob -inf
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[i])) sum += std::exp(logits[i] - max_logit);
  const float log_norm = max_logit + static_cast<float>(std::log(sum));

  k = std::min(k, vocab);
  if (k <= 0) return log_norm;
  auto value = [&](int32_t i) { return std::isfinite(logits[i]) ? logits[i] : kNegInf; };
  // Keep `top` sorted (value desc, id asc) while scanning ids upwards: an
  // equal value seen later never displaces an earlier one.
  top.reserve(k);
  for (int32_t i = 0; i < vocab; ++i) {
    const float v = value(i);
    if (static_cast<int32_t>(top.size()) == k) {
      if (!(v > top.back().second)) continue;
      top.pop_back();
    }
    auto pos = top.end();
    while (pos != top.begin() && (pos - 1)->second < v) --pos;
    top.insert(pos, {i, v});
  }
  for (auto& entry : top) entry.second -= log_norm;
  return log_norm;
}

void Sampler::process_logits(float* logits, int32_t vocab, const SamplingParams& params,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids,
                             std::span<const int32_t> banned_ids) {
  undo_.clear();
  for (const auto& [id, bias] : params.logit_bias) {
    check_id("logit_bias", id, vocab);
    save(logits, id);
    logits[id] += bias;
  }
  for (int32_t id : banned_ids) {
    check_id("banned", id, vocab);
    save(logits, id);
    logits[id] = kNegInf;
  }

  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;
  if (seen_.size() < static_cast<size_t>(vocab)) {
    seen_.resize(vocab, 0);
    counts_.resize(vocab, 0);
  }
  for (int32_t id : prompt_ids) check_id("prompt", id, vocab);
  for (int32_t id : output_ids) check_id("output", id, vocab);

  if (repetition) {
    // Each distinct token once: positive logits shrink, negative ones grow.
    const float penalty = params.repetition_penalty;
    auto penalize = [&](int32_t id) {
      if (seen_[id]) return;
      seen_[id] = 1;
      save(logits, id);
      const float l = logits[id];
      logits[id] = l > 0.0f ? l / penalty : l * penalty;
    };
    for (int32_t id : prompt_ids) penalize(id);
    for (int32_t id : output_ids) penalize(id);
    for (int32_t id : prompt_ids) seen_[id] = 0;
    for (int32_t id : output_ids) seen_[id] = 0;
  }
  if (additive) {
    for (int32_t id : output_ids) ++counts_[id];
    for (int32_t id : output_ids) {
      if (counts_[id] == 0) continue;  // already done
      save(logits, id);
      logits[id] -= params.frequency_penalty * static_cast<float>(counts_[id]);
      logits[id] -= params.presence_penalty;
      counts_[id] = 0;
    }
  }
}

void Sampler::restore_logits(float* logits) {
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) logits[it->first] = it->second;
  undo_.clear();
}

int32_t Sampler::argmax(const float* logits, int32_t vocab) {
  int32_t best = -1;
  float best_value = kNegInf;
  for (int32_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (l > best_value && std::isfinite(l)) {
      best_value = l;
      best = i;
    }
  }
  if (best < 0) fail("sampler: no token can be chosen (all {} logits are -inf, NaN or banned)", vocab);
  return best;
}

// The k-th largest finite logit (ties at it all stay, as in vLLM), or -inf
// when k keeps every finite token.
float Sampler::top_k_threshold(const float* logits, int32_t vocab, int32_t k, float max_logit,
                               size_t n_finite) {
  if (k <= 0 || static_cast<size_t>(k) >= n_finite) return kNegInf;
  if (k == 1) return max_logit;
  values_.clear();
  if (k <= kHeapTopK) {
    // Min-heap of the k largest values seen so far.
    for (int32_t i = 0; i < vocab; ++i) {
      const float l = logits[i];
      if (!std::isfinite(l)) continue;
      if (values_.size() < static_cast<size_t>(k)) {
        values_.push_back(l);
        std::push_heap(values_.begin(), values_.end(), std::greater<>());
      } else if (l > values_.front()) {
        std::pop_heap(values_.begin(), values_.end(), std::greater<>());
        values_.back() = l;
        std::push_heap(values_.begin(), values_.end(), std::greater<>());
      }
    }
    return values_.front();
  }
  for (int32_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[i])) values_.push_back(logits[i]);
  std::nth_element(values_.begin(), values_.begin() + (k - 1), values_.end(), std::greater<>());
  return values_[k - 1];
}

// Keeps, among candidates_[0, n), the tokens whose higher-ranked mass is below
// `target` (vLLM's rule: the smallest top set reaching top_p, at least one
// token). Compacts in place, keeping id order; returns the new count.
size_t Sampler::keep_nucleus(size_t n, double target) {
  if (n <= 1) return n;
  TokenWeight* cands = candidates_.data();
  window_.clear();
  double mass_above = 0.0;  // tokens ranked above the window
  if (n <= kSortAllNucleus) {
    window_.assign(cands, cands + n);
  } else {
    bucket_mass_.assign(kNumBuckets, 0.0);
    for (size_t i = 0; i < n; ++i) bucket_mass_[weight_bucket(cands[i].weight)] += cands[i].weight;
    uint32_t cut_bucket = kNumBuckets;
    for (uint32_t b = kNumBuckets; b-- > 0;) {
      if (mass_above + bucket_mass_[b] >= target) {
        cut_bucket = b;
        break;
      }
      mass_above += bucket_mass_[b];
    }
    if (cut_bucket == kNumBuckets) return n;  // rounding: the target is never reached
    for (size_t i = 0; i < n; ++i)
      if (weight_bucket(cands[i].weight) == cut_bucket) window_.push_back(cands[i]);
  }
  std::sort(window_.begin(), window_.end(), ranks_before);
  TokenWeight last = window_.back();
  double cumulative = mass_above;
  for (size_t j = 0; j < window_.size(); ++j) {
    if (cumulative >= target) {
      last = window_[j == 0 ? 0 : j - 1];  // the top token stays whatever the target
      break;
    }
    cumulative += window_[j].weight;
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)
    if (!ranks_before(last, cands[i])) cands[kept++] = cands[i];
  return kept;
}

Candidates Sampler::filter(const float* logits, int32_t vocab, const SamplingParams& params) {
  PAGELLM_CHECK(params.temperature >= kGreedyTemperature,
                "sampler: filter() needs temperature >= {}, got {}", kGreedyTemperature,
                params.temperature);
  float max_logit = kNegInf;
  size_t n_finite = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!std::isfinite(l)) continue;
    ++n_finite;
    max_logit = std::max(max_logit, l);
  }
  if (n_finite == 0) fail("sampler: no token can be chosen (all {} logits are -inf, NaN or banned)", vocab);

  const float threshold = top_k_threshold(logits, vocab, params.top_k, max_logit, n_finite);

  // Weights of the top-k set; those that underflow to 0 can never be drawn.
  if (candidates_.size() < static_cast<size_t>(vocab)) candidates_.resize(vocab);
  TokenWeight* cands = candidates_.data();
  const float inv_temperature = 1.0f / params.temperature;
  size_t n = 0;
  double total = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!(l >= threshold) || !std::isfinite(l)) continue;
    const float w = std::exp((l - max_logit) * inv_temperature);
    if (w > 0.0f) {
      cands[n++] = {i, w};
      total += w;
    }
  }

  // min-p keeps p >= min_p * p_max, i.e. weight >= min_p (the top weight is 1).
  // It only drops the lowest-ranked tokens, so applying it before top-p gives
  // the same set as vLLM's top-p-then-min-p, as long as top-p's target uses the
  // mass before min-p.
  if (params.min_p > 0.0f) {
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i)
      if (cands[i].weight >= params.min_p) cands[kept++] = cands[i];
    n = kept;
  }
  if (params.top_p < 1.0f) n = keep_nucleus(n, static_cast<double>(params.top_p) * total);

  double kept_total = 0.0;
  for (size_t i = 0; i < n; ++i) kept_total += cands[i].weight;
  return {std::span<const TokenWeight>(cands, n), kept_total};
}

int32_t Sampler::draw(const Candidates& candidates, SamplerRng& rng) {
  PAGELLM_CHECK(!candidates.tokens.empty(), "sampler: nothing to draw from");
  const double u = rng.next_double() * candidates.total;
  double cumulative = 0.0;
  for (const TokenWeight& c : candidates.tokens) {
    cumulative += c.weight;
    if (cumulative > u) return c.id;
  }
  return candidates.tokens.back().id;  // u landed on the rounding edge of the total
}

SampleResult Sampler::sample(float* logits, int32_t vocab, const SamplingParams& params,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids,
                             std::span<const int32_t> banned_ids, SamplerRng& rng) {
  PAGELLM_CHECK(vocab > 0, "sampler: vocabulary size must be > 0, got {}", vocab);
  SampleResult result;
  {
    RestoreOnExit restore(*this, logits);
    process_logits(logits, vocab, params, prompt_ids, output_ids, banned_ids);
    if (params.temperature < kGreedyTemperature) {
      result.token = argmax(logits, vocab);
    } else {
      result.token = draw(filter(logits, vocab, params), rng);
    }
  }
  if (params.logprobs >= 0) {
    const float log_norm = log_softmax_topk(logits, vocab, params.logprobs, result.top_logprobs);
    const float raw = logits[result.token];
    result.logprob = std::isfinite(raw) ? raw - log_norm : kNegInf;
  }
  return result;
}

SampleResult sample(float* logits, int32_t vocab, const SamplingParams& params,
                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                    std::span<const int32_t> banned_ids, SamplerRng& rng) {
  thread_local Sampler sampler;
  return sampler.sample(logits, vocab, params, prompt_ids, output_ids, banned_ids, rng);
}

}  // namespace pagellm
