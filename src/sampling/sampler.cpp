#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "sampling/fast_exp.h"
#include "sampling/softmax_kernels.h"

namespace pagellm {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Below this many top-k survivors a heap beats nth_element over the vocabulary.
constexpr int32_t kHeapTopK = 256;
// Top-p sorts all candidates up to this many; above, a histogram of weights
// finds the bucket holding the cut and only that bucket is sorted.
constexpr size_t kSortAllNucleus = 1024;
// Weights are in (0, 1], so their float bit patterns are ordered like the
// values; dropping the low 17 bits leaves 6 mantissa bits: buckets ~1.6% wide.
constexpr int kBucketShift = 17;
constexpr uint32_t kNumBuckets = (std::bit_cast<uint32_t>(1.0f) >> kBucketShift) + 1;

bool is_finite(float x) { return std::abs(x) <= std::numeric_limits<float>::max(); }

uint32_t weight_bucket(float w) { return std::bit_cast<uint32_t>(w) >> kBucketShift; }

// Rank order of top-p: heavier first, then lower id.
bool ranks_before(float weight_a, int32_t id_a, float weight_b, int32_t id_b) {
  return weight_a > weight_b || (weight_a == weight_b && id_a < id_b);
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
  const float max_logit = finite_max(logits, vocab).max;
  if (max_logit == kNegInf) return std::numeric_limits<float>::infinity();  // every logprob -inf
  const double sum = exp_weights(logits, vocab, max_logit, 1.0f, kNegInf, nullptr);
  const float log_norm = max_logit + static_cast<float>(std::log(sum));

  k = std::min(k, vocab);
  if (k <= 0) return log_norm;
  auto value = [&](int32_t i) { return is_finite(logits[i]) ? logits[i] : kNegInf; };
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
                             std::span<const int32_t> banned_ids, const int32_t* allowed_bitmask) {
  undo_.clear();
  masked_words_.clear();
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
  if (repetition || additive) apply_penalties(logits, vocab, params, prompt_ids, output_ids);
  if (allowed_bitmask) apply_bitmask(logits, vocab, allowed_bitmask);
}

void Sampler::apply_penalties(float* logits, int32_t vocab, const SamplingParams& params,
                              std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids) {
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
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

void Sampler::apply_bitmask(float* logits, int32_t vocab, const int32_t* allowed) {
  // Word by word: an all-ones word (32 allowed tokens) costs one compare, an
  // all-zero one a save and a fill of 32 floats (both loops vectorize).
  if (row_backup_.size() < static_cast<size_t>(vocab)) row_backup_.resize(vocab);
  if (masked_words_.capacity() < static_cast<size_t>(vocab / 32 + 1)) masked_words_.reserve(vocab / 32 + 1);
  masked_vocab_ = vocab;
  const int32_t words = (vocab + 31) / 32;
  for (int32_t w = 0; w < words; ++w) {
    const auto bits = static_cast<uint32_t>(allowed[w]);
    if (bits == 0xffffffffu) continue;
    const int32_t base = w * 32;
    const int32_t n = std::min(vocab - base, 32);
    float* row = logits + base;
    if (save_masked_) {
      std::memcpy(row_backup_.data() + base, row, static_cast<size_t>(n) * sizeof(float));
      masked_words_.push_back(w);
    }
    if (bits == 0 && n == 32) {
      std::fill(row, row + 32, kNegInf);
      continue;
    }
    for (int32_t i = 0; i < n; ++i)
      if (!((bits >> i) & 1u)) row[i] = kNegInf;
  }
}

void Sampler::restore_logits(float* logits) {
  // The mask came last: its words go back first, then the other changes.
  const int32_t vocab = masked_vocab_;
  for (int32_t w : masked_words_) {
    const int32_t base = w * 32;
    const int32_t n = std::min(vocab - base, 32);
    std::memcpy(logits + base, row_backup_.data() + base, static_cast<size_t>(n) * sizeof(float));
  }
  masked_words_.clear();
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) logits[it->first] = it->second;
  undo_.clear();
}

int32_t Sampler::argmax(const float* logits, int32_t vocab) {
  // The maximum first (a loop that vectorizes), then its first position.
  const float max_logit = finite_max(logits, vocab).max;
  if (max_logit == kNegInf)
    fail("sampler: no token can be chosen (all {} logits are -inf, NaN or banned)", vocab);
  int32_t i = 0;
  while (logits[i] != max_logit) ++i;
  return i;
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
      if (!is_finite(l)) continue;
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
    if (is_finite(logits[i])) values_.push_back(logits[i]);
  std::nth_element(values_.begin(), values_.begin() + (k - 1), values_.end(), std::greater<>());
  return values_[k - 1];
}

size_t Sampler::keep_if_weight_at_least(size_t n, float min_weight) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    ids_[kept] = ids_[i];
    weights_[kept] = weights_[i];
    kept += weights_[i] >= min_weight;
  }
  return kept;
}

