#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "sampling/fast_exp.h"

namespace pagellm {
namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(int32_t vocab, uint32_t seed, float stddev) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = dist(gen);
  return logits;
}

SamplingParams random_params() {
  SamplingParams p;
  p.temperature = 1.0f;
  return p;
}

// ---------------------------------------------------------------------------
// Reference: the whole distribution in double, one filter after the other,
// renormalizing between them (vLLM's V0 order: top-k, top-p, min-p).
struct ReferenceDistribution {
  std::vector<double> prob;        // [vocab], 0 outside the kept set
  std::vector<bool> borderline;    // [vocab] within rounding of a filter's cut
};

void renormalize(std::vector<double>& p) {
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
}

ReferenceDistribution reference_distribution(const std::vector<float>& logits,
                                             const SamplingParams& params) {
  const size_t vocab = logits.size();
  ReferenceDistribution ref{std::vector<double>(vocab, 0.0), std::vector<bool>(vocab, false)};
  std::vector<double>& p = ref.prob;
  double max_z = -INFINITY;
  for (float l : logits)
    if (std::isfinite(l)) max_z = std::max(max_z, double(l) / params.temperature);
  for (size_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[i])) p[i] = std::exp(double(logits[i]) / params.temperature - max_z);
  renormalize(p);

  if (params.top_k > 0) {
    std::vector<float> sorted;
    for (float l : logits)
      if (std::isfinite(l)) sorted.push_back(l);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (static_cast<size_t>(params.top_k) < sorted.size()) {
      const float kth = sorted[params.top_k - 1];
      for (size_t i = 0; i < vocab; ++i)
        if (!(logits[i] >= kth)) p[i] = 0.0;
      renormalize(p);
    }
  }
  if (params.top_p < 1.0f) {
    std::vector<size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double above = 0.0;
    const double top_p = params.top_p;
    for (size_t i : order) {
      if (std::abs(above - top_p) < 1e-5) ref.borderline[i] = true;
      if (above >= top_p) p[i] = 0.0;
      above += p[i];
    }
    renormalize(p);
  }
  if (params.min_p > 0.0f) {
    const double p_max = *std::max_element(p.begin(), p.end());
    for (size_t i = 0; i < vocab; ++i) {
      if (p[i] == 0.0) continue;
      if (std::abs(p[i] / p_max - params.min_p) < 1e-5) ref.borderline[i] = true;
      if (p[i] < params.min_p * p_max) p[i] = 0.0;
    }
    renormalize(p);
  }
  return ref;
}

// Compares Sampler::filter() with the reference: same kept set (up to tokens
// on a cut's rounding edge) and the same probabilities.
void expect_matches_reference(const std::vector<float>& logits, const SamplingParams& params) {
  Sampler sampler;
  const Candidates got = sampler.filter(logits.data(), static_cast<int32_t>(logits.size()), params);
  const ReferenceDistribution ref = reference_distribution(logits, params);

  std::vector<double> got_prob(logits.size(), 0.0);
  ASSERT_EQ(got.ids.size(), got.weights.size());
  int32_t prev_id = -1;
  for (size_t i = 0; i < got.ids.size(); ++i) {
    ASSERT_GT(got.ids[i], prev_id) << "candidates must be in id order";
    prev_id = got.ids[i];
    got_prob[got.ids[i]] = got.weights[i] / got.total;
  }
  size_t set_differences = 0, kept = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool in_got = got_prob[i] > 0.0, in_ref = ref.prob[i] > 0.0;
    kept += in_ref;
    if (in_got != in_ref) {
      ++set_differences;
      EXPECT_TRUE(ref.borderline[i]) << "token " << i << " kept by sampler: " << in_got
                                     << ", by reference: " << in_ref;
    }
  }
  ASSERT_GT(kept, 0u);
  // A borderline token moves about 1/kept of the mass.
  const double tolerance = set_differences == 0 ? 1e-5 : 1e-5 + 2.0 / double(kept);
  for (size_t i = 0; i < logits.size(); ++i) {
    if ((got_prob[i] > 0.0) != (ref.prob[i] > 0.0)) continue;
    EXPECT_NEAR(got_prob[i], ref.prob[i], tolerance * std::max(ref.prob[i], 1e-6)) << "token " << i;
  }
}

