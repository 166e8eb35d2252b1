// The engine as a whole: many requests share one model and one KV pool; every
// step runs one forward pass over all scheduled tokens. These tests use tiny
// models (a random-weight llama in memory, and the trained stories260K) so
// they run in seconds.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include "backend/registry.h"

#include <map>
#include <set>
#include <random>

#include "core/error.h"
#include "kv/kv_sizing.h"
#include "engine_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using test::make_request;
using test::Result;
using test::Results;
using test::run_all;

void expect_no_leaks(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv.used_blocks, 0);
  EXPECT_EQ(s.kv.used_blocks + s.kv.cached_blocks + s.kv.free_blocks, s.kv.total_blocks);
  EXPECT_EQ(s.metrics.num_requests_running, 0);
  EXPECT_EQ(s.metrics.num_requests_waiting, 0);
  engine.check_invariants();
}

EngineConfig tiny_config(int64_t kv_tokens = 0) {
  EngineConfig c;
  c.load_format = "dummy";
  c.dummy_shape = "tiny-llama";
  c.dummy_type = DType::F32;
  c.backend_options["threads"] = "2";
  c.block_size = 16;
  c.scheduler.max_model_len = 512;
  c.scheduler.max_num_batched_tokens = 256;
  c.kv_cache_dtype = DType::F32;
  if (kv_tokens > 0) {
    // tiny-llama: 2 layers, 2 KV heads of 64, F32.
    c.kv_cache_memory = kv_bytes_per_block(KVCacheLayout{2, 2, 64, 16, 4}) * (kv_tokens / 16 + 1);
  }
  return c;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = d(rng);
  return p;
}

// 64 greedy requests of mixed lengths, all at once, with chunked prefill and
// a KV pool far too small for all of them (forcing preemption): each output
// is token for token the output of the same request run alone.
void check_batch_invariance(EngineConfig config, int vocab, bool text_prompts) {
  std::mt19937 rng(11);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 64; ++i) {
    const int len = 1 + static_cast<int>(rng() % 120);
    const int out = 4 + static_cast<int>(rng() % 40);
    auto prompt = random_prompt(rng, len, vocab);
    if (text_prompts) prompt.insert(prompt.begin(), 1);  // BOS
    reqs.push_back(make_request("r" + std::to_string(i), prompt, out));
  }
  Engine together(config);
  for (const auto& r : reqs) together.add_request(r);
  int64_t peak = 0;
  const Results batched = run_all(together, &peak);
  expect_no_leaks(together);
  EXPECT_GT(together.metrics().num_preemptions, 0) << "the KV budget should force preemption";
  EXPECT_GT(peak, 1);

  Engine alone(config);
  for (const auto& r : reqs) {
    alone.add_request(r);
    const Results single = run_all(alone);
    ASSERT_EQ(batched.at(r.id)[0].tokens, single.at(r.id)[0].tokens) << r.id;
    EXPECT_EQ(batched.at(r.id)[0].reason, FinishReason::Length);
  }
  expect_no_leaks(alone);
}

TEST(Engine, BatchInvarianceWithPreemptionRandomModel) {
  // Room for ~6 of the requests at once.
  check_batch_invariance(tiny_config(6 * 176), 512, false);
}

// Routing depends on each token alone, and the expert-grouped products give
// each token the bits it gets alone, whatever else the step routes: the same
// check on a Mixture-of-Experts model (Qwen3-MoE shape, 3 of 8 experts, Q4_K).
TEST(Engine, BatchInvarianceWithPreemptionMoeModel) {
  EngineConfig c = tiny_config();
  c.dummy_shape = "tiny-qwen3moe";
  c.dummy_type = DType::Q4_K;
  // tiny-qwen3moe: 2 layers, 2 KV heads of 64, F32 cache.
  c.kv_cache_memory = kv_bytes_per_block(KVCacheLayout{2, 2, 64, 16, 4}) * (6 * 176 / 16 + 1);
  check_batch_invariance(c, 512, false);
}

TEST(Engine, BatchInvarianceWithPreemptionStories260K) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  EngineConfig c = tiny_config();
  c.load_format = "auto";
  c.model = path;
  c.kv_cache_dtype = DType::F16;
  // stories260K: 5 layers, 4 KV heads of 8.
  c.kv_cache_memory = kv_bytes_per_block(KVCacheLayout{5, 4, 8, 16, 2}) * 60;
  check_batch_invariance(c, 512, true);
}