// Keeps, among the n candidates, the tokens whose higher-ranked mass is below
// `target` (vLLM's rule: the smallest top set reaching top_p, at least one
// token). Compacts in place, keeping id order; returns the new count.
size_t Sampler::keep_nucleus(size_t n, double target) {
  if (n <= 1) return n;
  const int32_t* ids = ids_.data();
  const float* weights = weights_.data();
  window_.clear();
  double mass_above = 0.0;  // tokens ranked above the window
  if (n <= kSortAllNucleus) {
    for (size_t i = 0; i < n; ++i) window_.push_back({ids[i], weights[i]});
  } else {
    // kCopies interleaved histograms: neighbours often share a bucket, and
    // one histogram would make each add wait for the previous one.
    constexpr size_t kCopies = 4;
    bucket_mass_.assign(kNumBuckets * kCopies, 0.0);
    double* mass = bucket_mass_.data();
    size_t i = 0;
    for (; i + kCopies <= n; i += kCopies)
      for (size_t c = 0; c < kCopies; ++c)
        mass[weight_bucket(weights[i + c]) * kCopies + c] += weights[i + c];
    for (; i < n; ++i) mass[weight_bucket(weights[i]) * kCopies] += weights[i];
    uint32_t cut_bucket = kNumBuckets;
    for (uint32_t b = kNumBuckets; b-- > 0;) {
      const double* m = mass + b * kCopies;
      const double bucket = (m[0] + m[1]) + (m[2] + m[3]);
      if (mass_above + bucket >= target) {
        cut_bucket = b;
        break;
      }
      mass_above += bucket;
    }
    if (cut_bucket == kNumBuckets) return n;  // rounding: the target is never reached
    for (size_t i = 0; i < n; ++i)
      if (weight_bucket(weights[i]) == cut_bucket) window_.push_back({ids[i], weights[i]});
  }
  std::sort(window_.begin(), window_.end(), [](const Ranked& a, const Ranked& b) {
    return ranks_before(a.weight, a.id, b.weight, b.id);
  });
  Ranked last = window_.back();
  double cumulative = mass_above;
  for (size_t j = 0; j < window_.size(); ++j) {
    if (cumulative >= target) {
      last = window_[j == 0 ? 0 : j - 1];  // the top token stays whatever the target
      break;
    }
    cumulative += window_[j].weight;
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {  // branch-free: about half the tokens go
    const float w = weights_[i];
    const int32_t id = ids_[i];
    ids_[kept] = id;
    weights_[kept] = w;
    kept += static_cast<size_t>((w > last.weight) | ((w == last.weight) & (id <= last.id)));
  }
  return kept;
}

Candidates Sampler::filter(const float* logits, int32_t vocab, const SamplingParams& params) {
  PAGELLM_CHECK(params.temperature >= kGreedyTemperature,
                "sampler: filter() needs temperature >= {}, got {}", kGreedyTemperature,
                params.temperature);
  const FiniteMax finite = finite_max(logits, vocab);
  if (finite.count == 0)
    fail("sampler: no token can be chosen (all {} logits are -inf, NaN or banned)", vocab);
  const float threshold = top_k_threshold(logits, vocab, params.top_k, finite.max, finite.count);

  if (ids_.size() < static_cast<size_t>(vocab)) {
    dense_weights_.resize(vocab);
    ids_.resize(vocab);
    weights_.resize(vocab);
  }
  const float inv_temperature = 1.0f / params.temperature;
  // min-p keeps p >= min_p * p_max, i.e. weight >= min_p (the top weight is
  // 1). It only drops the lowest-ranked tokens, so applying it before top-p
  // gives the same set as vLLM's top-p-then-min-p, as long as top-p's target
  // uses the mass before min-p. Weights that underflow to 0 are never drawn.
  float min_weight = std::max(params.min_p, std::numeric_limits<float>::min());
  size_t n = 0;
  double total = 0.0;  // mass of the top-k set: top-p's reference
  if (threshold > kNegInf) {
    // Top-k: gather the few survivors, then weigh only them. exp_nonpositive()
    // gives the same bits as exp_weights(), so both paths agree exactly.
    for (int32_t i = 0; i < vocab; ++i)
      if (logits[i] >= threshold && is_finite(logits[i])) ids_[n++] = i;
    for (size_t j = 0; j < n; ++j)
      weights_[j] = exp_nonpositive((logits[ids_[j]] - finite.max) * inv_temperature);
    total = sum_weights(weights_.data(), n);
    n = keep_if_weight_at_least(n, min_weight);
  } else {
    total = exp_weights(logits, vocab, finite.max, inv_temperature, kNegInf, dense_weights_.data());
    if (params.top_p >= 1.0f && params.min_p <= 0.0f) {
      // Temperature alone: draw from the whole row; zero weights are never drawn.
      if (all_ids_.size() < static_cast<size_t>(vocab)) {
        all_ids_.resize(vocab);
        std::iota(all_ids_.begin(), all_ids_.end(), 0);
      }
      return {std::span<const int32_t>(all_ids_.data(), vocab),
              std::span<const float>(dense_weights_.data(), vocab), total};
    }
    if (params.top_p < 1.0f) {
      // All tokens below t weigh less than finite.count * t together; when
      // that is at most (1 - top_p) of the total, the tokens above t already
      // reach top_p and none below t can be in the nucleus. Halved for rounding.
      const double t = 0.5 * (1.0 - static_cast<double>(params.top_p)) * total / double(finite.count);
      min_weight = std::max(min_weight, static_cast<float>(t));
    }
    for (int32_t i = 0; i < vocab; ++i) {  // branch-free compaction
      const float w = dense_weights_[i];
      ids_[n] = i;
      weights_[n] = w;
      n += w >= min_weight;
    }
  }
  if (params.top_p < 1.0f) n = keep_nucleus(n, static_cast<double>(params.top_p) * total);

  // Summed again over the kept weights, in the order draw() walks them.
  return {std::span<const int32_t>(ids_.data(), n), std::span<const float>(weights_.data(), n),
          sum_weights(weights_.data(), n)};
}

int32_t Sampler::draw(const Candidates& candidates, SamplerRng& rng) { return draw_at(candidates, rng.next_double()); }

int32_t Sampler::sample_plain(const float* logits, int32_t vocab, float temperature, int32_t top_k, float top_p,
                              float min_p, double u) {
  bool finite = false;
  for (int32_t i = 0; i < vocab && !finite; ++i) finite = std::isfinite(logits[i]);
  if (!finite) return -1;
  if (temperature < kGreedyTemperature) return argmax(logits, vocab);
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  const Candidates c = filter(logits, vocab, p);
  return c.ids.empty() ? -1 : draw_at(c, u);
}

int32_t Sampler::draw_at(const Candidates& candidates, double unit) {
  const size_t n = candidates.ids.size();
  PAGELLM_CHECK(n > 0 && candidates.weights.size() == n, "sampler: nothing to draw from");
  const double u = unit * candidates.total;
  // Whole blocks first, summed exactly as sum_weights() does, then one block
  // token by token.
  double cumulative = 0.0;
  for (size_t start = 0; start < n; start += kSumBlock) {
    const size_t len = std::min(kSumBlock, n - start);
    const double block = block_sum(candidates.weights.data() + start, len);
    if (cumulative + block > u) {
      for (size_t i = start; i < start + len; ++i) {
        cumulative += candidates.weights[i];
        if (cumulative > u) return candidates.ids[i];
      }
      return candidates.ids[start + len - 1];  // float block sum vs double walk rounding
    }
    cumulative += block;
  }
  return candidates.ids[n - 1];  // u landed on the rounding edge of the total
}

SampleResult Sampler::sample(float* logits, int32_t vocab, const SamplingParams& params,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids,
                             std::span<const int32_t> banned_ids, SamplerRng& rng,
                             const int32_t* allowed_bitmask, bool restore_masked) {
  return sample_impl(logits, vocab, params, prompt_ids, output_ids, banned_ids, rng, allowed_bitmask, restore_masked,
                     -1, nullptr, nullptr);
}

SampleResult Sampler::sample_against_draft(float* logits, int32_t vocab, const SamplingParams& params,
                                           std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                                           std::span<const int32_t> banned_ids, SamplerRng& rng,
                                           const int32_t* allowed_bitmask, bool restore_masked, int32_t draft_token,
                                           const float* draft_probs, bool& accepted) {
  check_id("draft", draft_token, vocab);
  return sample_impl(logits, vocab, params, prompt_ids, output_ids, banned_ids, rng, allowed_bitmask, restore_masked,
                     draft_token, draft_probs, &accepted);
}

SampleResult Sampler::sample_impl(float* logits, int32_t vocab, const SamplingParams& params,
                                  std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                                  std::span<const int32_t> banned_ids, SamplerRng& rng,
                                  const int32_t* allowed_bitmask, bool restore_masked, int32_t draft_token,
                                  const float* draft_probs, bool* accepted) {
  PAGELLM_CHECK(vocab > 0, "sampler: vocabulary size must be > 0, got {}", vocab);
  SampleResult result;
  {
    RestoreOnExit restore(*this, logits);
    save_masked_ = restore_masked;
    process_logits(logits, vocab, params, prompt_ids, output_ids, banned_ids, allowed_bitmask);
    save_masked_ = true;
    if (params.temperature < kGreedyTemperature) {
      result.token = argmax(logits, vocab);
      if (accepted) *accepted = result.token == draft_token;
    } else if (!draft_probs) {
      result.token = draw(filter(logits, vocab, params), rng);
    } else {
      result.token = draw_against_draft(filter(logits, vocab, params), draft_token, draft_probs, rng, *accepted);
    }
  }
  if (params.logprobs >= 0) {
    const float log_norm = log_softmax_topk(logits, vocab, params.logprobs, result.top_logprobs);
    const float raw = logits[result.token];
    result.logprob = std::isfinite(raw) ? raw - log_norm : kNegInf;
  }
  return result;
}

int32_t Sampler::draw_against_draft(const Candidates& c, int32_t draft_token, const float* draft_probs,
                                    SamplerRng& rng, bool& accepted) {
  const auto at = std::lower_bound(c.ids.begin(), c.ids.end(), draft_token);
  const double p_draft = at != c.ids.end() && *at == draft_token
                             ? double(c.weights[static_cast<size_t>(at - c.ids.begin())]) / c.total
                             : 0.0;
  const double q_draft = draft_probs[draft_token];
  // u < p/q, written without the division (q may be 0 after rounding).
  accepted = q_draft > 0.0 && rng.next_double() * q_draft < p_draft;
  if (accepted) return draft_token;
  const size_t n = c.ids.size();
  if (residual_.size() < n) residual_.resize(n);
  for (size_t i = 0; i < n; ++i)
    residual_[i] = std::max(0.0f, static_cast<float>(double(c.weights[i]) / c.total) - draft_probs[c.ids[i]]);
  const double mass = sum_weights(residual_.data(), n);
  // p <= q everywhere only by rounding (then p == q): draw from p.
  return mass > 0.0 ? draw({c.ids, std::span<const float>(residual_.data(), n), mass}, rng) : draw(c, rng);
}

void min_tokens_banned_ids(const SamplingParams& params, std::span<const int32_t> eos_ids,
                           int32_t num_generated, std::vector<int32_t>& out) {
  out.clear();
  if (num_generated >= params.min_tokens) return;
  out.assign(params.stop_token_ids.begin(), params.stop_token_ids.end());
  if (!params.ignore_eos) out.insert(out.end(), eos_ids.begin(), eos_ids.end());
}

SampleResult sample(float* logits, int32_t vocab, const SamplingParams& params,
                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                    std::span<const int32_t> banned_ids, SamplerRng& rng) {
  thread_local Sampler sampler;
  return sampler.sample(logits, vocab, params, prompt_ids, output_ids, banned_ids, rng);
}

}  // namespace pagellm