// ---------------------------------------------------------------------------

TEST(SamplerRng, SplitMix64MatchesPublishedOutput) {
  // First outputs of splitmix64 seeded with 0 (Vigna's reference code).
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64_next(state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(splitmix64_next(state), 0x06C45D188009454Full);
}

TEST(SamplerRng, SameSeedSameNumbersDifferentSeedsDiffer) {
  SamplerRng a(42), b(42), c(43), d(42, 1);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    same_c += x == c.next_u64();
    same_d += x == d.next_u64();
  }
  EXPECT_EQ(same_c, 0);
  EXPECT_EQ(same_d, 0);
}

TEST(SamplerRng, UniformsAreInRangeAndBalanced) {
  SamplerRng rng(7);
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = rng.next_double();
    const float f = rng.next_float();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_GE(f, 0.0f);
    ASSERT_LT(f, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
}

TEST(SamplerRng, EntropySeedsDiffer) {
  EXPECT_NE(SamplerRng::from_entropy().next_u64(), SamplerRng::from_entropy().next_u64());
  SamplingParams p;
  p.seed = 5;
  EXPECT_EQ(SamplerRng::for_request(p, 2).next_u64(), SamplerRng(5, 2).next_u64());
}

TEST(SamplerExp, MatchesStdExpOnNonPositiveInputs) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-87.0f, 0.0f);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -0.001f * i : dist(gen);
    const double exact = std::exp(double(x));
    worst = std::max(worst, std::abs(exp_nonpositive(x) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  SamplerRng rng(1);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = random_logits(5000, seed, 3.0f);
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.sample(logits.data(), 5000, p, {}, {}, {}, rng).token, expected);
  }
  std::vector<float> ties = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 3.0f, 3.0f};
  EXPECT_EQ(sampler.sample(ties.data(), 7, p, {}, {}, {}, rng).token, 3);
  // NaN and +inf logits are never chosen.
  ties[0] = std::numeric_limits<float>::quiet_NaN();
  ties[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampler.sample(ties.data(), 7, p, {}, {}, {}, rng).token, 3);
  // Tiny temperatures are greedy too.
  p.temperature = 1e-7f;
  EXPECT_EQ(sampler.sample(ties.data(), 7, p, {}, {}, {}, rng).token, 3);
}

TEST(Sampler, TemperatureMatchesReference) {
  for (float temperature : {0.3f, 1.0f, 1.7f}) {
    SCOPED_TRACE(temperature);
    SamplingParams p = random_params();
    p.temperature = temperature;
    expect_matches_reference(random_logits(2000, 11, 2.0f), p);
  }
}

TEST(Sampler, TopKMatchesReference) {
  for (int32_t k : {1, 2, 40, 256, 257, 1000, 1999, 2000, 5000, -1}) {
    SCOPED_TRACE(k);
    SamplingParams p = random_params();
    p.top_k = k;
    p.temperature = 0.8f;
    expect_matches_reference(random_logits(2000, 12 + k, 2.0f), p);
  }
}

TEST(Sampler, TopKKeepsTiesAtTheCut) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  SamplingParams p = random_params();
  p.top_k = 2;
  Sampler sampler;
  const Candidates c = sampler.filter(logits.data(), 6, p);
  EXPECT_EQ(std::vector<int32_t>(c.ids.begin(), c.ids.end()), (std::vector<int32_t>{1, 2, 3, 5}));
}

