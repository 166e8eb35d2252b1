// Speculative decoding through the whole engine: greedy output is the same
// token for token with and without speculation (every test model, MLA and
// linear attention too; single requests and 64 mixed ones with preemption);
// n-gram proposals, being point
// masses, leave seeded sampled output unchanged too; a draft model's
// rejection sampling reproduces the target's distribution; a draft with
// another vocabulary is refused at start-up.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kv/kv_sizing.h"
#include "model/dummy.h"
#include "spec/adaptive.h"
#include "engine_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using test::make_request;
using test::Result;
using test::Results;

// run_all, and then every KV block is back in the pool.
Results run_all_freed(Engine& engine) {
  Results results = test::run_all(engine);
  EXPECT_EQ(engine.stats().kv.used_blocks, 0);
  return results;
}

SpeculativeConfig ngram_spec(int k = 4) {
  return parse_speculative_config(
      fmt::format(R"({{"method": "ngram", "num_speculative_tokens": {}, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                      "adaptive": false}})",
                  k));
}

SpeculativeConfig draft_spec(const std::string& path, int k = 3, bool adaptive = false) {
  return parse_speculative_config(fmt::format(R"({{"model": "{}", "num_speculative_tokens": {}, "adaptive": {}}})",
                                              path, k, adaptive ? "true" : "false"));
}

EngineConfig dummy_config(const std::string& shape, DType type = DType::F32) {
  EngineConfig c;
  c.load_format = "dummy";
  c.dummy_shape = shape;
  c.dummy_type = type;
  c.backend_options["threads"] = "2";
  c.scheduler.max_model_len = 512;
  c.scheduler.max_num_batched_tokens = 256;
  c.kv_cache_dtype = DType::F32;
  return c;
}

EngineConfig stories_config() {
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = test::shared_data("models/stories260K.gguf");
  c.kv_cache_dtype = DType::F16;
  return c;
}

// A random-weight GGUF written once per test process (the draft-model tests
// load models from files, as a user would).
std::string dummy_file(const std::string& shape, uint64_t seed, DType type = DType::F32) {
  const std::string path = fmt::format("{}/{}-{}-{}.gguf", test::temp_dir(), shape, seed, dtype_name(type));
  if (!std::filesystem::exists(path)) {
    ThreadPool pool(2);
    write_dummy_gguf(path, DummySpec{shape, type, seed}, nullptr, pool);
  }
  return path;
}

// Prompts that give n-gram lookup something to find: random tokens with a
// run repeated, as text that quotes itself.
std::vector<int32_t> repetitive_prompt(std::mt19937& rng, int len, int vocab, bool bos) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> run(static_cast<size_t>(4 + rng() % 8));
  for (auto& t : run) t = d(rng);
  std::vector<int32_t> p;
  if (bos) p.push_back(1);
  while (static_cast<int>(p.size()) < len) {
    if (rng() % 3 == 0) p.insert(p.end(), run.begin(), run.end());
    else p.push_back(d(rng));
  }
  return p;
}

