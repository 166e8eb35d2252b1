// Score requests (--task score) and their responses, in the two shapes
// vLLM serves:
//  /v1/rerank, /rerank, /v2/rerank (Jina / Cohere): {model, query, documents: [string |
//    {"text": string}], top_n?, return_documents?} -> {id, model, usage:
//    {total_tokens}, results: [{index, relevance_score, document?: {text}}]}
//    sorted by score, best first;
//  /v1/score, /score: {model, text_1: string | [string], text_2: string |
//    [string]} (one text_1 against every text_2, or pairwise) -> {id,
//    object: list, created, model, data: [{index, object: score, score}],
//    usage}.
// Each (query, document) pair becomes one prompt through the model's
// ScoreFormat. Errors are InvalidRequest naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/openai_request.h"

namespace pagellm::api {

struct ScoreRequest {
  std::vector<std::vector<int32_t>> prompts;  // one per pair, in the response's index order
  // Rerank: the documents' texts (returned with return_documents), top_n
  // (0: all) and whether to return them.
  std::vector<std::string> documents;
  int32_t top_n = 0;
  bool return_documents = true;
};

// An empty or missing query / documents list, a document that is neither a
// string nor {"text": string}, a pair of max_model_len tokens or more: 400
// naming the field.
ScoreRequest parse_rerank_request(const nlohmann::json& body, const ServedModel& model);
// text_1 of one text is scored against every text_2; lists of equal length
// pair up; anything else is a 400 naming text_1 or text_2.
ScoreRequest parse_score_request(const nlohmann::json& body, const ServedModel& model);

int64_t total_tokens(const ScoreRequest& req);

// scores[i] is prompt i's.
nlohmann::json rerank_response(const ScoreRequest& req, const std::vector<float>& scores, const std::string& id,
                               const std::string& model);
nlohmann::json score_response(const ScoreRequest& req, const std::vector<float>& scores, const std::string& id,
                              int64_t created, const std::string& model);

}  // namespace pagellm::api