// Two virtual engines (as under pipeline parallelism over 2 stages): each
// scheduler runs its half of the requests in its half of the KV blocks, one
// step of each in flight; outputs are still those of each request alone.
TEST(Engine, BatchInvarianceWithTwoVirtualEngines) {
  EngineConfig c = tiny_config(8 * 176);
  c.virtual_engines = 2;
  check_batch_invariance(c, 512, false);
}

// A request aborted while its virtual engine's step is in flight stays in
// that scheduler until the step is back, then leaves; nothing leaks and the
// other requests are untouched.
TEST(Engine, AbortWhileItsStepIsInFlight) {
  std::mt19937 rng(3);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(make_request("r" + std::to_string(i), random_prompt(rng, 20 + i, 512), 12));
  EngineConfig c = tiny_config();
  c.virtual_engines = 2;
  Engine e(c);
  ASSERT_EQ(e.num_virtual_engines(), 2);
  for (const auto& r : reqs) e.add_request(r);  // r0, r2 -> scheduler 0; r1, r3 -> scheduler 1
  std::map<std::string, std::vector<int32_t>> tokens;
  auto keep = [&](const std::vector<RequestOutput>& outs) {
    for (const RequestOutput& o : outs)
      for (const CompletionDelta& d : o.completions) tokens[o.request_id].insert(tokens[o.request_id].end(),
                                                                                  d.token_ids.begin(), d.token_ids.end());
  };
  keep(e.step());  // submits both schedulers' steps, samples scheduler 0's: scheduler 1's is in flight
  ASSERT_TRUE(e.abort("r0"));  // now
  ASSERT_TRUE(e.abort("r1"));  // when its step is back
  EXPECT_EQ(e.stats().metrics.num_requests_running, 3);
  keep(e.step());
  EXPECT_EQ(e.stats().metrics.num_requests_running, 2);
  for (const auto& [id, samples] : run_all(e)) tokens[id].insert(tokens[id].end(), samples[0].tokens.begin(),
                                                                  samples[0].tokens.end());
  expect_no_leaks(e);
  EXPECT_EQ(tokens.count("r1"), 0u);  // its first step's token was never sampled
  Engine alone(tiny_config());
  for (int i : {2, 3}) {
    alone.add_request(reqs[i]);
    EXPECT_EQ(run_all(alone).at(reqs[i].id)[0].tokens, tokens.at(reqs[i].id)) << reqs[i].id;
  }
  c.virtual_engines = 65;
  EXPECT_THROW(Engine{c}, Error);
}

TEST(Engine, PrefixCachingComputesFewerTokensAndSameOutputs) {
  std::mt19937 rng(5);
  const auto shared = random_prompt(rng, 96, 512);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    auto p = shared;
    const auto tail = random_prompt(rng, 5 + i, 512);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(make_request("p" + std::to_string(i), p, 8));
  }
  auto run = [&](bool caching) {
    EngineConfig c = tiny_config();
    c.enable_prefix_caching = caching;
    Engine e(c);
    // The first request fills the cache; the others arrive after it.
    e.add_request(reqs[0]);
    Results all = run_all(e);
    for (size_t i = 1; i < reqs.size(); ++i) e.add_request(reqs[i]);
    Results rest = run_all(e);
    all.insert(rest.begin(), rest.end());
    expect_no_leaks(e);
    return std::make_pair(all, e.metrics());
  };
  const auto [with, m_with] = run(true);
  const auto [without, m_without] = run(false);
  for (const auto& r : reqs) EXPECT_EQ(with.at(r.id)[0].tokens, without.at(r.id)[0].tokens) << r.id;
  // 7 later requests each find the 96-token shared prefix (6 full blocks).
  EXPECT_EQ(m_with.prefix_cache_hits, 7 * 96);
  EXPECT_EQ(m_without.prefix_cache_hits, 0);
  EXPECT_LT(m_with.iteration_tokens.sum(), m_without.iteration_tokens.sum() - 7 * 90);
}