// The same requests through an engine without speculation and one with:
// identical tokens, texts, finish reasons and logprobs.
EngineMetrics expect_same_outputs(EngineConfig config, const SpeculativeConfig& spec,
                                  const std::vector<EngineRequest>& reqs, bool one_at_a_time_plain,
                                  bool expect_accepted = true) {
  Results plain;
  {
    Engine e(config);
    if (one_at_a_time_plain) {
      for (const auto& r : reqs) {
        e.add_request(r);
        Results one = run_all_freed(e);
        plain.insert(one.begin(), one.end());
      }
    } else {
      for (const auto& r : reqs) e.add_request(r);
      plain = run_all_freed(e);
    }
  }
  config.speculative = spec;
  Engine e(config);
  for (const auto& r : reqs) e.add_request(r);
  const Results fast = run_all_freed(e);
  for (const auto& r : reqs) {
    EXPECT_EQ(fast.at(r.id).size(), plain.at(r.id).size()) << r.id;
    for (size_t i = 0; i < plain.at(r.id).size() && i < fast.at(r.id).size(); ++i) {
      const Result &a = plain.at(r.id)[i], &b = fast.at(r.id)[i];
      EXPECT_EQ(b.tokens, a.tokens) << r.id << " sample " << i;
      EXPECT_EQ(b.text, a.text) << r.id;
      EXPECT_EQ(b.reason, a.reason) << r.id;
      EXPECT_EQ(b.logprobs, a.logprobs) << r.id;
    }
  }
  const EngineMetrics& m = e.metrics();
  EXPECT_GT(m.spec_decode_num_drafts, 0);
  if (expect_accepted) {
    EXPECT_GT(m.spec_decode_num_accepted_tokens, 0);
  }
  EXPECT_LE(m.spec_decode_num_accepted_tokens, m.spec_decode_num_draft_tokens);
  return m;
}

std::vector<EngineRequest> greedy_requests(int count, int vocab, bool bos, uint32_t seed, int max_prompt = 120,
                                           int min_output = 4) {
  std::mt19937 rng(seed);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < count; ++i) {
    const int len = 2 + static_cast<int>(rng() % max_prompt);
    reqs.push_back(make_request(fmt::format("r{}", i), repetitive_prompt(rng, len, vocab, bos),
                          min_output + static_cast<int>(rng() % 40)));
  }
  return reqs;
}

// Rows' bits do not depend on the batch: recomputed tokens cannot flip a greedy tie.
EngineConfig deterministic(EngineConfig c) {
  c.deterministic = true;
  return c;
}

struct ModelCase {
  const char* name;
  EngineConfig config;
  bool bos;
};

std::vector<ModelCase> test_models() {
  std::vector<ModelCase> cases = {
      {"tiny-llama", dummy_config("tiny-llama"), false},
      {"tiny-qwen3moe-q4_k", dummy_config("tiny-qwen3moe", DType::Q4_K), false},
      {"tiny-gemma3-q8_0", dummy_config("tiny-gemma3", DType::Q8_0), false},
      {"tiny-gptoss", dummy_config("tiny-gptoss"), false},
  };
  if (std::filesystem::exists(stories_config().model)) cases.push_back({"stories260K", stories_config(), true});
  return cases;
}

TEST(SpecEngine, NgramGreedySameAsWithoutEveryModel) {
  for (const ModelCase& m : test_models()) {
    SCOPED_TRACE(m.name);
    expect_same_outputs(m.config, ngram_spec(), greedy_requests(6, 512, m.bos, 3), true);
  }
}

// Multi-head latent attention (the drafts' latents are written to the cache
// and the rejected ones dropped like any other KV) and linear attention (a
// rejected draft restores the state from its snapshot; the accepted tokens
// are computed again). These random models repeat their prompts rarely:
// long outputs, which fall into loops, give the n-gram lookup its hits.
TEST(SpecEngine, NgramGreedySameAsWithoutMlaAndLinearAttention) {
  for (const char* shape : {"tiny-deepseek3", "tiny-qwen35"}) {
    SCOPED_TRACE(shape);
    const EngineMetrics m = expect_same_outputs(deterministic(dummy_config(shape)), ngram_spec(),
                                                greedy_requests(6, 512, false, 3, 60, 80), true);
    EXPECT_LT(m.spec_decode_num_accepted_tokens, m.spec_decode_num_draft_tokens) << "some drafts rejected too";
  }
}

