// Anthropic Messages API request bodies (POST /v1/messages) -> the equivalent
// chat completions body, parsed by parse_chat_request like any chat request.
//   system               a string or text blocks: a system message first
//   messages             role user/assistant; content a string or blocks:
//                        text, tool_use (assistant: a tool call, input an
//                        object), tool_result (user: a role "tool" message;
//                        content a string or text blocks); thinking blocks
//                        are left out of the prompt
//   max_tokens           required, as Anthropic requires it
//   stop_sequences       stop
//   temperature, top_p, top_k (and, as extensions, chat completions' seed,
//                        min_p, penalties, ignore_eos, min_tokens,
//                        chat_template_kwargs)
//   tools                {name, description, input_schema}; server tools
//                        (web_search_..., bash_..., ...) are refused by name
//   tool_choice          auto / any (required) / tool (named) / none;
//                        disable_parallel_tool_use
//   thinking             {"type": "enabled" | "disabled"} -> the templates'
//                        enable_thinking
// Every refusal is an InvalidRequest naming the Messages field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/openai_request.h"

namespace pagellm::api {

struct AnthropicRequest {
  nlohmann::ordered_json chat_body;
  std::string chat_body_text;
  bool stream = false;
};

AnthropicRequest parse_anthropic_request(const nlohmann::json& body, std::string_view raw);

// parse_chat_request on the translated body, with errors naming the Messages
// fields (stop_sequences, input_schema, ...).
GenerationRequest parse_anthropic_chat(const AnthropicRequest& r, const ServedModel& m);

}  // namespace pagellm::api