TEST(Sampler, TopPMatchesReference) {
  // 2000 tokens: the sort-everything path; 60000 with flat logits: the
  // histogram path (more than 4096 candidates).
  for (int32_t vocab : {2000, 60000}) {
    for (float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
      for (float stddev : {0.5f, 3.0f}) {
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << " top_p " << top_p << " std " << stddev);
        SamplingParams p = random_params();
        p.top_p = top_p;
        expect_matches_reference(random_logits(vocab, vocab + uint32_t(top_p * 100), stddev), p);
      }
    }
  }
}

TEST(Sampler, TopPKeepsAtLeastTheTopToken) {
  std::vector<float> logits = {0.0f, 10.0f, 0.0f};
  SamplingParams p = random_params();
  p.top_p = 1e-6f;
  Sampler sampler;
  const Candidates c = sampler.filter(logits.data(), 3, p);
  ASSERT_EQ(c.ids.size(), 1u);
  EXPECT_EQ(c.ids[0], 1);
}

TEST(Sampler, MinPMatchesReference) {
  for (float min_p : {0.01f, 0.1f, 0.5f, 1.0f}) {
    SCOPED_TRACE(min_p);
    SamplingParams p = random_params();
    p.min_p = min_p;
    expect_matches_reference(random_logits(3000, 99, 2.0f), p);
  }
}

TEST(Sampler, CombinedFiltersMatchReference) {
  for (uint32_t seed = 0; seed < 6; ++seed) {
    SamplingParams p = random_params();
    p.temperature = 0.6f + 0.2f * seed;
    p.top_k = seed % 2 ? 500 : 50;
    p.top_p = 0.8f + 0.03f * seed;
    p.min_p = 0.02f * seed;
    SCOPED_TRACE(seed);
    expect_matches_reference(random_logits(8000, 1000 + seed, 1.5f), p);
  }
  // Flat logits, no top-k: top-p over the histogram path, then min-p.
  SamplingParams p = random_params();
  p.top_p = 0.7f;
  p.min_p = 0.3f;
  expect_matches_reference(random_logits(100000, 5, 1.0f), p);
}

// Temperature alone; top-k with top-p; top-p with min-p: the draw tests' filter settings.
std::vector<SamplingParams> filter_configs() {
  struct Config {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  std::vector<SamplingParams> out;
  for (const Config& cfg : {Config{1.0f, 0, 1.0f, 0.0f}, Config{0.7f, 8, 0.9f, 0.0f}, Config{1.3f, 0, 0.95f, 0.05f}}) {
    SamplingParams p;
    p.temperature = cfg.temperature;
    p.top_k = cfg.top_k;
    p.top_p = cfg.top_p;
    p.min_p = cfg.min_p;
    out.push_back(p);
  }
  return out;
}

TEST(Sampler, EmpiricalFrequenciesMatchDistribution) {
  for (const SamplingParams& p : filter_configs()) {
    SCOPED_TRACE(p.temperature);
    std::vector<float> logits = random_logits(12, 3, 1.0f);
    const ReferenceDistribution ref = reference_distribution(logits, p);

    Sampler sampler;
    SamplerRng rng(2024);
    const int draws = 20000;
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits.data(), 12, p, {}, {}, {}, rng).token];
    double chi2 = 0.0;
    int categories = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (ref.prob[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is filtered out";
        continue;
      }
      const double expected = ref.prob[i] * draws;
      chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
      ++categories;
    }
    // The 99.9th percentile of chi-square with 11 degrees of freedom is 31.3.
    EXPECT_LT(chi2, 31.3) << categories << " categories";
  }
}

