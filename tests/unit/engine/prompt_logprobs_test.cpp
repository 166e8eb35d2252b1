// Prompt logprobs: token_logprob against a scalar double-precision reference
// on random rows, and the engine's prompt logprobs against a whole-prompt
// forward pass of the same weights (chunked prefill, a prefix-cache hit that
// must not be taken, batches), and against compute_perplexity.
#include "engine/prompt_logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/dummy.h"
#include "model/model_test_util.h"
#include "runner/perplexity.h"

namespace pagellm {
namespace {

// log softmax(row)[i] for every i, in double.
std::vector<double> log_softmax_ref(const float* row, int32_t vocab) {
  double max = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < vocab; ++i) max = std::max(max, static_cast<double>(row[i]));
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) out[i] = row[i] - max - std::log(sum);
  return out;
}

// The k best ids (value descending, lower id first on ties) and the rank of `token`.
std::vector<int32_t> top_ids_ref(const std::vector<double>& lp, int32_t k) {
  std::vector<int32_t> ids(lp.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

int32_t rank_ref(const std::vector<double>& lp, int32_t token) {
  int32_t rank = 0;
  for (double v : lp) rank += v >= lp[token] ? 1 : 0;
  return rank;
}

TEST(TokenLogprob, MatchesDoubleReferenceOnRandomRows) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (int32_t vocab : {7, 512, 5000}) {
    std::vector<float> row(static_cast<size_t>(vocab));
    for (auto& x : row) x = d(rng);
    const auto ref = log_softmax_ref(row.data(), vocab);
    for (int32_t token : {0, vocab / 3, vocab - 1}) {
      for (int32_t k : {0, 1, 5}) {
        const TokenLogprob lp = token_logprob(row.data(), vocab, token, k);
        EXPECT_EQ(lp.token, token);
        EXPECT_NEAR(lp.logprob, ref[token], 1e-5 * std::max(1.0, std::fabs(ref[token])));
        EXPECT_EQ(lp.rank, rank_ref(ref, token));
        const auto ids = top_ids_ref(ref, std::min(k, vocab));
        ASSERT_EQ(lp.top.size(), ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
          EXPECT_EQ(lp.top[i].first, ids[i]);
          EXPECT_NEAR(lp.top[i].second, ref[ids[i]], 1e-5 * std::max(1.0, std::fabs(ref[ids[i]])));
        }
        // The most likely token's logprob is the top entry's, bit for bit
        // (lm-evaluation-harness compares them to call a continuation greedy).
        if (lp.rank == 1 && k > 0) EXPECT_EQ(lp.logprob, lp.top[0].second);
      }
    }
  }
}

TEST(TokenLogprob, TiesNonFiniteAndBadIds) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, -inf, std::nanf("")};
  // Equal logits count as ahead: both 3.0 tokens have rank 2; -inf and NaN count as -inf.
  EXPECT_EQ(token_logprob(row.data(), 5, 1, 2).rank, 2);
  EXPECT_EQ(token_logprob(row.data(), 5, 0, 2).rank, 3);
  const TokenLogprob none = token_logprob(row.data(), 5, 4, 2);
  EXPECT_TRUE(std::isinf(none.logprob) && none.logprob < 0);
  EXPECT_EQ(none.rank, 5);
  const double expected = 1.0 - std::log(std::exp(1.0) + 2 * std::exp(3.0));
  EXPECT_NEAR(token_logprob(row.data(), 5, 0, 0).logprob, expected, 1e-6);
  EXPECT_THROW(token_logprob(row.data(), 5, 5, 1), Error);
  EXPECT_THROW(token_logprob(row.data(), 5, -1, 1), Error);
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(1, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// The engine's dummy weights (tiny-llama, F32, seed 0) in a model of its
// own: logits at every position in one pass, log-softmaxed in double.
std::vector<std::vector<double>> reference_logprobs(const std::vector<int32_t>& tokens, int32_t n_vocab) {
  auto backend = make_cpu_backend(1);
  ThreadPool pool(1);
  const ModelConfig cfg = dummy_config("tiny-llama", n_vocab);
  auto src = make_dummy_source(cfg, DummySpec{"tiny-llama", DType::F32, 0}, pool);
  auto model = Model::from_source(cfg, *src, *backend);
  test::PagedRunner runner(*model, 16, 16, DType::F16);
  const auto logits = runner.feed(tokens, static_cast<int>(tokens.size()), true);
  std::vector<std::vector<double>> out;
  for (size_t p = 0; p < tokens.size(); ++p) out.push_back(log_softmax_ref(logits.data() + p * n_vocab, n_vocab));
  return out;
}

EngineRequest logprob_request(const std::string& id, const std::vector<int32_t>& prompt, int32_t k) {
  EngineRequest r = test::make_request(id, prompt, 2);
  r.params.prompt_logprobs = k;
  return r;
}

struct Scored {
  std::vector<TokenLogprob> lps;
  int32_t num_cached = -1;
  int outputs_with_them = 0;
};

// Runs the engine to the end; each request's prompt logprobs.
std::map<std::string, Scored> run_scored(Engine& e) {
  std::map<std::string, Scored> out;
  while (e.has_unfinished()) {
    for (RequestOutput& o : e.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      Scored& s = out[o.request_id];
      s.num_cached = o.num_cached_tokens;
      if (!o.prompt_logprobs.empty()) {
        s.lps = o.prompt_logprobs;
        ++s.outputs_with_them;
      }
    }
    e.check_invariants();
  }
  return out;
}

EngineConfig chunked_config() {
  EngineConfig c = test::tiny_engine_config(256);
  c.scheduler.max_num_batched_tokens = 16;  // a 50-token prompt runs in 4 chunks
  return c;
}

TEST(EnginePromptLogprobs, MatchAWholePromptForwardPassAcrossChunks) {
  Engine e(chunked_config());
  const int32_t vocab = e.model_config().n_vocab;
  const auto prompt = random_tokens(50, vocab, 3);
  const auto ref = reference_logprobs(prompt, vocab);
  e.add_request(logprob_request("a", prompt, 3));
  const auto scored = run_scored(e);
  const Scored& s = scored.at("a");
  EXPECT_EQ(s.outputs_with_them, 1);
  ASSERT_EQ(s.lps.size(), prompt.size() - 1);
  double worst = 0;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const TokenLogprob& lp = s.lps[i];
    const auto& want = ref[i];  // position i scores token i + 1
    EXPECT_EQ(lp.token, prompt[i + 1]);
    worst = std::max(worst, std::fabs(lp.logprob - want[prompt[i + 1]]));
    EXPECT_EQ(lp.rank, rank_ref(want, prompt[i + 1])) << i;
    const auto ids = top_ids_ref(want, 3);
    ASSERT_EQ(lp.top.size(), 3u);
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(lp.top[j].first, ids[j]) << i;
  }
  EXPECT_LE(worst, 1e-4);
  std::printf("[ prompt logprobs ] chunked engine vs whole-prompt pass: max |gap| %.2e\n", worst);
}

