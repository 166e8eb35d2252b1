#include "api/score_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "api/json_fields.h"
#include "api/utf8_check.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {

using nlohmann::json;

namespace {

const std::string& text_of(const json& v, const std::string& label, const char* field) {
  if (!v.is_string())
    throw InvalidRequest(fmt::format("{} must be a string, got {}", label, json_type_name(v)), field);
  const std::string& s = v.get_ref<const std::string&>();
  require_valid_utf8(s, field);
  return s;
}

// A string, or a non-empty list of strings.
std::vector<std::string> texts_of(const json& body, const char* field) {
  if (!has_field(body, field)) throw InvalidRequest(fmt::format("'{}' is required", field), field);
  const json& v = body[field];
  if (v.is_string()) return {text_of(v, fmt::format("'{}'", field), field)};
  if (!v.is_array())
    throw InvalidRequest(fmt::format("'{}' must be a string or a list of strings, got {}", field, json_type_name(v)),
                         field);
  if (v.empty()) throw InvalidRequest(fmt::format("'{}' must not be an empty list", field), field);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(text_of(v[i], fmt::format("{}[{}]", field, i), field));
  return out;
}

void add_pair(ScoreRequest& req, const ServedModel& m, const std::string& query, const std::string& document,
              size_t index, const char* field) {
  std::vector<int32_t> ids = m.score_format.tokens(*m.tokenizer, query, document);
  if (ids.empty()) throw InvalidRequest(fmt::format("pair {} has no tokens to score", index), field);
  if (static_cast<int64_t>(ids.size()) >= m.max_model_len)
    throw InvalidRequest(fmt::format("pair {} (query and {}[{}]) has {} tokens; this model's maximum context length "
                                     "is {} tokens",
                                     index, field, index, ids.size(), m.max_model_len),
                         field);
  req.prompts.push_back(std::move(ids));
}

}  // namespace

ScoreRequest parse_rerank_request(const json& body, const ServedModel& m) {
  check_model_field(body, m);
  ScoreRequest req;
  if (!has_field(body, "query")) throw InvalidRequest("'query' is required", "query");
  const std::string& query = text_of(body["query"], "'query'", "query");
  if (!has_field(body, "documents")) throw InvalidRequest("'documents' is required", "documents");
  const json& docs = body["documents"];
  if (!docs.is_array())
    throw InvalidRequest(fmt::format("'documents' must be a list, got {}", json_type_name(docs)), "documents");
  if (docs.empty()) throw InvalidRequest("'documents' must not be an empty list", "documents");
  for (size_t i = 0; i < docs.size(); ++i) {
    const json& d = docs[i];
    const std::string label = fmt::format("documents[{}]", i);
    if (d.is_object()) {
      if (!has_field(d, "text"))
        throw InvalidRequest(fmt::format("{} must be a string or an object with 'text'", label), "documents");
      req.documents.push_back(text_of(d["text"], label + ".text", "documents"));
    } else if (d.is_string()) {
      req.documents.push_back(text_of(d, label, "documents"));
    } else {
      throw InvalidRequest(fmt::format("{} must be a string or an object with 'text', got {}", label,
                                       json_type_name(d)),
                           "documents");
    }
  }
  for (size_t i = 0; i < req.documents.size(); ++i) add_pair(req, m, query, req.documents[i], i, "documents");
  req.top_n = static_cast<int32_t>(get_int_field(body, "top_n", 0, 0, INT32_MAX));
  req.return_documents = get_bool_field(body, "return_documents", true);
  return req;
}

ScoreRequest parse_score_request(const json& body, const ServedModel& m) {
  check_model_field(body, m);
  const std::vector<std::string> first = texts_of(body, "text_1");
  const std::vector<std::string> second = texts_of(body, "text_2");
  if (first.size() != 1 && first.size() != second.size())
    throw InvalidRequest(fmt::format("text_1 has {} texts and text_2 {}: give one text_1 for all, or as many as "
                                     "text_2",
                                     first.size(), second.size()),
                         "text_1");
  ScoreRequest req;
  for (size_t i = 0; i < second.size(); ++i)
    add_pair(req, m, first[first.size() == 1 ? 0 : i], second[i], i, "text_2");
  return req;
}

int64_t total_tokens(const ScoreRequest& req) {
  int64_t n = 0;
  for (const auto& p : req.prompts) n += static_cast<int64_t>(p.size());
  return n;
}

json rerank_response(const ScoreRequest& req, const std::vector<float>& scores, const std::string& id,
                     const std::string& model) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  // Best first; equal scores keep the documents' order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  if (req.top_n > 0 && static_cast<size_t>(req.top_n) < order.size()) order.resize(static_cast<size_t>(req.top_n));
  json results = json::array();
  for (size_t i : order) {
    json r = {{"index", i}, {"relevance_score", scores[i]}};
    if (req.return_documents) r["document"] = {{"text", req.documents.at(i)}};
    results.push_back(std::move(r));
  }
  return {{"id", id}, {"model", model}, {"usage", {{"total_tokens", total_tokens(req)}}}, {"results", results}};
}

json score_response(const ScoreRequest& req, const std::vector<float>& scores, const std::string& id,
                    int64_t created, const std::string& model) {
  json data = json::array();
  for (size_t i = 0; i < scores.size(); ++i) data.push_back({{"index", i}, {"object", "score"}, {"score", scores[i]}});
  const int64_t n = total_tokens(req);
  return {{"id", id},
          {"object", "list"},
          {"created", created},
          {"model", model},
          {"data", std::move(data)},
          {"usage", {{"prompt_tokens", n}, {"total_tokens", n}, {"completion_tokens", 0}}}};
}

}  // namespace pagellm::api
