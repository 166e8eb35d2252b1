// xgrammar behind src/structured: request-time validation (400s), the
// background compiler and its cache, and the matcher on a real vocabulary.
#include "structured/grammar.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::structured {
namespace {

using Kind = StructuredOutputs::Kind;

StructuredOutputs spec(Kind kind, std::string text) {
  StructuredOutputs s;
  s.kind = kind;
  s.spec = std::move(text);
  return s;
}

std::string validate_error(const StructuredOutputs& s) {
  try {
    validate(s, GrammarLimits{}, "response_format");
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "response_format");
    return e.what();
  }
  ADD_FAILURE() << "no error for " << s.spec;
  return "";
}

TEST(StructuredValidate, AcceptsValidSpecs) {
  EXPECT_NO_THROW(validate(StructuredOutputs{}, GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"object","properties":{"a":{"type":"integer"}}})"), GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::JsonObject, ""), GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Regex, "[a-z]+@[a-z]+\\.com"), GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Choice, R"(["yes", "no", "say \"maybe\""])"), GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Grammar, "root ::= \"a\" rest\nrest ::= [0-9]+"), GrammarLimits{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"integer","multipleOf":3,"minimum":0,"maximum":99})"), GrammarLimits{}, "x"));
}

TEST(StructuredValidate, NamesTheProblem) {
  EXPECT_NE(validate_error(spec(Kind::Json, "{not json")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Json, "[1, 2]")).find("must be an object"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"type":"frobnicate"})")).find("frobnicate"), std::string::npos);
  const std::string unique = validate_error(
      spec(Kind::Json, R"({"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}}})"));
  EXPECT_NE(unique.find("uniqueItems"), std::string::npos) << unique;
  EXPECT_NE(unique.find("#/properties/tags"), std::string::npos) << unique;
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"not":{"type":"string"}})")).find("'not'"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"type":"number","multipleOf":0.5})")).find("multipleOf"),
            std::string::npos);
  // A property merely called "not" is not the keyword.
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"object","properties":{"not":{"type":"string"}}})"), GrammarLimits{}, "x"));
  EXPECT_NE(validate_error(spec(Kind::Regex, "[a-z")).find("regex"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Grammar, "root ::= undefined_rule")).find("grammar"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Grammar, "start ::= \"a\"")).find("grammar"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Choice, "[]")).find("non-empty"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Choice, "[1]")).find("strings"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::StructuralTag, R"({"type":"nonsense"})")).find("structural tag"),
            std::string::npos);
}

std::string nested_arrays(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += R"({"type":"array","items":)";
  s += R"({"type":"integer"})";
  return s + std::string(static_cast<size_t>(depth), '}');
}

TEST(StructuredLimits, EveryKindIsMeasuredBeforeXgrammarSeesIt) {
  GrammarLimits small;
  small.max_bytes = 4096;
  small.max_depth = 8;
  small.max_nodes = 100;
  auto error = [&](Kind kind, const std::string& text) {
    try {
      validate(spec(kind, text), small, "guided_json");
    } catch (const InvalidRequest& e) {
      EXPECT_EQ(e.param(), "guided_json");
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NO_THROW(validate(spec(Kind::Json, nested_arrays(6)), small, "x"));
  EXPECT_NE(error(Kind::Json, nested_arrays(9)).find("nests 10 levels deep; the limit is 8 (--grammar-max-depth)"),
            std::string::npos);
  // 5,000 levels: refused by size before any parser runs.
  EXPECT_NE(error(Kind::Json, nested_arrays(5000)).find("--grammar-max-bytes"), std::string::npos);
  std::string big_enum = R"({"enum":[)";
  for (int i = 0; i < 150; ++i) big_enum += (i ? "," : "") + std::to_string(i);
  EXPECT_NE(error(Kind::Json, big_enum + "]}").find("JSON values; the limit is 100"), std::string::npos);
  std::string choices = "[";
  for (int i = 0; i < 101; ++i) choices += fmt::format("{}\"c{}\"", i ? "," : "", i);
  EXPECT_NE(error(Kind::Choice, choices + "]").find("101 choices"), std::string::npos);
  EXPECT_NE(error(Kind::Regex, "(a{1000}){1000}").find("1000000 atoms"), std::string::npos);
  // A count past int64 saturates instead of overflowing (a fuzzer finding).
  EXPECT_NE(error(Kind::Regex, "a{99999999999999999999999,9999999999999999999999999}").find("over "), std::string::npos);
  EXPECT_NE(error(Kind::Regex, "((((((((((a))))))))))").find("groups 10 levels deep"), std::string::npos);
  EXPECT_NO_THROW(validate(spec(Kind::Regex, "[a-z]{1,20}@(com|org)"), small, "x"));
  EXPECT_NE(error(Kind::Grammar, "root ::= \"a\"{500}").find("atoms"), std::string::npos);
  EXPECT_NO_THROW(validate(spec(Kind::Grammar, "root ::= item (\",\" item)*\nitem ::= [0-9]+"), small, "x"));
  EXPECT_NE(error(Kind::Grammar, "root ::= \"" + std::string(5000, 'a') + "\"").find("5011 bytes"), std::string::npos);
}

TEST(StructuredValidate, RefusesWhatCannotBeEnforced) {
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"allOf":[{"type":"string"},{"type":"integer"}]})")).find("allOf"),
            std::string::npos);
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"$defs":{"a":{"type":"integer"}},"allOf":[{"$ref":"#/$defs/a"}]})"),
                           GrammarLimits{}, "x"));
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"$ref":"https://example.com/schema.json"})")).find("outside"),
            std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"anyOf":[]})")).find("empty"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Json, R"({"type":"object","properties":{"a":{"enum":[]}}})")).find("enum"),
            std::string::npos);
}

