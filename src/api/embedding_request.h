// OpenAI's /v1/embeddings request and response body: `input` as a string, a
// list of strings, a list of token ids or a list of token-id lists;
// `encoding_format` float or base64 (little-endian float32); `dimensions`
// (Matryoshka: the first n values, normalised again). Errors are
// InvalidRequest naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/openai_request.h"

namespace pagellm::api {

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, one list per input
  bool base64 = false;
  std::optional<int32_t> dimensions;
};

// Texts are tokenized with the tokenizer's special tokens (BOS where it adds
// one). An empty list, an input with no tokens, one of max_model_len tokens
// or more, a wrong type: `input`; dimensions outside [1, hidden_size]:
// `dimensions`.
EmbeddingRequest parse_embedding_request(const nlohmann::json& body, const ServedModel& model, int32_t hidden_size);

// The response: {object: list, data: [{object: embedding, index, embedding}],
// model, usage: {prompt_tokens, total_tokens}}.
nlohmann::json embedding_response(const std::vector<std::vector<float>>& vectors, bool base64,
                                  const std::string& model, int64_t prompt_tokens);

// Little-endian float32 bytes in base64 (what OpenAI's clients decode).
std::string floats_to_base64(const std::vector<float>& v);

}  // namespace pagellm::api