TEST(Engine, ParallelSamplingSharesPromptBlocks) {
  Engine e(tiny_config());
  std::mt19937 rng(2);
  EngineRequest r = make_request("n4", random_prompt(rng, 40, 512), 12);
  r.params.n = 4;
  r.params.temperature = 1.0f;
  r.params.seed = 7;
  e.add_request(r);
  int64_t max_used = 0;
  Results res;
  while (e.has_unfinished()) {
    for (RequestOutput& out : e.step()) {
      auto& s = res[out.request_id];
      for (const auto& d : out.completions) {
        if (s.size() <= static_cast<size_t>(d.index)) s.resize(d.index + 1);
        s[d.index].tokens.insert(s[d.index].tokens.end(), d.token_ids.begin(), d.token_ids.end());
      }
    }
    max_used = std::max<int64_t>(max_used, e.stats().kv.used_blocks);
  }
  ASSERT_EQ(res["n4"].size(), 4u);
  for (const auto& s : res["n4"]) EXPECT_EQ(s.tokens.size(), 12u);
  // The 2 full prompt blocks are shared; each sample holds its own tail
  // (copy-on-write of the partial block): 2 + 4 * 2 = 10 < 4 * 4.
  EXPECT_LE(max_used, 10);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& s : res["n4"]) distinct.insert(s.tokens);
  EXPECT_GT(distinct.size(), 1u) << "different samples";
  // Same seed, same samples.
  Engine again(tiny_config());
  r.id = "again";
  again.add_request(r);
  const Results res2 = run_all(again);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(res2.at("again")[i].tokens, res["n4"][i].tokens);
  expect_no_leaks(e);
}

// n = 12 with 4 seats: the samples beyond the free seats wait (and recompute
// from the prefix cache), a one-sample request arriving meanwhile is answered
// within a few steps (fairness), and every seeded sample is the one it is
// with a seat for each.
TEST(Engine, ParallelSamplingRespectsMaxNumSeqs) {
  std::mt19937 rng(3);
  EngineRequest big = make_request("big", random_prompt(rng, 40, 512), 24);
  big.params.n = 12;
  big.params.temperature = 1.0f;
  big.params.seed = 9;
  const EngineRequest small = make_request("small", random_prompt(rng, 10, 512), 3);
  struct Run {
    Results results;
    int64_t peak_running = 0, fair_preemptions = 0;
    int small_done = -1, big_done = -1;  // steps after the small request came
  };
  auto run = [&](int32_t seats) {
    EngineConfig c = tiny_config();
    c.scheduler.max_num_seqs = seats;
    Engine e(c);
    e.add_request(big);
    Run r;
    // Steps 1 and 2: the prompt (the samples fork after it), a decode; then the small request comes.
    for (int step = -1; e.has_unfinished(); ++step) {
      if (step == 1) e.add_request(small);
      for (RequestOutput& out : e.step()) {
        auto& samples = r.results[out.request_id];
        for (const CompletionDelta& d : out.completions) {
          if (samples.size() <= static_cast<size_t>(d.index)) samples.resize(d.index + 1);
          samples[d.index].tokens.insert(samples[d.index].tokens.end(), d.token_ids.begin(), d.token_ids.end());
        }
        if (out.finished) (out.request_id == "small" ? r.small_done : r.big_done) = step;
      }
      e.check_invariants();
      r.peak_running = std::max(r.peak_running, e.metrics().num_requests_running);
    }
    r.fair_preemptions = e.metrics().num_preemptions_fair;
    expect_no_leaks(e);
    return r;
  };
  const Run tight = run(4), roomy = run(256);
  EXPECT_LE(tight.peak_running, 4);
  EXPECT_GE(roomy.peak_running, 12);
  EXPECT_GT(tight.fair_preemptions, 0);
  EXPECT_LE(tight.small_done, 4);  // prompt + 2 decodes, and a step to get its seat
  EXPECT_GT(tight.big_done, tight.small_done + 10);
  ASSERT_EQ(tight.results.at("big").size(), 12u);
  for (size_t k = 0; k < 12; ++k) {
    EXPECT_EQ(tight.results.at("big")[k].tokens.size(), 24u) << k;
    EXPECT_EQ(tight.results.at("big")[k].tokens, roomy.results.at("big")[k].tokens) << "sample " << k;
  }
  EXPECT_EQ(tight.results.at("small")[0].tokens, roomy.results.at("small")[0].tokens);
}