TEST(StructuredValidate, ChoiceGrammarEscapes) {
  EXPECT_EQ(choice_grammar({"a", "b\"c", "d\\e", "\n"}), R"(root ::= "a" | "b\"c" | "d\\e" | "\x0a")");
}

class GrammarOnStories : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
  }
  // Feeds `text` one byte token (<0xNN>) at a time: exact bytes, unlike
  // encode(), whose SentencePiece dummy prefix would add a leading space.
  int32_t byte_token(unsigned char c) const {
    const auto id = tok_->find_token(fmt::format("<0x{:02X}>", c));
    EXPECT_TRUE(id.has_value()) << int(c);
    return id.value_or(0);
  }
  bool accepts_text(GrammarMatcher& m, const std::string& text) {
    for (unsigned char c : text)
      if (!m.accept(byte_token(c))) return false;
    return true;
  }
  static bool allowed(const std::vector<int32_t>& mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1; }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(GrammarOnStories, MatcherFollowsTheGrammarAndEndsWithEos) {
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids());
  const CompileResult r = compiler.compile(spec(Kind::Choice, R"(["Once upon a time", "Lily"])"))->get();
  ASSERT_TRUE(r.grammar) << r.error;
  GrammarMatcher m(r.grammar);
  std::vector<int32_t> mask(static_cast<size_t>(bitmask_words(compiler.vocab_size())));
  ASSERT_TRUE(m.fill_next_token_bitmask(mask.data(), compiler.vocab_size()));
  const int32_t eos = tok_->eos_id();
  EXPECT_FALSE(allowed(mask, eos));
  int n_allowed = 0;
  for (int32_t id = 0; id < tok_->vocab_size(); ++id) {
    if (!allowed(mask, id)) continue;
    ++n_allowed;
    // Every allowed token's text starts one of the choices.
    const std::string piece = tok_->token_to_piece(id, false);
    EXPECT_TRUE(std::string("Once upon a time").starts_with(piece) || std::string("Lily").starts_with(piece))
        << "'" << piece << "'";
  }
  EXPECT_GT(n_allowed, 1);
  EXPECT_FALSE(m.accept(byte_token('T')));  // refused, state unchanged
  ASSERT_TRUE(accepts_text(m, "Lily"));
  EXPECT_TRUE(m.completed());
  EXPECT_FALSE(m.terminated());
  m.fill_next_token_bitmask(mask.data(), compiler.vocab_size());
  EXPECT_TRUE(allowed(mask, eos));
  ASSERT_TRUE(m.accept(eos));
  EXPECT_TRUE(m.terminated());
  m.rollback(1);
  EXPECT_FALSE(m.terminated());
}

TEST_F(GrammarOnStories, CompilerCachesAndSharesCompiles) {
  GrammarCompilerOptions two;
  two.cache_entries = 2;
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids(), two);
  const auto a1 = compiler.compile(spec(Kind::Regex, "[a-z]+"));
  const auto a2 = compiler.compile(spec(Kind::Regex, "[a-z]+"));  // joins the first
  ASSERT_TRUE(a1->get().grammar);
  const auto bad = compiler.compile(spec(Kind::Regex, "(unclosed"));
  EXPECT_FALSE(bad->get().grammar);
  EXPECT_EQ(a1->get().grammar, a2->get().grammar);
  EXPECT_FALSE(bad->get().grammar);
  EXPECT_FALSE(bad->get().error.empty());
  compiler.compile(spec(Kind::Regex, "[0-9]+"))->get();  // the cache holds 2: "[a-z]+" goes
  const auto a3 = compiler.compile(spec(Kind::Regex, "[a-z]+"));
  ASSERT_TRUE(a3->get().grammar);
  EXPECT_NE(a3->get().grammar, a1->get().grammar);  // compiled again
  const GrammarCompilerStats s = compiler.stats();
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.compiled, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.cached, 2u);
}