// Linear attention with preemption (recompute from token 0, a fresh state)
// in a pool too small for the batch: a preempted sequence's pending restore
// is dropped with its slot, and the output is each request's alone.
TEST(SpecEngine, NgramLinearAttentionWithPreemptionSameAsAlone) {
  EngineConfig c = deterministic(dummy_config("tiny-qwen35"));
  c.scheduler.max_model_len = 160;
  c.scheduler.max_num_seqs = 8;
  {
    EngineConfig probe_config = c;
    probe_config.speculative = ngram_spec();
    Engine probe(probe_config);
    const KVCacheSpec& spec = probe.backend().kv_cache_spec();
    EXPECT_EQ(spec.state.num_slots, 16);  // a snapshot slot for each of the 8
    c.kv_cache_memory = static_cast<int64_t>(spec.state.bytes_per_slot()) * spec.state.num_slots +
                        static_cast<int64_t>(spec.bytes_per_block()) * 16;
  }
  const EngineMetrics m = expect_same_outputs(c, ngram_spec(), greedy_requests(8, 512, false, 21, 60, 60), true);
  EXPECT_GT(m.num_preemptions, 0) << "the KV budget should force preemption";
}

// 64 greedy and seeded sampled requests at once with a KV pool far too small
// for them (preemption, recompute, prefix caching), against each alone
// without speculation.
TEST(SpecEngine, NgramMixedBatchWithPreemptionSameAsAlone) {
  for (const ModelCase& m : test_models()) {
    const std::string name = m.name;
    if (name != "tiny-llama" && name != "tiny-qwen3moe-q4_k" && name != "stories260K") continue;
    SCOPED_TRACE(name);
    EngineConfig c = m.config;
    const KVCacheLayout layout = name == "stories260K" ? KVCacheLayout{5, 4, 8, 16, 2}  // F16 cache
                                                      : KVCacheLayout{2, 2, 64, 16, 4};
    c.kv_cache_memory = kv_bytes_per_block(layout) * 60;
    std::vector<EngineRequest> reqs = greedy_requests(64, 512, m.bos, 11);
    for (size_t i = 0; i < reqs.size(); i += 3) {
      reqs[i].params.temperature = 0.9f;
      reqs[i].params.top_k = 40;
      reqs[i].params.seed = 100 + i;
    }
    const EngineMetrics spec = expect_same_outputs(c, ngram_spec(), reqs, true);
    EXPECT_GT(spec.num_preemptions, 0) << "the KV budget should force preemption";
  }
}

// The real default model with the input-grounded prompts of the benchmark
// (tools/datasets/grounded.jsonl): same greedy tokens, most drafts accepted.
// The name keeps it out of the ASan run with the other Gemma 3 270M tests.
TEST(TrainedModelVsItself, Gemma3_270M_SpeculativeGreedy) {
  const std::string path = test::default_model_path();
  if (path.empty()) GTEST_SKIP() << "default model not installed (run tools/setup.sh)";
  EngineConfig c;
  c.model = path;
  c.backend_options["threads"] = "2";
  c.scheduler.max_model_len = 1024;
  c.kv_cache_memory = int64_t{64} << 20;
  std::ifstream in(std::string(PAGELLM_SOURCE_DIR) + "/tools/datasets/grounded.jsonl");
  std::string line;
  std::vector<std::string> prompts;
  while (std::getline(in, line) && prompts.size() < 3) prompts.push_back(nlohmann::json::parse(line)["prompt"]);
  ASSERT_EQ(prompts.size(), 3u);
  Engine tok(c);
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i)
    reqs.push_back(make_request(fmt::format("g{}", i), tok.tokenizer().encode(prompts[i], true, false), 40));
  const EngineMetrics m = expect_same_outputs(c, parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2})"), reqs,
      false);
  EXPECT_GT(m.spec_decode_num_accepted_tokens * 2, m.spec_decode_num_draft_tokens);
}