// An idle engine frees the buffers its largest step grew; the next steps
// build them again and compute the same tokens.
TEST(Engine, ReleasedStepBuffersAreBuiltAgain) {
  std::mt19937 rng(5);
  const auto prompt = random_prompt(rng, 30, 512);
  Engine e(tiny_config());
  EngineRequest wide = make_request("wide", prompt, 6);
  wide.params.n = 8;
  e.add_request(wide);
  const Results first = run_all(e);
  e.release_step_buffers();
  e.add_request(make_request("again", prompt, 6));
  const Results again = run_all(e);
  EXPECT_EQ(again.at("again")[0].tokens, first.at("wide")[0].tokens);
  // With work in progress it frees nothing.
  e.add_request(make_request("busy", prompt, 6));
  std::vector<int32_t> busy;
  for (const RequestOutput& out : e.step())
    for (const CompletionDelta& d : out.completions) busy.insert(busy.end(), d.token_ids.begin(), d.token_ids.end());
  e.release_step_buffers();
  const auto rest = run_all(e).at("busy")[0].tokens;
  busy.insert(busy.end(), rest.begin(), rest.end());
  EXPECT_EQ(busy, first.at("wide")[0].tokens);
  expect_no_leaks(e);
}

// Plain samples (greedy, or temperature / top-k / top-p / min-p with a seed)
// are drawn by the backend's sample op, so only ids leave it; a logits
// observer needs the rows on the host, so it turns that off. Both ways give
// the same tokens, and a batch mixing plain and penalised requests (which
// needs host rows) goes to the host whole.
TEST(Engine, DeviceSamplingDrawsTheHostSamplersTokens) {
  std::mt19937 rng(9);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = make_request("s" + std::to_string(i), random_prompt(rng, 10 + 7 * i, 512), 12);
    if (i % 2 == 1) {
      r.params.temperature = 0.8f;
      r.params.top_k = i == 1 ? 0 : 40;
      r.params.top_p = i == 3 ? 0.9f : 1.0f;
      r.params.min_p = i == 5 ? 0.02f : 0.0f;
      r.params.seed = 100 + i;
    }
    reqs.push_back(std::move(r));
  }
  auto run = [&](bool observe, bool with_penalty) {
    EngineConfig c = tiny_config();
    if (observe) c.logits_observer = [](const std::string&, int32_t, int32_t, std::span<const float>) {};
    Engine e(c);
    for (const EngineRequest& r : reqs) e.add_request(r);
    if (with_penalty) {
      EngineRequest p = make_request("penalised", random_prompt(rng, 9, 512), 3);
      p.params.repetition_penalty = 1.3f;
      e.add_request(p);
    }
    Results out = run_all(e);
    out.erase("penalised");
    return std::make_pair(out, e.metrics().tokens_sampled_on_device);
  };
  const auto [device, on_device] = run(false, false);
  const auto [host, on_host] = run(true, false);
  const auto [mixed, mixed_on_device] = run(false, true);
  EXPECT_EQ(on_device, 6 * 12);
  EXPECT_EQ(on_host, 0);
  EXPECT_LT(mixed_on_device, on_device);  // the steps shared with the penalised request went to the host
  for (const auto& [id, samples] : host) {
    EXPECT_EQ(device.at(id)[0].tokens, samples[0].tokens) << id;
    EXPECT_EQ(mixed.at(id)[0].tokens, samples[0].tokens) << id;
  }
}