// Speculative decoding with a draft distribution q: drafts drawn from q and
// accepted with min(1, p/q), else replaced by a draw from (p - q)+, come out
// distributed as p itself, whatever q is (Leviathan et al. 2023, Theorem 1).
TEST(Sampler, RejectionSamplingAgainstADraftReproducesTheTarget) {
  const int32_t vocab = 12;
  for (const SamplingParams& p : filter_configs()) {
    SCOPED_TRACE(p.temperature);
    std::vector<float> logits = random_logits(vocab, 3, 1.0f);
    const ReferenceDistribution ref = reference_distribution(logits, p);
    // A draft that disagrees: its own random distribution over every token.
    std::vector<float> q(vocab);
    std::mt19937 gen(9);
    std::uniform_real_distribution<float> u(0.05f, 1.0f);
    for (float& x : q) x = u(gen);
    const float q_sum = std::accumulate(q.begin(), q.end(), 0.0f);
    for (float& x : q) x /= q_sum;
    std::discrete_distribution<int32_t> draft(q.begin(), q.end());

    Sampler sampler;
    SamplerRng rng(77);
    const int draws = 40000;
    std::vector<int> counts(vocab, 0);
    int accepted_count = 0;
    for (int i = 0; i < draws; ++i) {
      const int32_t d = draft(gen);
      bool accepted = false;
      const SampleResult r =
          sampler.sample_against_draft(logits.data(), vocab, p, {}, {}, {}, rng, nullptr, true, d, q.data(), accepted);
      ASSERT_EQ(accepted, r.token == d);
      accepted_count += accepted;
      ++counts[r.token];
    }
    double chi2 = 0.0, expected_acceptance = 0.0;
    for (int32_t i = 0; i < vocab; ++i) {
      expected_acceptance += std::min<double>(q[i], ref.prob[i]);
      if (ref.prob[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is filtered out";
        continue;
      }
      const double expected = ref.prob[i] * draws;
      chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    EXPECT_LT(chi2, 31.3);  // 99.9th percentile of chi-square, 11 degrees of freedom
    // The acceptance rate is sum(min(p, q)): 4 standard deviations.
    EXPECT_NEAR(double(accepted_count) / draws, expected_acceptance, 4 * std::sqrt(0.25 / draws));
  }
}

TEST(Sampler, RejectionSamplingGreedyAndEqualDistributions) {
  const int32_t vocab = 50;
  std::vector<float> logits = random_logits(vocab, 5, 2.0f);
  const int32_t best = Sampler::argmax(logits.data(), vocab);
  std::vector<float> q(vocab, 1.0f / vocab);
  Sampler sampler;
  SamplerRng rng(1);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 2;
  bool accepted = false;
  SampleResult r = sampler.sample_against_draft(logits.data(), vocab, greedy, {}, {}, {}, rng, nullptr, true, best,
                                                q.data(), accepted);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(r.token, best);
  EXPECT_EQ(r.top_logprobs.size(), 2u);
  r = sampler.sample_against_draft(logits.data(), vocab, greedy, {}, {}, {}, rng, nullptr, true, (best + 1) % vocab,
                                   q.data(), accepted);
  EXPECT_FALSE(accepted);
  EXPECT_EQ(r.token, best);
  // q == p: every draft is accepted.
  SamplingParams p;
  p.temperature = 1.0f;
  const ReferenceDistribution ref = reference_distribution(logits, p);
  std::vector<float> same(ref.prob.begin(), ref.prob.end());
  std::discrete_distribution<int32_t> draft(same.begin(), same.end());
  std::mt19937 gen(3);
  int accepted_count = 0;
  for (int i = 0; i < 2000; ++i) {
    const int32_t d = draft(gen);
    sampler.sample_against_draft(logits.data(), vocab, p, {}, {}, {}, rng, nullptr, true, d, same.data(), accepted);
    accepted_count += accepted;
  }
  EXPECT_GE(accepted_count, 1990);  // all but rounding at the very edge
  // The row is restored; a draft id outside the vocabulary is refused.
  const std::vector<float> before = logits;
  EXPECT_THROW(sampler.sample_against_draft(logits.data(), vocab, p, {}, {}, {}, rng, nullptr, true, vocab, q.data(),
                                            accepted),
               Error);
  EXPECT_EQ(logits, before);
}

TEST(Sampler, SeedReproducesSequenceIndependentOfOtherWork) {
  std::vector<float> logits = random_logits(3000, 8, 2.0f);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed, bool interleave) {
    Sampler sampler;
    SamplerRng rng(seed), other(999);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 50; ++i) {
      if (interleave) {  // another sequence sampling in between on the same Sampler
        std::vector<float> noise = random_logits(500, i, 1.0f);
        sampler.sample(noise.data(), 500, p, {}, {}, {}, other);
      }
      tokens.push_back(sampler.sample(logits.data(), 3000, p, {}, {}, {}, rng).token);
    }
    return tokens;
  };
  const auto a = run(1234, false);
  EXPECT_EQ(a, run(1234, true));
  EXPECT_NE(a, run(1235, false));
  // Locked values: a change of the RNG, of its uniform conversion or of the
  // candidate order changes what seeded requests produce.
  const std::vector<int32_t> first_five(a.begin(), a.begin() + 5);
  EXPECT_EQ(first_five, (std::vector<int32_t>{159, 2602, 2082, 2688, 342}));
}

