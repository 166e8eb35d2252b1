// The tool fields of a chat request: `tools`, `tool_choice`,
// `parallel_tool_calls`, checked, and what they ask of the rest:
//   - tools go to the chat template (real templates render them);
//   - tool_choice "required" or a named function becomes a grammar (a JSON
//     list of calls, or the function's parameters), so the arguments are
//     always valid JSON for the declared parameters;
//   - "auto" needs the server's --enable-auto-tool-choice and
//     --tool-call-parser (as vLLM), which then finds calls in the output.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat/chat_output.h"
#include "core/request_limits.h"
#include "sampling/sampling_params.h"

namespace pagellm::api {

struct ToolSettings {  // the server's flags
  bool enable_auto_tool_choice = false;
  const chat::ToolParser* parser = nullptr;
  GrammarLimits grammar_limits;  // for each tool's parameter schema
};

struct ChatTools {
  nlohmann::json tools = nullptr;  // for the template; null when the request has none
  chat::ToolMode mode = chat::ToolMode::None;
  std::string named_function;      // Named
  StructuredOutputs grammar;       // Named / Required
};

// Throws InvalidRequest naming the field: tools that are not functions, a
// function without a valid name or whose parameters are not a JSON schema
// (checked by the grammar engine), a tool_choice naming no declared
// function, "auto" without a tool-call parser.
// raw_body (may be empty): the text of `body`, so that parameter schemas keep
// their property order in the grammars (see api/ordered_field.h).
ChatTools parse_tools(const nlohmann::json& body, const ToolSettings& settings, std::string_view raw_body = {});

// Only the checked `tools` (null when none), for rendering a prompt (/tokenize).
nlohmann::json parse_tool_list(const nlohmann::json& body, const GrammarLimits& limits = {});

}  // namespace pagellm::api
