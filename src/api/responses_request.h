// OpenAI Responses API request bodies (POST /v1/responses) -> the equivalent
// chat completions body, which then goes through parse_chat_request like any
// chat request (template, tools, structured outputs, sampling): one
// generation path for every API.
//   input                 a string (one user message) or a list of items:
//                         messages (role user/system/developer/assistant,
//                         content a string or input_text/output_text parts),
//                         function_call and function_call_output items;
//                         reasoning items are accepted and left out of the
//                         prompt (as chat templates drop past thinking)
//   instructions          a system message first (not carried over by
//                         previous_response_id, as OpenAI does)
//   max_output_tokens     max_tokens
//   tools, tool_choice    function tools in Responses' flat shape; built-in
//                         tools (web_search, file_search, ...) are refused by name
//   text.format           json_schema / json_object -> response_format
//   previous_response_id  the stored conversation before this input
// Every refusal is an InvalidRequest naming the Responses field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "api/openai_request.h"

namespace pagellm::api {

struct ResponsesRequest {
  // The equivalent chat completions body (key order kept: schemas in it
  // keep their property order), and its text for parse_chat_request.
  nlohmann::ordered_json chat_body;
  std::string chat_body_text;
  // The messages of the conversation so far without the instructions (the
  // stored history plus this input), for the response store.
  nlohmann::json conversation = nlohmann::json::array();
  // This request's input as Responses items (GET .../input_items), oldest
  // first, string contents as text parts; without ids (the server adds them).
  nlohmann::json input_items = nlohmann::json::array();
  bool stream = false;
  bool store = true;
  std::string previous_response_id;  // empty: none
  // What the response object echoes back (instructions, tools, tool_choice,
  // temperature, top_p, max_output_tokens, parallel_tool_calls, metadata,
  // text, user, ...), in Responses' own shapes.
  nlohmann::json echo = nlohmann::json::object();
};

// previous_response_id, checked (a non-empty string), or "" when absent.
std::string read_previous_response_id(const nlohmann::json& body);

// body: the parsed request; raw: its text (for key order). history: the
// chat messages of previous_response_id's conversation (empty when none).
ResponsesRequest parse_responses_request(const nlohmann::json& body, std::string_view raw,
                                         const nlohmann::json& history = nlohmann::json::array());

// parse_chat_request on the translated body, with errors that name the
// Responses fields (max_output_tokens, input, text.format, ...).
GenerationRequest parse_responses_chat(const ResponsesRequest& r, const ServedModel& m);

}  // namespace pagellm::api