// Every sampling control behaves as without speculation: with point-mass
// proposals a seeded request draws the very same numbers, one per token.
TEST(SpecEngine, NgramSamplingControlsUnchanged) {
  const std::string path = stories_config().model;
  REQUIRE_FILE(path);
  Engine tok_engine(stories_config());
  const auto prompt = tok_engine.tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. Once upon a time, there was a little", true, false);
  {
    // With the server's defaults (the model's context, a 2048-token step,
    // every core) this request's logprobs once differed in the last bits: the
    // glu kernel's scalar tail.
    EngineRequest r = make_request("server_defaults", prompt, 60);
    r.params.ignore_eos = false;
    r.params.temperature = 0.8f;
    r.params.seed = 7;
    r.params.logprobs = 2;
    r.params.stop = {"Lily"};
    EngineConfig c = stories_config();
    c.scheduler.max_model_len = 0;
    c.scheduler.max_num_batched_tokens = 2048;
    c.backend_options.clear();
    expect_same_outputs(c, parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4,
                                                        "prompt_lookup_max": 4, "prompt_lookup_min": 2})"),
                        {r}, false);
  }
  std::vector<EngineRequest> reqs;
  auto add = [&](const std::string& id, auto set) {
    EngineRequest r = make_request(id, prompt, 48);
    r.params.ignore_eos = false;
    set(r.params);
    reqs.push_back(r);
  };
  add("greedy", [](SamplingParams&) {});
  add("seeded", [](SamplingParams& p) { p.temperature = 0.8f; p.seed = 1; });
  add("top_p_min_p", [](SamplingParams& p) { p.temperature = 1.0f; p.top_p = 0.9f; p.min_p = 0.05f; p.seed = 2; });
  add("top_k", [](SamplingParams& p) { p.temperature = 0.7f; p.top_k = 5; p.seed = 3; });
  add("penalties", [](SamplingParams& p) {
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.3f;
  });
  add("bias", [&](SamplingParams& p) { p.logit_bias = {{prompt[3], 5.0f}, {prompt[5], -100.0f}}; });
  add("logprobs", [](SamplingParams& p) { p.logprobs = 3; p.temperature = 0.9f; p.seed = 4; });
  add("stop", [](SamplingParams& p) { p.stop = {"Lily"}; });
  add("min_tokens", [](SamplingParams& p) { p.min_tokens = 30; p.max_tokens = 40; });
  add("n3", [](SamplingParams& p) { p.n = 3; p.temperature = 0.8f; p.seed = 5; });
  expect_same_outputs(stories_config(), ngram_spec(), reqs, false);
}

// A prompt whose last token runs alone in a step (chunked prefill) may be
// verified with drafts; an n > 1 request still draws its n first tokens from
// the prompt's row and forks from there.
TEST(SpecEngine, ChunkedPromptsAndParallelSampling) {
  const std::string target = dummy_file("tiny-llama", 0);
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = target;
  c.scheduler.max_num_batched_tokens = 8;
  // 8 prompt tokens in the first step, the last one alone in the second,
  // where lookup finds "5 6" and proposes what followed it.
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 5, 6};
  expect_same_outputs(c, ngram_spec(), {make_request("one", prompt, 20)}, false, /*expect_accepted=*/false);
  // The target as its own draft accepts (nearly) everything: an n > 1
  // request must not take drafts before its samples fork. (Rejection
  // sampling draws other numbers than plain sampling: the samples differ
  // from a run without speculation, their lengths do not.)
  EngineRequest three = make_request("three", prompt, 20);
  three.params.n = 3;
  three.params.temperature = 0.9f;
  three.params.seed = 3;
  c.speculative = draft_spec(target);
  Engine e(c);
  e.add_request(three);
  const Results res = run_all_freed(e);
  ASSERT_EQ(res.at("three").size(), 3u);
  for (const Result& r : res.at("three")) EXPECT_EQ(r.tokens.size(), 20u);
  EXPECT_GT(e.metrics().spec_decode_num_accepted_tokens, 0);
}