TEST(EnginePromptLogprobs, NotTakenFromThePrefixCache) {
  Engine e(chunked_config());
  const auto prompt = random_tokens(50, e.model_config().n_vocab, 3);
  e.add_request(logprob_request("first", prompt, 1));
  const auto first = run_scored(e).at("first");
  // A plain request caches the prompt's full blocks and hits them ...
  e.add_request(test::make_request("plain", prompt, 1));
  EXPECT_EQ(run_scored(e).at("plain").num_cached, 48);
  // ... which one asking for prompt logprobs does not use.
  e.add_request(logprob_request("again", prompt, 1));
  const auto again = run_scored(e).at("again");
  EXPECT_EQ(again.num_cached, 0);
  ASSERT_EQ(again.lps.size(), first.lps.size());
  for (size_t i = 0; i < first.lps.size(); ++i) EXPECT_EQ(again.lps[i].logprob, first.lps[i].logprob) << i;
}

TEST(EnginePromptLogprobs, TheSameAloneAndInABatch) {
  EngineConfig c = test::tiny_engine_config(256);
  Engine e(c);
  const int32_t vocab = e.model_config().n_vocab;
  const auto prompt = random_tokens(40, vocab, 5);
  e.add_request(logprob_request("alone", prompt, 2));
  const auto alone = run_scored(e).at("alone");
  e.add_request(test::make_request("x", random_tokens(23, vocab, 6), 4));
  e.add_request(logprob_request("batched", prompt, 2));
  e.add_request(logprob_request("y", random_tokens(9, vocab, 7), 0));
  const auto batch = run_scored(e);
  const auto& batched = batch.at("batched");
  ASSERT_EQ(batched.lps.size(), alone.lps.size());
  double worst = 0;
  for (size_t i = 0; i < alone.lps.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(batched.lps[i].logprob - alone.lps[i].logprob)));
    EXPECT_EQ(batched.lps[i].top[0].first, alone.lps[i].top[0].first);
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("[ prompt logprobs ] alone vs batched: max |gap| %.2e\n", worst);
  EXPECT_EQ(batch.at("y").lps.size(), 8u);
  EXPECT_TRUE(batch.at("y").lps[0].top.empty());
}

TEST(EnginePromptLogprobs, SumIsPerplexitysLoss) {
  Engine e(test::tiny_engine_config(128));
  const auto prompt = random_tokens(100, e.model_config().n_vocab, 9);
  PerplexityOptions o;
  o.ctx = 128;
  o.stride = 128;  // one window: every token after the first scored with all before it
  const PerplexityResult ppl = compute_perplexity(e.model(), e.kv_config(), prompt, o);
  ASSERT_EQ(ppl.tokens_scored, 99);
  e.add_request(logprob_request("a", prompt, 0));
  const auto s = run_scored(e).at("a");
  double sum = 0;
  for (const TokenLogprob& lp : s.lps) sum += lp.logprob;
  EXPECT_NEAR(-sum, ppl.nll_sum, 1e-3);
}

TEST(EnginePromptLogprobs, OneTokenPromptAndBadK) {
  Engine e(test::tiny_engine_config(64));
  e.add_request(logprob_request("one", {5}, 1));
  const auto s = run_scored(e);
  EXPECT_TRUE(s.at("one").lps.empty());
  EngineRequest bad = logprob_request("bad", {5, 6}, 100000);
  EXPECT_THROW(e.add_request(bad), InvalidRequest);
}

}  // namespace
}  // namespace pagellm