TEST_F(GrammarOnStories, AnEmptyLanguageIsTheClientsError) {
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids());
  for (const auto& s : {spec(Kind::Regex, "[^\\s\\S]"), spec(Kind::Grammar, "root ::= root \"a\""),
                        spec(Kind::Grammar, "root ::= x\nx ::= x")}) {
    const CompileResult r = compiler.compile(s)->get();
    EXPECT_FALSE(r.grammar) << s.spec;
    EXPECT_EQ(r.error_kind, CompileResult::Error::Invalid) << s.spec;
    EXPECT_NE(r.error.find("admits no output"), std::string::npos) << r.error;
  }
  // The empty string is a language of one sentence: only a stop token.
  const CompileResult empty = compiler.compile(spec(Kind::Grammar, "root ::= \"\""))->get();
  ASSERT_TRUE(empty.grammar) << empty.error;
  GrammarMatcher m(empty.grammar);
  std::vector<int32_t> mask(static_cast<size_t>(bitmask_words(compiler.vocab_size())));
  ASSERT_TRUE(m.fill_next_token_bitmask(mask.data(), compiler.vocab_size()));
  EXPECT_TRUE(allowed(mask, tok_->eos_id()));
  EXPECT_FALSE(allowed(mask, byte_token('a')));
}

TEST_F(GrammarOnStories, ACompileOverItsBudgetIsStoppedAndOthersGoOn) {
  GrammarCompilerOptions o;
  o.workers = 2;
  // Room for the quick regex under ASan on a loaded machine (forking an ASan
  // process alone took over 0.3 s); 600 required properties take ~1.9 s in
  // a release build here, longer in any other.
  o.budget.time = std::chrono::milliseconds(1000);
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids(), o);
  nlohmann::json schema = {{"type", "object"}};
  for (int i = 0; i < 600; ++i) {
    schema["properties"][fmt::format("p{}", i)] = {{"type", "integer"}};
    schema["required"].push_back(fmt::format("p{}", i));
  }
  const auto slow = compiler.compile(spec(Kind::Json, schema.dump()));
  const auto quick = compiler.compile(spec(Kind::Regex, "[0-9]+"));  // the second worker takes it
  ASSERT_TRUE(quick->get().grammar) << quick->get().error;
  const CompileResult r = slow->get();
  EXPECT_FALSE(r.grammar);
  EXPECT_EQ(r.error_kind, CompileResult::Error::OverBudget);
  EXPECT_NE(r.error.find("--grammar-compile-timeout"), std::string::npos) << r.error;
  const GrammarCompilerStats s = compiler.stats();
  EXPECT_EQ(s.over_budget, 1);
  EXPECT_EQ(s.compile_time.count(), 2u);
  // A budget failure is not cached: the next ask compiles again.
  compiler.compile(spec(Kind::Json, schema.dump()))->get();
  EXPECT_EQ(compiler.stats().over_budget, 2);
}

TEST_F(GrammarOnStories, DroppingEveryWaiterCancelsTheCompile) {
  GrammarCompilerOptions o;
  o.workers = 1;
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids(), o);
  nlohmann::json schema = {{"type", "object"}};
  for (int i = 0; i < 400; ++i) schema["properties"][fmt::format("q{}", i)] = {{"type", "string"}};
  auto slow = compiler.compile(spec(Kind::Json, schema.dump()));
  auto queued = compiler.compile(spec(Kind::Regex, "[a-z]+"));
  const auto t0 = std::chrono::steady_clock::now();
  while (compiler.stats().in_progress == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  slow.reset();  // its only waiter leaves: the worker is killed, the queue moves on
  ASSERT_TRUE(queued->get().grammar);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const GrammarCompilerStats s = compiler.stats();
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_EQ(s.in_progress, 0);
  EXPECT_EQ(s.queued, 0);
}

TEST_F(GrammarOnStories, StoppingTheCompilerEndsCompilesInProgress) {
  nlohmann::json schema = {{"type", "object"}};
  for (int i = 0; i < 400; ++i) schema["properties"][fmt::format("r{}", i)] = {{"type", "string"}};
  std::shared_ptr<PendingGrammar> pending;
  const auto t0 = std::chrono::steady_clock::now();
  {
    GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids());
    pending = compiler.compile(spec(Kind::Json, schema.dump()));
    while (compiler.stats().in_progress == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(pending->ready());
  EXPECT_EQ(pending->get().error_kind, CompileResult::Error::Unavailable);
}

TEST_F(GrammarOnStories, JsonSchemaMatcherAcceptsValidJsonOnly) {
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids());
  const auto g = compiler.compile(spec(Kind::Json, R"({"type":"object","properties":{"name":{"type":"string"},
      "age":{"type":"integer","minimum":0}},"required":["name","age"]})"))->get();
  ASSERT_TRUE(g.grammar) << g.error;
  GrammarMatcher ok(g.grammar);
  EXPECT_TRUE(accepts_text(ok, R"({"name": "Lily", "age": 3})"));
  EXPECT_TRUE(ok.completed());
  GrammarMatcher missing(g.grammar);
  EXPECT_TRUE(accepts_text(missing, R"({"name": "Lily")"));
  EXPECT_FALSE(accepts_text(missing, "}"));  // age is required
  GrammarMatcher negative(g.grammar);
  EXPECT_FALSE(accepts_text(negative, R"({"name": "Lily", "age": -)"));
}

}  // namespace
}  // namespace pagellm::structured