// A structured output's mask applies to every verified position.
TEST(SpecEngine, NgramWithStructuredOutputSameAsWithout) {
  const std::string path = stories_config().model;
  REQUIRE_FILE(path);
  Engine tok_engine(stories_config());
  const auto prompt = tok_engine.tokenizer().encode("Lily and Lily and Lily and", true, false);
  EngineRequest r = make_request("json", prompt, 60);
  r.params.ignore_eos = false;
  r.params.structured.kind = StructuredOutputs::Kind::Json;
  r.params.structured.spec =
      R"({"type": "object", "properties": {"names": {"type": "array", "items": {"enum": ["Lily", "Tom"]}}},
          "required": ["names"]})";
  EngineRequest choice = make_request("regex", prompt, 40);
  choice.params.structured.kind = StructuredOutputs::Kind::Regex;
  choice.params.structured.spec = "(Lily and ){2,6}Tom";
  expect_same_outputs(stories_config(), ngram_spec(), {r, choice}, false);
}

TEST(SpecEngine, DraftModelGreedySameAsWithout) {
  const std::string target = dummy_file("tiny-llama", 0);
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = target;
  const auto reqs = greedy_requests(8, 512, false, 5);
  // The target as its own draft: every proposal is accepted.
  const EngineMetrics same = expect_same_outputs(c, draft_spec(target), reqs, false);
  EXPECT_EQ(same.spec_decode_num_accepted_tokens, same.spec_decode_num_draft_tokens);
  // Another random model as the draft: mostly rejected, same output.
  const std::string other = dummy_file("tiny-llama", 7);
  expect_same_outputs(c, draft_spec(other), reqs, false);
}

// The draft keeps up with preemption and recompute in a pool too small for
// the batch; its cache stays consistent and holds nothing once all finish.
TEST(SpecEngine, DraftModelWithPreemptionSameAsAlone) {
  const std::string target = dummy_file("tiny-llama", 0);
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = target;
  c.kv_cache_memory = kv_bytes_per_block(KVCacheLayout{2, 2, 64, 16, 4}) * 50;
  const auto reqs = greedy_requests(24, 512, false, 9, 60);
  EXPECT_GT(expect_same_outputs(c, draft_spec(target, 4), reqs, true).num_preemptions, 0);
}

TEST(SpecEngine, DraftModelWithAnotherVocabularyIsRefused) {
  const std::string stories = stories_config().model;
  REQUIRE_FILE(stories);
  EngineConfig c = stories_config();
  c.speculative = draft_spec(dummy_file("tiny-llama", 0));  // 512 tokens too, other texts
  try {
    Engine e(c);
    FAIL() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not share the target model's vocabulary"), std::string::npos)
        << e.what();
  }
  c.speculative = draft_spec(test::temp_dir() + "/missing.gguf");
  EXPECT_THROW(Engine{c}, Error);
}

// A hybrid target (linear-attention states rolled back by snapshot) with a
// plain draft model: the same greedy output; a draft model with such layers
// of its own is refused by name.
TEST(SpecEngine, LinearAttentionTargetWithADraftModel) {
  EngineConfig c = deterministic(dummy_config("tiny-qwen35"));
  c.load_format = "auto";
  c.model = dummy_file("tiny-qwen35", 0);
  expect_same_outputs(c, draft_spec(dummy_file("tiny-llama", 5), 3), greedy_requests(4, 512, false, 9), true, false);
  EngineConfig hybrid_draft = dummy_config("tiny-llama");
  hybrid_draft.load_format = "auto";
  hybrid_draft.model = dummy_file("tiny-llama", 0);
  hybrid_draft.speculative = draft_spec(dummy_file("tiny-qwen35", 6), 3);
  try {
    Engine e(hybrid_draft);
    ADD_FAILURE() << "a draft model with linear-attention layers was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has linear-attention layers"), std::string::npos) << e.what();
  }
}