TEST(Sampler, PenaltiesMatchHandComputedValues) {
  //                          0     1      2     3     4     5
  std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.5f, -0.5f, 3.0f};
  const std::vector<float> original = logits;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.logit_bias = {{0, 1.0f}, {4, 1.0f}};
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {2, 2, 3};
  const std::vector<int32_t> banned = {5};
  Sampler sampler;
  sampler.process_logits(logits.data(), 6, p, prompt, output, banned);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);    // (1 + 1) / 2, penalized once although seen twice
  EXPECT_FLOAT_EQ(logits[1], -2.0f);   // -1 * 2
  EXPECT_FLOAT_EQ(logits[2], -0.25f);  // 2 / 2 - 0.5 * 2 - 0.25
  EXPECT_FLOAT_EQ(logits[3], -0.5f);   // 0.5 / 2 - 0.5 * 1 - 0.25
  EXPECT_FLOAT_EQ(logits[4], 0.5f);    // -0.5 + 1, not seen
  EXPECT_EQ(logits[5], kNegInf);       // banned
  sampler.restore_logits(logits.data());
  EXPECT_EQ(logits, original);

  // Penalties alone, other values.
  p = SamplingParams{};
  p.presence_penalty = -1.0f;
  p.frequency_penalty = 0.1f;
  sampler.process_logits(logits.data(), 6, p, prompt, std::vector<int32_t>{4, 4, 4, 1}, {});
  EXPECT_FLOAT_EQ(logits[4], -0.5f - 0.3f + 1.0f);
  EXPECT_FLOAT_EQ(logits[1], -1.0f - 0.1f + 1.0f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);  // prompt tokens get no additive penalty
  sampler.restore_logits(logits.data());
  EXPECT_EQ(logits, original);
}

TEST(Sampler, SampleLeavesLogitsUnchanged) {
  std::vector<float> logits = random_logits(1000, 4, 2.0f);
  const std::vector<float> original = logits;
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.logit_bias = {{3, 5.0f}};
  p.top_k = 20;
  SamplerRng rng(3);
  Sampler sampler;
  const std::vector<int32_t> prompt = {1, 2, 3, 1}, output = {7, 7, 9}, banned = {0};
  sampler.sample(logits.data(), 1000, p, prompt, output, banned, rng);
  EXPECT_EQ(logits, original);
  // Also when it throws half way (bad id after some writes).
  const std::vector<int32_t> bad_output = {7, 1000};
  EXPECT_THROW(sampler.sample(logits.data(), 1000, p, prompt, bad_output, banned, rng), Error);
  EXPECT_EQ(logits, original);
}