TEST(Engine, StopConditions) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  EngineConfig c = tiny_config();
  c.load_format = "auto";
  c.model = path;
  Engine e(c);
  const auto prompt = e.tokenizer().encode("Once upon a time", true, false);
  // Greedy continuation: ", there was a little girl named Lily. She loved to play outside..."
  auto base = make_request("base", prompt, 40);
  base.params.ignore_eos = false;
  auto stop = base;
  stop.id = "stop";
  stop.params.stop = {"Lily"};
  auto stop_incl = stop;
  stop_incl.id = "stop_incl";
  stop_incl.params.include_stop_str_in_output = true;
  auto len = base;
  len.id = "len";
  len.params.max_tokens = 5;
  auto stop_tok = base;
  stop_tok.id = "stop_tok";
  const int32_t lily = e.tokenizer().encode(" Lily", false, false).front();
  stop_tok.params.stop_token_ids = {lily};
  for (const auto& r : {base, stop, stop_incl, len, stop_tok}) e.add_request(r);
  const Results res = run_all(e);
  const std::string full = res.at("base")[0].text;
  ASSERT_NE(full.find("Lily"), std::string::npos) << full;
  EXPECT_EQ(res.at("stop")[0].text, full.substr(0, full.find("Lily")));
  EXPECT_EQ(res.at("stop")[0].reason, FinishReason::Stop);
  EXPECT_EQ(res.at("stop")[0].stop_string, "Lily");
  EXPECT_EQ(res.at("stop_incl")[0].text, full.substr(0, full.find("Lily") + 4));
  EXPECT_EQ(res.at("len")[0].tokens.size(), 5u);
  EXPECT_EQ(res.at("len")[0].reason, FinishReason::Length);
  EXPECT_EQ(res.at("stop_tok")[0].tokens.back(), lily);
  EXPECT_EQ(res.at("stop_tok")[0].reason, FinishReason::Stop);
  expect_no_leaks(e);
}

TEST(Engine, MinTokensAndEos) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  EngineConfig c = tiny_config();
  c.load_format = "auto";
  c.model = path;
  Engine e(c);
  const auto prompt = e.tokenizer().encode("Once upon a time", true, false);
  const int32_t eos = e.tokenizer().eos_id();
  // EOS made overwhelmingly likely: it ends the sequence at once, unless
  // ignore_eos, and min_tokens holds it off.
  auto r = make_request("eos", prompt, 30);
  r.params.ignore_eos = false;
  r.params.logit_bias = {{eos, 100.0f}};
  auto ignore = r;
  ignore.id = "ignore";
  ignore.params.ignore_eos = true;
  auto min = r;
  min.id = "min";
  min.params.min_tokens = 7;
  // A stop token that greedy decoding meets early ('.'), held off by min_tokens.
  const int32_t dot = e.tokenizer().encode(".", false, false).back();
  auto stop = make_request("stop", prompt, 200);
  stop.params.stop_token_ids = {dot};
  auto stop_min = stop;
  stop_min.id = "stop_min";
  for (const auto& q : {r, ignore, min, stop}) e.add_request(q);
  Results res = run_all(e);
  EXPECT_EQ(res.at("eos")[0].tokens, std::vector<int32_t>{eos});
  EXPECT_EQ(res.at("eos")[0].reason, FinishReason::Stop);
  EXPECT_EQ(res.at("ignore")[0].tokens.size(), 30u);
  EXPECT_EQ(res.at("ignore")[0].reason, FinishReason::Length);
  EXPECT_EQ(res.at("min")[0].tokens.size(), 8u);  // 7 forced non-EOS tokens, then EOS
  EXPECT_EQ(res.at("min")[0].tokens.back(), eos);
  const size_t natural = res.at("stop")[0].tokens.size();
  ASSERT_EQ(res.at("stop")[0].tokens.back(), dot);
  stop_min.params.min_tokens = static_cast<int32_t>(natural) + 5;
  e.add_request(stop_min);
  res = run_all(e);
  EXPECT_GE(res.at("stop_min")[0].tokens.size(), natural + 6);
  EXPECT_EQ(res.at("stop_min")[0].tokens.back(), dot);
  expect_no_leaks(e);
}

TEST(Engine, AbortFreesBlocksImmediately) {
  Engine e(tiny_config());
  std::mt19937 rng(3);
  e.add_request(make_request("a", random_prompt(rng, 100, 512), 50));
  e.add_request(make_request("b", random_prompt(rng, 100, 512), 50));
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_GT(e.stats().kv.used_blocks, 0);
  auto out = e.abort("a");
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->finished);
  EXPECT_EQ(out->completions.at(0).finish_reason, FinishReason::Abort);
  EXPECT_FALSE(e.abort("a").has_value());
  EXPECT_FALSE(e.abort("unknown").has_value());
  e.abort("b");
  EXPECT_EQ(e.stats().kv.used_blocks, 0);
  EXPECT_FALSE(e.has_unfinished());
  expect_no_leaks(e);
}

