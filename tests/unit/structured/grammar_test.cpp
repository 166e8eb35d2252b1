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
    validate(s, "response_format");
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "response_format");
    return e.what();
  }
  ADD_FAILURE() << "no error for " << s.spec;
  return "";
}

TEST(StructuredValidate, AcceptsValidSpecs) {
  EXPECT_NO_THROW(validate(StructuredOutputs{}, "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"object","properties":{"a":{"type":"integer"}}})"), "x"));
  EXPECT_NO_THROW(validate(spec(Kind::JsonObject, ""), "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Regex, "[a-z]+@[a-z]+\\.com"), "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Choice, R"(["yes", "no", "say \"maybe\""])"), "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Grammar, "root ::= \"a\" rest\nrest ::= [0-9]+"), "x"));
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"integer","multipleOf":3,"minimum":0,"maximum":99})"), "x"));
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
  EXPECT_NO_THROW(validate(spec(Kind::Json, R"({"type":"object","properties":{"not":{"type":"string"}}})"), "x"));
  EXPECT_NE(validate_error(spec(Kind::Regex, "[a-z")).find("regex"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Grammar, "root ::= undefined_rule")).find("grammar"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Grammar, "start ::= \"a\"")).find("grammar"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Choice, "[]")).find("non-empty"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::Choice, "[1]")).find("strings"), std::string::npos);
  EXPECT_NE(validate_error(spec(Kind::StructuralTag, R"({"type":"nonsense"})")).find("structural tag"),
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
  const CompileResult r = compiler.compile(spec(Kind::Choice, R"(["Once upon a time", "Lily"])")).get();
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
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids(), /*cache_capacity=*/2);
  const auto a1 = compiler.compile(spec(Kind::Regex, "[a-z]+"));
  const auto a2 = compiler.compile(spec(Kind::Regex, "[a-z]+"));  // joins the first
  const auto bad = compiler.compile(spec(Kind::Regex, "(unclosed"));
  ASSERT_TRUE(a1.get().grammar);
  EXPECT_EQ(a1.get().grammar, a2.get().grammar);
  EXPECT_FALSE(bad.get().grammar);
  EXPECT_FALSE(bad.get().error.empty());
  compiler.compile(spec(Kind::Regex, "[0-9]+")).get();  // the cache holds 2: "[a-z]+" goes
  const auto a3 = compiler.compile(spec(Kind::Regex, "[a-z]+"));
  ASSERT_TRUE(a3.get().grammar);
  EXPECT_NE(a3.get().grammar, a1.get().grammar);  // compiled again
  const GrammarCompilerStats s = compiler.stats();
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.compiled, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.cached, 2u);
}

TEST_F(GrammarOnStories, JsonSchemaMatcherAcceptsValidJsonOnly) {
  GrammarCompiler compiler(*tok_, tok_->vocab_size(), tok_->eog_ids());
  const auto g = compiler.compile(spec(Kind::Json, R"({"type":"object","properties":{"name":{"type":"string"},
      "age":{"type":"integer","minimum":0}},"required":["name","age"]})")).get();
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