TEST(Sampler, LogitBiasForcesAndForbidsTokens) {
  std::vector<float> logits = random_logits(5000, 5, 2.0f);
  Sampler sampler;
  SamplerRng rng(6);
  SamplingParams p;
  p.temperature = 1.0f;
  p.logit_bias = {{4321, 100.0f}};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits.data(), 5000, p, {}, {}, {}, rng).token, 4321);

  const int32_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  p.temperature = 0.0f;
  p.logit_bias = {{best, -100.0f}};
  EXPECT_NE(sampler.sample(logits.data(), 5000, p, {}, {}, {}, rng).token, best);
}

TEST(Sampler, BannedIdsAreNeverSampled) {
  std::vector<float> logits = random_logits(200, 6, 1.0f);
  std::vector<int32_t> order(200);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::vector<int32_t> banned(order.begin(), order.begin() + 5);  // the 5 likeliest
  Sampler sampler;
  SamplerRng rng(7);
  SamplingParams p;
  p.temperature = 1.5f;
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = sampler.sample(logits.data(), 200, p, {}, {}, banned, rng).token;
    ASSERT_EQ(std::count(banned.begin(), banned.end(), t), 0);
  }
  p.temperature = 0.0f;
  EXPECT_EQ(sampler.sample(logits.data(), 200, p, {}, {}, banned, rng).token, order[5]);
  // Everything banned: an error, not a crash.
  EXPECT_THROW(sampler.sample(logits.data(), 200, p, {}, {}, order, rng), Error);
  p.temperature = 1.0f;
  EXPECT_THROW(sampler.sample(logits.data(), 200, p, {}, {}, order, rng), Error);
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogits) {
  const int32_t vocab = 4000;
  std::vector<float> logits = random_logits(vocab, 9, 3.0f);
  double max_l = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - max_l);
  const double log_norm = max_l + std::log(sum);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

  SamplingParams p;
  p.temperature = 0.7f;
  p.logprobs = 5;
  p.repetition_penalty = 1.5f;  // processing must not leak into the logprobs
  p.logit_bias = {{order[0], -50.0f}};
  Sampler sampler;
  SamplerRng rng(10);
  const std::vector<int32_t> prompt = {order[1], order[2]};
  for (int i = 0; i < 20; ++i) {
    const SampleResult r = sampler.sample(logits.data(), vocab, p, prompt, {}, {}, rng);
    EXPECT_NEAR(r.logprob, logits[r.token] - log_norm, 1e-4);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(r.top_logprobs[j].first, order[j]);
      EXPECT_NEAR(r.top_logprobs[j].second, logits[order[j]] - log_norm, 1e-4);
    }
  }
  p.logprobs = 0;
  const SampleResult r = sampler.sample(logits.data(), vocab, p, prompt, {}, {}, rng);
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_NEAR(r.logprob, logits[r.token] - log_norm, 1e-4);
  p.logprobs = -1;
  EXPECT_EQ(sampler.sample(logits.data(), vocab, p, prompt, {}, {}, rng).logprob, 0.0f);
}

TEST(Sampler, LogSoftmaxTopKOrdersTiesByIdAndSkipsNonFinite) {
  const std::vector<float> logits = {1.0f, 2.0f, kNegInf, 2.0f, std::numeric_limits<float>::quiet_NaN(),
                                     0.0f};
  std::vector<std::pair<int32_t, float>> top;
  const float log_norm = log_softmax_topk(logits.data(), 6, 3, top);
  const double expected = std::log(std::exp(1.0) + 2 * std::exp(2.0) + 1.0);
  EXPECT_NEAR(log_norm, expected, 1e-5);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 0);
  EXPECT_NEAR(top[2].second, 1.0 - expected, 1e-5);
}

