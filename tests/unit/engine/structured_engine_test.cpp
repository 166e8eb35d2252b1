// Structured outputs through the whole engine on stories260K: the grammar
// wins over the model where they disagree and nowhere else, requests wait
// for their grammar without holding up others, and constrained and free
// requests batch (with preemption) exactly as they run alone.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "kv/kv_sizing.h"
#include "structured/grammar.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using Kind = StructuredOutputs::Kind;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string error;
};

std::map<std::string, std::vector<Output>> run_all(Engine& e) {
  std::map<std::string, std::vector<Output>> out;
  while (e.has_unfinished()) {
    for (RequestOutput& o : e.step()) {
      auto& samples = out[o.request_id];
      if (!o.error.empty()) samples.resize(1), samples[0].error = o.error;
      for (const CompletionDelta& d : o.completions) {
        if (samples.size() <= static_cast<size_t>(d.index)) samples.resize(d.index + 1);
        Output& s = samples[d.index];
        s.tokens.insert(s.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        s.logprobs.insert(s.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        s.text += d.text;
        if (d.finish_reason != FinishReason::None) s.reason = d.finish_reason;
      }
    }
    e.check_invariants();
  }
  return out;
}

EngineConfig stories_config(int kv_blocks = 0) {
  EngineConfig c;
  c.model = test::shared_data("models/stories260K.gguf");
  c.backend_options["threads"] = "2";
  c.scheduler.max_model_len = 256;
  c.scheduler.max_num_batched_tokens = 128;
  // stories260K: 5 layers, 4 KV heads of 8.
  if (kv_blocks) c.kv_cache_memory = kv_bytes_per_block(KVCacheLayout{5, 4, 8, 16, 2}) * kv_blocks;
  return c;
}

EngineRequest request(const std::string& id, const Tokenizer& tok, const std::string& prompt, Kind kind,
                      const std::string& spec, int max_tokens = 48) {
  EngineRequest r;
  r.id = id;
  r.prompt_ids = tok.encode(prompt, true, false);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.structured.kind = kind;
  r.params.structured.spec = spec;
  return r;
}

const char* kSchema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":1,"maximum":99}},"required":["name","age"],"additionalProperties":false})";

TEST(StructuredEngine, GreedyPicksTheBestAllowedTokenEveryStep) {
  REQUIRE_FILE(test::shared_data("models/stories260K.gguf"));
  Engine engine(stories_config());
  const Tokenizer& tok = engine.tokenizer();
  EngineRequest r = request("json", tok, "Once upon a time", Kind::Json, kSchema, 200);
  r.params.logprobs = 20;  // the raw (unmasked) top 20 at every step
  engine.add_request(r);
  const Output out = run_all(engine).at("json")[0];
  ASSERT_TRUE(out.error.empty()) << out.error;
  EXPECT_EQ(out.reason, FinishReason::Stop) << out.text;
  const auto parsed = nlohmann::json::parse(out.text);  // valid JSON ...
  EXPECT_TRUE(parsed.at("name").is_string());           // ... of the schema
  EXPECT_GE(parsed.at("age").get<int>(), 1);
  EXPECT_LE(parsed.at("age").get<int>(), 99);

  // Replay with an independent matcher: every token was allowed, and every
  // token the model scored higher was not.
  structured::GrammarCompiler compiler(tok, engine.model_config().n_vocab, tok.eog_ids());
  const auto g = compiler.compile(r.params.structured)->get();
  ASSERT_TRUE(g.grammar);
  structured::GrammarMatcher m(g.grammar);
  std::vector<int32_t> mask(static_cast<size_t>(structured::bitmask_words(compiler.vocab_size())));
  auto allowed = [&](int32_t id) { return (mask[id / 32] >> (id % 32)) & 1; };
  int disagreements = 0;
  ASSERT_EQ(out.logprobs.size(), out.tokens.size());
  for (size_t t = 0; t < out.tokens.size(); ++t) {
    m.fill_next_token_bitmask(mask.data(), compiler.vocab_size());
    const TokenLogprob& lp = out.logprobs[t];
    EXPECT_TRUE(allowed(out.tokens[t])) << "step " << t;
    for (const auto& [id, logprob] : lp.top)
      if (logprob > lp.logprob) {
        EXPECT_FALSE(allowed(id)) << "step " << t << ": token " << id << " scored higher";
      }
    if (!lp.top.empty() && lp.top[0].first != out.tokens[t]) ++disagreements;
    ASSERT_TRUE(m.accept(out.tokens[t]));
  }
  EXPECT_TRUE(m.terminated());
  EXPECT_GT(disagreements, 0) << "the grammar never overrode the model: the test shows nothing";
}

TEST(StructuredEngine, BadGrammarFailsOnlyItsRequest) {
  REQUIRE_FILE(test::shared_data("models/stories260K.gguf"));
  Engine engine(stories_config());
  const Tokenizer& tok = engine.tokenizer();
  EXPECT_THROW(engine.add_request(request("bad", tok, "Once", Kind::Regex, "(unclosed")), InvalidRequest);
  EXPECT_THROW(engine.add_request(request("bad", tok, "Once", Kind::Json, R"({"uniqueItems":true})")),
               InvalidRequest);
  EXPECT_FALSE(engine.has_unfinished());
  engine.add_request(request("choice", tok, "Once upon a time", Kind::Choice, R"(["Lily", "Tom", "Ben"])"));
  EngineRequest free = request("free", tok, "Once upon a time", Kind::None, "", 8);
  engine.add_request(free);
  const auto out = run_all(engine);
  const Output& c = out.at("choice")[0];
  EXPECT_TRUE(c.text == "Lily" || c.text == "Tom" || c.text == "Ben") << c.text;
  EXPECT_EQ(c.reason, FinishReason::Stop);
  EXPECT_EQ(out.at("free")[0].tokens.size(), 8u);
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv.used_blocks, 0);
  EXPECT_EQ(s.grammars.compiled, 1);
}

TEST(StructuredEngine, AbortWhileWaitingForTheGrammar) {
  REQUIRE_FILE(test::shared_data("models/stories260K.gguf"));
  Engine engine(stories_config());
  engine.add_request(request("a", engine.tokenizer(), "Once", Kind::Regex, "[a-z]{3,9}"));
  const auto out = engine.abort("a");  // most likely still compiling: either way it ends now
  ASSERT_TRUE(out);
  EXPECT_TRUE(out->finished);
  EXPECT_FALSE(engine.has_unfinished());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(engine.step().empty());
}

// Constrained (several grammars, n > 1, random sampling with seeds) and free
// requests together in a KV pool small enough to force preemption: each
// output equals the output of the request run alone.
TEST(StructuredEngine, BatchInvarianceWithPreemptionAndMixedRequests) {
  REQUIRE_FILE(test::shared_data("models/stories260K.gguf"));
  EngineConfig config = stories_config(/*kv_blocks=*/17);
  config.scheduler.max_model_len = 128;
  Engine together(config);
  const Tokenizer& tok = together.tokenizer();
  const std::vector<std::pair<Kind, std::string>> grammars = {
      {Kind::Json, kSchema},
      {Kind::Regex, "(Lily|Tom) (saw|had) a [a-z]{2,8}\\."},
      {Kind::Choice, R"(["happy", "sad", "sleepy"])"},
      {Kind::Grammar, "root ::= \"The \" word \" \" word \".\"\nword ::= [a-z]+"},
      {Kind::JsonObject, ""},
      {Kind::None, ""}};
  const std::vector<std::string> prompts = {"Once upon a time", "Lily and Ben", "One day, a little girl",
                                            "The sun was shining"};
  std::vector<EngineRequest> reqs;
  std::mt19937 rng(3);
  for (int i = 0; i < 24; ++i) {
    const auto& [kind, spec] = grammars[i % grammars.size()];
    EngineRequest r = request(fmt::format("r{}", i), tok, prompts[rng() % prompts.size()], kind, spec,
                              16 + static_cast<int>(rng() % 80));
    if (i % 4 == 1) {
      r.params.temperature = 0.9f;
      r.params.seed = 100 + i;
      r.params.n = 2;
    }
    reqs.push_back(r);
  }
  for (const auto& r : reqs) together.add_request(r);
  const auto batched = run_all(together);
  EXPECT_GT(together.metrics().num_preemptions, 0) << "the KV budget should force preemption";
  Engine alone(config);
  for (const auto& r : reqs) {
    alone.add_request(r);
    const auto single = run_all(alone);
    ASSERT_EQ(batched.at(r.id).size(), single.at(r.id).size());
    for (size_t k = 0; k < single.at(r.id).size(); ++k) {
      EXPECT_EQ(batched.at(r.id)[k].tokens, single.at(r.id)[k].tokens) << r.id << " sample " << k;
      EXPECT_TRUE(batched.at(r.id)[k].error.empty()) << batched.at(r.id)[k].error;
    }
  }
  EXPECT_EQ(together.stats().kv.used_blocks, 0);
}

}  // namespace
}  // namespace pagellm