TEST(Engine, PriorityOrdersAdmission) {
  EngineConfig c = tiny_config();
  c.scheduler.policy = SchedulingPolicy::Priority;
  c.scheduler.max_num_seqs = 1;
  Engine e(c);
  std::mt19937 rng(4);
  std::vector<std::string> finished;
  for (int p : {5, 1, 3}) {
    auto r = make_request("prio" + std::to_string(p), random_prompt(rng, 10, 512), 3);
    r.priority = p;
    e.add_request(r);
  }
  while (e.has_unfinished())
    for (auto& out : e.step())
      if (out.finished) finished.push_back(out.request_id);
  EXPECT_EQ(finished, (std::vector<std::string>{"prio1", "prio3", "prio5"}));
}

TEST(Engine, RejectsBadRequestsWithoutSideEffects) {
  Engine e(tiny_config());
  EXPECT_THROW(e.add_request(make_request("empty", {}, 4)), InvalidRequest);
  EXPECT_THROW(e.add_request(make_request("oov", {1, 99999}, 4)), InvalidRequest);
  EXPECT_THROW(e.add_request(make_request("long", std::vector<int32_t>(510, 5), 4)), InvalidRequest);
  auto bad = make_request("temp", {1, 2, 3}, 4);
  bad.params.temperature = -1;
  EXPECT_THROW(e.add_request(bad), InvalidRequest);
  e.add_request(make_request("ok", {1, 2, 3}, 4));
  EXPECT_THROW(e.add_request(make_request("ok", {1, 2, 3}, 4)), InvalidRequest);  // duplicate id
  run_all(e);
  expect_no_leaks(e);
}

// Memory efficiency: with a fixed KV budget, the paged pool runs several times
// more sequences of a mixed-length workload at once than reserving
// max_model_len per sequence (what a slot-based server does).
TEST(Engine, PagedPoolHoldsManyMoreSequencesThanSlots) {
  const int max_len = 512;
  const int64_t budget_tokens = 4 * max_len;  // a slot-based server runs 4 at once
  EngineConfig c = tiny_config(budget_tokens);
  c.scheduler.max_num_batched_tokens = 512;
  Engine e(c);
  std::mt19937 rng(9);
  for (int i = 0; i < 48; ++i) {
    const int len = 16 + static_cast<int>(rng() % 96);
    e.add_request(make_request("m" + std::to_string(i), random_prompt(rng, len, 512), 16 + static_cast<int>(rng() % 32)));
  }
  int64_t peak = 0;
  run_all(e, &peak);
  const int64_t slots = budget_tokens / max_len;
  std::printf("[ kv ] budget %lld tokens: paged pool ran up to %lld sequences at once, slots: %lld (%.1fx)\n",
              static_cast<long long>(budget_tokens), static_cast<long long>(peak), static_cast<long long>(slots),
              static_cast<double>(peak) / static_cast<double>(slots));
  EXPECT_GE(peak, 3 * slots);
  expect_no_leaks(e);
}

// ---------------------------------------------------------------- devices, swap