TEST(Sampler, FreeFunctionAndBadInputs) {
  std::vector<float> logits = random_logits(100, 1, 1.0f);
  SamplingParams p;
  SamplerRng rng(1);
  const int32_t t = sample(logits.data(), 100, p, {}, {}, {}, rng).token;
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 100);
  p.logit_bias = {{100, 1.0f}};
  EXPECT_THROW(sample(logits.data(), 100, p, {}, {}, {}, rng), Error);
  p = SamplingParams{};
  p.repetition_penalty = 1.2f;  // prompt ids are only read for penalties
  const std::vector<int32_t> bad = {-1};
  EXPECT_THROW(sample(logits.data(), 100, p, bad, {}, {}, rng), Error);
  EXPECT_THROW(sample(logits.data(), 0, p, {}, {}, {}, rng), Error);
  std::vector<float> nans(10, std::numeric_limits<float>::quiet_NaN());
  EXPECT_THROW(sample(nans.data(), 10, p, {}, {}, {}, rng), Error);
}

TEST(Sampler, MinTokensBansStopTokensUntilReached) {
  SamplingParams p;
  p.min_tokens = 3;
  p.stop_token_ids = {7, 8};
  const std::vector<int32_t> eos = {2};
  std::vector<int32_t> banned = {99};
  min_tokens_banned_ids(p, eos, 0, banned);
  EXPECT_EQ(banned, (std::vector<int32_t>{7, 8, 2}));
  min_tokens_banned_ids(p, eos, 2, banned);
  EXPECT_EQ(banned.size(), 3u);
  min_tokens_banned_ids(p, eos, 3, banned);
  EXPECT_TRUE(banned.empty());
  p.ignore_eos = true;
  min_tokens_banned_ids(p, eos, 0, banned);
  EXPECT_EQ(banned, (std::vector<int32_t>{7, 8}));

  // EOS is the likeliest token, yet never drawn while banned.
  std::vector<float> logits = {0.0f, 0.5f, 5.0f, 0.2f, 0.1f, 0.0f, 0.0f, 1.0f, 1.0f};
  p.ignore_eos = false;
  min_tokens_banned_ids(p, eos, 1, banned);
  SamplerRng rng(4);
  Sampler sampler;
  for (int i = 0; i < 500; ++i) {
    const int32_t t = sampler.sample(logits.data(), 9, p, {}, {}, banned, rng).token;
    ASSERT_TRUE(t != 2 && t != 7 && t != 8) << t;
  }
}