// Sampled requests with a draft that only partly agrees with the target (the
// same random weights rounded to 4 bits): over many seeds, the first two
// output tokens follow the target's own distribution (the second, and the
// first when the prompt's last token runs alone, verified against the
// draft's proposal by rejection sampling).
TEST(SpecEngine, DraftModelSamplingMatchesTheTargetDistribution) {
  const std::string target = dummy_file("tiny-llama", 0);
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = target;
  const float temperature = 0.8f;
  const int top_k = 6;
  const std::vector<int32_t> prompt = {5, 17, 99, 250, 3, 41};

  // The target's exact distribution from its raw top-k logprobs.
  auto next_dist = [&](Engine& e, const std::vector<int32_t>& p) {
    EngineRequest r = make_request("probe", p, 1);
    r.params.logprobs = top_k;
    e.add_request(r);
    std::vector<std::pair<int32_t, double>> dist;
    while (e.has_unfinished())
      for (RequestOutput& out : e.step())
        for (const auto& d : out.completions)
          for (const auto& lp : d.logprobs)
            for (const auto& [id, logprob] : lp.top) dist.emplace_back(id, std::exp(logprob / temperature));
    double total = 0;
    for (const auto& [id, w] : dist) total += w;
    for (auto& [id, w] : dist) w /= total;
    return dist;
  };
  std::map<std::pair<int32_t, int32_t>, double> expected;
  {
    Engine e(c);
    for (const auto& [t1, p1] : next_dist(e, prompt)) {
      auto p = prompt;
      p.push_back(t1);
      for (const auto& [t2, p2] : next_dist(e, p)) expected[{t1, t2}] = p1 * p2;
    }
  }
  c.speculative = draft_spec(dummy_file("tiny-llama", 0, DType::Q4_0), 1);
  Engine e(c);
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    EngineRequest r = make_request(fmt::format("s{}", i), prompt, 3);
    r.params.temperature = temperature;
    r.params.top_k = top_k;
    r.params.seed = static_cast<uint64_t>(i);
    e.add_request(r);
  }
  std::map<std::pair<int32_t, int32_t>, int> counts;
  for (const auto& [id, samples] : run_all_freed(e)) counts[{samples[0].tokens[0], samples[0].tokens[1]}]++;
  double chi2 = 0;
  int cells = 0;
  for (const auto& [pair, p] : expected) {
    const double want = p * n;
    if (want < 5) continue;  // too rare to weigh; still counted below
    chi2 += (counts[pair] - want) * (counts[pair] - want) / want;
    ++cells;
  }
  for (const auto& [pair, count] : counts) EXPECT_TRUE(expected.count(pair)) << "outside top-k: " << pair.first;
  // The 99.9th percentile of chi-square with 35 degrees of freedom is 66.6.
  EXPECT_LT(chi2, 66.6) << cells << " cells";
  const EngineMetrics& m = e.metrics();
  EXPECT_GE(m.spec_decode_num_drafts, n);
  EXPECT_GT(m.spec_decode_num_accepted_tokens, m.spec_decode_num_drafts / 4) << "some drafts should be accepted";
  EXPECT_LT(m.spec_decode_num_accepted_tokens, m.spec_decode_num_drafts * 19 / 20) << "some should be rejected";
}

// Drafts that keep failing pause speculation: far fewer verifications than
// decode steps, and the output is unchanged.
TEST(SpecEngine, AdaptiveSpeculationBacksOffWhenDraftsFail) {
  const std::string target = dummy_file("tiny-llama", 0);
  EngineConfig c = dummy_config("tiny-llama");
  c.load_format = "auto";
  c.model = target;
  c.speculative = draft_spec(dummy_file("tiny-llama", 7), 3, /*adaptive=*/true);
  Engine e(c);
  std::mt19937 rng(1);
  e.add_request(make_request("long", repetitive_prompt(rng, 20, 512, false), 200));
  run_all_freed(e);
  const EngineMetrics& m = e.metrics();
  const double acceptance = double(m.spec_decode_num_accepted_tokens) / double(m.spec_decode_num_draft_tokens);
  if (acceptance < AdaptiveSpeculation::kMinAcceptance) {
    EXPECT_LT(m.spec_decode_num_drafts, 200 / 3) << "acceptance " << acceptance;
  }
}

}  // namespace
}  // namespace pagellm
