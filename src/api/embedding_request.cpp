#include "api/embedding_request.h"

#include <fmt/format.h>

#include <cstring>

#include "api/json_fields.h"
#include "api/utf8_check.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {

using nlohmann::json;

namespace {

std::vector<int32_t> text_ids(const json& v, const std::string& label, const ServedModel& m) {
  const std::string& text = v.get_ref<const std::string&>();
  require_valid_utf8(text, "input");
  std::vector<int32_t> ids = m.tokenizer->encode(text, true, true);
  if (ids.empty()) throw InvalidRequest(fmt::format("{} is empty (no tokens to embed)", label), "input");
  return ids;
}

}  // namespace

EmbeddingRequest parse_embedding_request(const json& body, const ServedModel& m, int32_t hidden_size) {
  check_model_field(body, m);
  EmbeddingRequest req;
  if (!has_field(body, "input")) throw InvalidRequest("'input' is required", "input");
  const json& input = body["input"];
  if (input.is_string()) {
    req.inputs.push_back(text_ids(input, "'input'", m));
  } else if (input.is_array()) {
    if (input.empty()) throw InvalidRequest("'input' must not be an empty list", "input");
    if (input[0].is_number()) {  // one input as token ids
      req.inputs.push_back(json_to_token_ids(input, "input", "input", m.vocab_size));
    } else {
      for (size_t i = 0; i < input.size(); ++i) {
        const json& item = input[i];
        const std::string label = fmt::format("input[{}]", i);
        if (item.is_string()) {
          req.inputs.push_back(text_ids(item, label, m));
        } else if (item.is_array()) {
          if (item.empty()) throw InvalidRequest(fmt::format("{} must not be an empty list", label), "input");
          req.inputs.push_back(json_to_token_ids(item, label, "input", m.vocab_size));
        } else {
          throw InvalidRequest(fmt::format("{} must be a string or a list of token ids, got {}", label,
                                           json_type_name(item)),
                               "input");
        }
      }
    }
  } else {
    throw InvalidRequest(fmt::format("'input' must be a string, a list of strings, a list of token ids or a list of "
                                     "token-id lists, got {}",
                                     json_type_name(input)),
                         "input");
  }
  for (size_t i = 0; i < req.inputs.size(); ++i)
    if (static_cast<int64_t>(req.inputs[i].size()) >= m.max_model_len)
      throw InvalidRequest(fmt::format("input {} has {} tokens; this model's maximum context length is {} tokens", i,
                                       req.inputs[i].size(), m.max_model_len),
                           "input");
  if (has_field(body, "encoding_format")) {
    const json& f = body["encoding_format"];
    if (!f.is_string() || (f != "float" && f != "base64"))
      throw InvalidRequest("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    req.base64 = f == "base64";
  }
  if (has_field(body, "dimensions"))
    req.dimensions = static_cast<int32_t>(json_to_int(body["dimensions"], "dimensions", "dimensions", 1, hidden_size));
  return req;
}

std::string floats_to_base64(const std::vector<float>& v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<unsigned char>(u >> (8 * b));  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

json embedding_response(const std::vector<std::vector<float>>& vectors, bool base64, const std::string& model,
                        int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i)
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", base64 ? json(floats_to_base64(vectors[i])) : json(vectors[i])}});
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace pagellm::api
