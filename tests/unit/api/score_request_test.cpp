// /v1/rerank and /v1/score request parsing (documents as strings or
// {"text"}, 1:N and N:N pairs, the 400s naming their field), pair
// formatting (raw and a template) and the responses' shapes.
#include "api/score_request.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

class ScoreRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
    m_.name = "reranker";
    m_.tokenizer = tok_.get();
    m_.vocab_size = tok_->vocab_size();
    m_.max_model_len = 64;
    m_.task = ServeTask::Score;
  }

  template <typename Parse>
  std::string error_param(Parse parse, const json& body) {
    try {
      parse(body, m_);
    } catch (const InvalidRequest& e) {
      return e.param().empty() ? "<none>" : e.param();
    }
    ADD_FAILURE() << "parsed: " << body;
    return "";
  }

  std::vector<int32_t> raw(const std::string& q, const std::string& d) const {
    std::vector<int32_t> ids = tok_->encode(q, true, false);
    for (int32_t t : tok_->encode(d, false, false)) ids.push_back(t);
    return ids;
  }

  std::unique_ptr<Tokenizer> tok_;
  ServedModel m_;
};

TEST_F(ScoreRequestTest, RerankDocumentsAsStringsOrObjects) {
  const auto r = parse_rerank_request(
      {{"query", "Once upon"}, {"documents", {"a time", {{"text", "there was"}}}}, {"top_n", 1}}, m_);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], raw("Once upon", "a time"));
  EXPECT_EQ(r.prompts[1], raw("Once upon", "there was"));
  EXPECT_EQ(r.documents, (std::vector<std::string>{"a time", "there was"}));
  EXPECT_EQ(r.top_n, 1);
  EXPECT_TRUE(r.return_documents);
}

TEST_F(ScoreRequestTest, TemplateFormatsEachPair) {
  m_.score_format.template_text = "Q: {query}\nD: {document}";
  const auto r = parse_rerank_request({{"query", "cat"}, {"documents", {"dog"}}}, m_);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], tok_->encode("Q: cat\nD: dog", false, true));
}

TEST_F(ScoreRequestTest, ScoreOneToManyAndPairwise) {
  auto r = parse_score_request({{"text_1", "Once"}, {"text_2", {"a", "b", "c"}}}, m_);
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[2], raw("Once", "c"));
  r = parse_score_request({{"text_1", {"x", "y"}}, {"text_2", {"a", "b"}}}, m_);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], raw("x", "a"));
  EXPECT_EQ(r.prompts[1], raw("y", "b"));
  r = parse_score_request({{"text_1", {"x"}}, {"text_2", "a"}}, m_);
  ASSERT_EQ(r.prompts.size(), 1u);
}

TEST_F(ScoreRequestTest, BadInputNamesTheField) {
  auto rerank = [](const json& b, const ServedModel& m) { return parse_rerank_request(b, m); };
  auto score = [](const json& b, const ServedModel& m) { return parse_score_request(b, m); };
  EXPECT_EQ(error_param(rerank, {{"documents", {"a"}}}), "query");
  EXPECT_EQ(error_param(rerank, {{"query", 3}, {"documents", {"a"}}}), "query");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}}), "documents");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", json::array()}}), "documents");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", "a"}}), "documents");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", {1}}}), "documents");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", {{{"txt", "a"}}}}}), "documents");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", {"a"}}, {"top_n", -1}}), "top_n");
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", {"a"}}, {"model", "other"}}), "model");
  // a pair over the context (64 tokens)
  std::string long_doc;
  for (int i = 0; i < 80; ++i) long_doc += " once";
  EXPECT_EQ(error_param(rerank, {{"query", "q"}, {"documents", {"a", long_doc}}}), "documents");
  EXPECT_EQ(error_param(score, {{"text_1", "q"}, {"text_2", {long_doc}}}), "text_2");
  EXPECT_EQ(error_param(score, {{"text_2", "a"}}), "text_1");
  EXPECT_EQ(error_param(score, {{"text_1", "a"}}), "text_2");
  EXPECT_EQ(error_param(score, {{"text_1", json::array()}, {"text_2", "a"}}), "text_1");
  EXPECT_EQ(error_param(score, {{"text_1", "a"}, {"text_2", json::array()}}), "text_2");
  EXPECT_EQ(error_param(score, {{"text_1", {"a", "b"}}, {"text_2", {"a", "b", "c"}}}), "text_1");
  EXPECT_EQ(error_param(score, {{"text_1", "a"}, {"text_2", {"b", 2}}}), "text_2");
}

TEST_F(ScoreRequestTest, RerankResponseSortsAndCuts) {
  ScoreRequest r = parse_rerank_request({{"query", "q"}, {"documents", {"a", "b", "c"}}}, m_);
  const std::vector<float> scores = {0.2f, 0.9f, 0.5f};
  json out = rerank_response(r, scores, "rerank-1", "reranker");
  EXPECT_EQ(out["id"], "rerank-1");
  EXPECT_EQ(out["model"], "reranker");
  EXPECT_EQ(out["usage"]["total_tokens"], total_tokens(r));
  ASSERT_EQ(out["results"].size(), 3u);
  EXPECT_EQ(out["results"][0]["index"], 1);
  EXPECT_EQ(out["results"][0]["document"]["text"], "b");
  EXPECT_FLOAT_EQ(out["results"][0]["relevance_score"].get<float>(), 0.9f);
  EXPECT_EQ(out["results"][1]["index"], 2);
  EXPECT_EQ(out["results"][2]["index"], 0);
  r.top_n = 2;
  r.return_documents = false;
  out = rerank_response(r, scores, "rerank-1", "reranker");
  ASSERT_EQ(out["results"].size(), 2u);
  EXPECT_FALSE(out["results"][0].contains("document"));
}

TEST_F(ScoreRequestTest, ScoreResponseShape) {
  const ScoreRequest r = parse_score_request({{"text_1", "q"}, {"text_2", {"a", "b"}}}, m_);
  const json out = score_response(r, {0.25f, 0.75f}, "score-1", 1700000000, "reranker");
  EXPECT_EQ(out["object"], "list");
  EXPECT_EQ(out["created"], 1700000000);
  ASSERT_EQ(out["data"].size(), 2u);
  EXPECT_EQ(out["data"][1]["index"], 1);
  EXPECT_EQ(out["data"][1]["object"], "score");
  EXPECT_FLOAT_EQ(out["data"][1]["score"].get<float>(), 0.75f);
  EXPECT_EQ(out["usage"]["prompt_tokens"], total_tokens(r));
}

}  // namespace
}  // namespace pagellm::api
