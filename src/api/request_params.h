// OpenAI / vLLM request fields -> SamplingParams, with the field's name on
// every error (the server turns InvalidRequest into a 400 with `param`). Used
// by the HTTP server and by `pagellm generate --batch`.
#pragma once

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"

namespace pagellm {

struct ParsedParams {
  SamplingParams sampling;
  int32_t priority = 0;
};

// Reads the sampling / stopping fields of a completions (chat = false) or chat
// completions (chat = true) request body. Fields we do not know are ignored;
// wrong types and out-of-range values throw InvalidRequest naming the field.
// default_max_tokens applies when the request names none.
ParsedParams parse_request_params(const nlohmann::json& body, bool chat, int32_t vocab_size,
                                  int32_t default_max_tokens);

}  // namespace pagellm
