// OpenAI / vLLM request fields -> SamplingParams, with the field's name on
// every error (the server turns InvalidRequest into a 400 with `param`). Used
// by the HTTP server and by `pagellm generate --batch`.
#pragma once

#include <nlohmann/json.hpp>

#include "core/request_limits.h"
#include "sampling/sampling_params.h"

namespace pagellm {

struct ParsedParams {
  SamplingParams sampling;
  int32_t priority = 0;
  // Completions with echo and max_tokens 0 (log-likelihood scoring): the
  // reply shows the prompt alone. The engine still samples one token
  // (sampling.max_tokens is 1), which the reply leaves out.
  bool prompt_only = false;
};

// Reads the sampling / stopping fields of a completions (chat = false) or chat
// completions (chat = true) request body. Fields we do not know are ignored;
// wrong types and values out of range (exactly: see api/json_fields.h) throw
// InvalidRequest naming the field. Token ids must be in [0, vocab_size).
// default_max_tokens applies when the request names none.
ParsedParams parse_request_params(const nlohmann::json& body, bool chat, int32_t vocab_size,
                                  int32_t default_max_tokens, const RequestLimits& limits = {});

// A logit_bias key: a canonical non-negative decimal ("0", "15"; not " 5",
// "+5", "05", "5.0"), or -1 when it is not one.
int64_t parse_token_id_key(const std::string& key);

}  // namespace pagellm
