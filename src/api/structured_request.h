// The structured-output fields of a request -> one StructuredOutputs:
//   response_format      {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}
//   structured_outputs   vLLM's object: json | regex | choice | grammar | json_object |
//                        structural_tag (exactly one), disable_any_whitespace
//   guided_json, guided_regex, guided_choice, guided_grammar    vLLM's older fields
//   guided_decoding_backend, guided_whitespace_pattern          accepted (one backend: xgrammar)
// At most one constraint per request. The grammar is checked here (no
// vocabulary needed), so a bad one is a 400 naming its field before anything
// reaches the engine.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/request_limits.h"
#include "sampling/sampling_params.h"

namespace pagellm::api {

// Throws InvalidRequest naming the field. Kind None when the request has none.
// raw_body: the text `body` was parsed from. nlohmann::json sorts object keys,
// but a schema's property order is the order the model must write them in
// (pydantic's field order), so with the raw text a schema keeps its order.
StructuredOutputs parse_structured_outputs(const nlohmann::json& body, const GrammarLimits& limits,
                                           std::string_view raw_body = {});

}  // namespace pagellm::api