// The backend of `device` when this build and machine have it, else null.
bool device_available(const std::string& device) {
  try {
    return create_backend(device) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

TEST(EngineSwap, CpuRefusesSwapPreemptionClearly) {
  EngineConfig c = tiny_config(6 * 176);
  c.scheduler.preemption_mode = PreemptionMode::Swap;
  try {
    Engine e(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--preemption-mode swap needs a backend"), std::string::npos) << e.what();
  }
}

// Under heavy preemption, swap and recompute give the same greedy outputs;
// a host pool too small for every victim falls back to recompute; the
// metrics count both modes and the bytes moved.
void check_swap_equals_recompute(const std::string& device) {
  if (!device_available(device)) GTEST_SKIP() << device << " is not in this build or has no device here";
  std::mt19937 rng(5);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 24; ++i)
    reqs.push_back(make_request("r" + std::to_string(i), random_prompt(rng, 1 + static_cast<int>(rng() % 100), 512),
                                8 + static_cast<int>(rng() % 30)));
  EngineConfig base = tiny_config(5 * 176);
  base.device = device;
  base.backend_options.clear();
  auto run = [&](PreemptionMode mode, int64_t swap_bytes, EngineMetrics* m) {
    EngineConfig c = base;
    c.scheduler.preemption_mode = mode;
    c.swap_space_bytes = swap_bytes;
    Engine e(c);
    for (const auto& r : reqs) e.add_request(r);
    Results res = run_all(e);
    expect_no_leaks(e);
    *m = e.metrics();
    return res;
  };
  const int64_t block = kv_bytes_per_block(KVCacheLayout{2, 2, 64, 16, 4});
  EngineMetrics mr, ms, mt;
  const Results recompute = run(PreemptionMode::Recompute, 0, &mr);
  const Results swapped = run(PreemptionMode::Swap, 4096 * block, &ms);
  const Results tight = run(PreemptionMode::Swap, 3 * block, &mt);
  for (const auto& r : reqs) {
    EXPECT_EQ(swapped.at(r.id)[0].tokens, recompute.at(r.id)[0].tokens) << r.id;
    EXPECT_EQ(tight.at(r.id)[0].tokens, recompute.at(r.id)[0].tokens) << r.id;
  }
  EXPECT_GT(mr.num_preemptions, 0);
  EXPECT_EQ(mr.num_preemptions_swap, 0);
  EXPECT_GT(ms.num_preemptions_swap, 0);
  EXPECT_GT(ms.swapped_out_bytes, 0);
  EXPECT_EQ(ms.swapped_out_bytes % block, 0);
  EXPECT_EQ(ms.swapped_out_bytes, ms.swapped_in_bytes);  // nothing is left in the pool at the end
  EXPECT_GT(mt.num_preemptions_recompute, 0) << "a 3-block pool must overflow";
  EXPECT_EQ(mt.num_preemptions, mt.num_preemptions_swap + mt.num_preemptions_recompute);
}

TEST(EngineSwap, SwapEqualsRecomputeOnOpenCl) { check_swap_equals_recompute("opencl"); }

// The 64-request batch-invariance check of the CPU, on the OpenCL backend.
TEST(EngineDevices, BatchInvarianceWithPreemptionOnOpenCl) {
  if (!device_available("opencl")) GTEST_SKIP() << "opencl is not in this build or has no device here";
  EngineConfig c = tiny_config(6 * 176);
  c.device = "opencl";
  c.backend_options.clear();
  check_batch_invariance(c, 512, false);
}

// --kv-eviction sliding: requests run far past max_model_len, each holding
// at most max_model_len tokens of KV; up to that length they match a run
// without eviction token for token.
TEST(EngineKvEviction, SlidingWindowGoesPastMaxModelLenInBoundedMemory) {
  EngineConfig plain = test::tiny_engine_config(128);
  plain.block_size = 16;
  EngineConfig sliding = plain;
  sliding.scheduler.kv_eviction = KvEviction::Sliding;
  sliding.scheduler.attention_sinks = 4;
  sliding.scheduler.max_num_batched_tokens = 96;
  Engine engine(sliding);
  for (int i = 0; i < 3; ++i)
    engine.add_request(test::make_request("r" + std::to_string(i), {static_cast<int32_t>(5 + i), 6, 7, 8, 9, 10}, 400));
  int64_t peak_used = 0;
  test::Results out;
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      ASSERT_TRUE(o.error.empty()) << o.error;
      for (const CompletionDelta& d : o.completions) {
        auto& r = out[o.request_id];
        if (r.empty()) r.resize(1);
        r[0].tokens.insert(r[0].tokens.end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finish_reason != FinishReason::None) r[0].reason = d.finish_reason;
      }
    }
    engine.check_invariants();
    peak_used = std::max<int64_t>(peak_used, engine.stats().kv.used_blocks);
  }
  // 128 / 16 = 8 blocks per sequence (one more while a chunk crosses a block).
  EXPECT_LE(peak_used, 3 * 9);
  Engine reference(plain);
  for (int i = 0; i < 3; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_EQ(out[id][0].tokens.size(), 400u) << id;
    EXPECT_EQ(out[id][0].reason, FinishReason::Length);
    reference.add_request(test::make_request(id, {static_cast<int32_t>(5 + i), 6, 7, 8, 9, 10}, 128 - 6));
  }
  const test::Results ref = test::run_all(reference);
  for (const auto& [id, samples] : ref)
    EXPECT_TRUE(std::equal(samples[0].tokens.begin(), samples[0].tokens.end(), out[id][0].tokens.begin())) << id;
}

}  // namespace
}  // namespace pagellm