// Prints the time per call over a Gemma-sized vocabulary. A measurement, not
// a test (timings do not belong in unit tests): run it with
// --gtest_also_run_disabled_tests --gtest_filter='*SamplerPerf*'.
TEST(SamplerPerf, DISABLED_LargeVocabularyTiming) {
  const int32_t vocab = 262144;
  struct Case {
    const char* name;
    float stddev;  // 1: flat logits, the costly case for top-p; 4: peaked, like a trained model
    float temperature;
    int32_t top_k;
    float top_p;
    int32_t logprobs;
  };
  const Case cases[] = {
      {"greedy", 4.0f, 0.0f, 0, 1.0f, -1},
      {"T=1", 4.0f, 1.0f, 0, 1.0f, -1},
      {"top_p=0.9 peaked", 4.0f, 0.8f, 0, 0.9f, -1},
      {"top_p=0.9 flat", 1.0f, 0.8f, 0, 0.9f, -1},
      {"top_k=50 top_p=0.9", 4.0f, 0.8f, 50, 0.9f, -1},
      {"top_p=0.9 logprobs=5", 4.0f, 0.8f, 0, 0.9f, 5},
  };
  Sampler sampler;
  SamplerRng rng(1);
  double worst_ms = 0.0;
  for (const Case& c : cases) {
    std::vector<float> logits = random_logits(vocab, 77, c.stddev);
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.logprobs = c.logprobs;
    p.repetition_penalty = 1.1f;
    const std::vector<int32_t> prompt(2000, 17), output = {1, 2, 3};
    sampler.sample(logits.data(), vocab, p, prompt, output, {}, rng);  // warm the buffers
    // The machine is shared: the median and the best of 21 calls say more than the mean.
    std::vector<double> times;
    for (int i = 0; i < 21; ++i) {
      const auto start = std::chrono::steady_clock::now();
      sampler.sample(logits.data(), vocab, p, prompt, output, {}, rng);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    const double ms = times[times.size() / 2];
    std::printf("[ sampler ] vocab %d, %-22s median %.3f ms, best %.3f ms\n", vocab, c.name, ms, times[0]);
    worst_ms = std::max(worst_ms, ms);
  }
  std::printf("[ sampler ] worst median %.3f ms\n", worst_ms);
}

// A grammar's bitmask: greedy picks the best allowed token, random sampling
// (with penalties, bias and every filter) never draws an excluded one, and
// the row comes back unchanged.
TEST(Sampler, AllowedBitmaskRestrictsEveryMode) {
  std::mt19937 gen(42);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int32_t vocab = 1000;  // not a multiple of 32: the last word is partial
  Sampler sampler;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(gen);
    std::vector<int32_t> mask((vocab + 31) / 32, 0);
    std::vector<int32_t> allowed_ids;
    const int density = 1 + trial % 7;  // from nearly everything to almost nothing allowed
    for (int32_t id = 0; id < vocab; ++id)
      if (static_cast<int>(gen() % 8) < density || (trial % 5 == 0 && id == vocab - 1)) {
        mask[id / 32] |= static_cast<int32_t>(1u << (id % 32));
        allowed_ids.push_back(id);
      }
    if (allowed_ids.empty()) continue;
    const std::vector<float> before = logits;
    SamplingParams p;
    p.temperature = trial % 2 ? 0.0f : 0.8f;
    p.top_k = trial % 3 ? 0 : 40;
    p.top_p = trial % 4 ? 1.0f : 0.9f;
    p.min_p = trial % 6 ? 0.0f : 0.05f;
    p.repetition_penalty = 1.3f;
    p.logit_bias = {{static_cast<int32_t>(gen() % vocab), 50.0f}};  // a bias cannot re-enable a token
    const std::vector<int32_t> history = {1, 2, 3, static_cast<int32_t>(allowed_ids[0])};
    SamplerRng rng(static_cast<uint64_t>(trial));
    const SampleResult r = sampler.sample(logits.data(), vocab, p, history, history, {}, rng, mask.data());
    EXPECT_TRUE(std::binary_search(allowed_ids.begin(), allowed_ids.end(), r.token)) << "trial " << trial;
    EXPECT_EQ(logits, before) << "trial " << trial;
    if (p.temperature == 0.0f) {
      // The reference: the same processing without a mask, then the best allowed id.
      std::vector<float> processed = before;
      sampler.process_logits(processed.data(), vocab, p, history, history, {});
      int32_t best = allowed_ids[0];
      for (int32_t id : allowed_ids)
        if (processed[id] > processed[best]) best = id;
      sampler.restore_logits(processed.data());
      EXPECT_EQ(r.token, best) << "trial " << trial;
    }
    // Without restoring the masked tokens: the same token; allowed ids restored.
    SamplerRng rng2(static_cast<uint64_t>(trial));
    const SampleResult r2 =
        sampler.sample(logits.data(), vocab, p, history, history, {}, rng2, mask.data(), /*restore_masked=*/false);
    EXPECT_EQ(r2.token, r.token) << "trial " << trial;
    for (int32_t id = 0; id < vocab; ++id) {
      const bool ok = std::binary_search(allowed_ids.begin(), allowed_ids.end(), id);
      if (ok) {
        EXPECT_EQ(logits[id], before[id]) << id;
      } else {
        EXPECT_TRUE(logits[id] == before[id] || (std::isinf(logits[id]) && logits[id] < 0)) << id;
      }
    }
  }
}

}  // namespace
}  // namespace pagellm
