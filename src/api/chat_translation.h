// Shared by the APIs that are translated into a chat completions request
// (api/responses_request.h, api/anthropic_request.h): the translated body
// goes through parse_chat_request, and its errors are told in the words of
// the API the client speaks (max_output_tokens, not max_tokens).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/openai_request.h"

namespace pagellm::api {

struct FieldRenames {
  // chat field -> the client's field: the error's param, and the field's
  // quoted name ('max_tokens') in its message.
  std::vector<std::pair<std::string, std::string>> params;
  // Other wording in messages (e.g. "].function.parameters" -> "].input_schema").
  std::vector<std::pair<std::string, std::string>> phrases;
};

nlohmann::ordered_json to_ordered(const nlohmann::json& j);

// parse_chat_request on a translated body (its text: key order kept);
// InvalidRequest and template errors come back renamed.
GenerationRequest parse_translated_chat(const std::string& chat_body_text, const ServedModel& m,
                                        const FieldRenames& renames);

}  // namespace pagellm::api
