// A chat turn (server/chat_turn.h) in the shapes of OpenAI's Responses API:
// the response object with its output items (reasoning, message,
// function_call), and the streamed events, each with its sequence_number:
//   response.created, response.in_progress,
//   per item: response.output_item.added, then
//     message:   response.content_part.added, response.output_text.delta...,
//                response.output_text.done, response.content_part.done
//     reasoning: the same with reasoning_text parts and response.reasoning_text.*
//     call:      response.function_call_arguments.delta / .done
//   response.output_item.done;
//   response.completed (response.incomplete when max_output_tokens ran out).
// Pure: no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/chat_turn.h"

namespace pagellm::server {

struct ResponsesMeta {
  std::string id;       // resp_...
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool store = true;
  std::string previous_response_id;
  nlohmann::json echo = nlohmann::json::object();  // request fields the object repeats
};

// The response object; while the turn runs: status in_progress and the
// items finished so far.
nlohmann::json responses_object(const ResponsesMeta& meta, const ChatTurn& turn);
nlohmann::json responses_usage_json(const Usage& u);
// Block i of the turn as an output item.
nlohmann::json responses_output_item(const ChatTurn& turn, size_t index);
// The turn as chat messages (content and tool calls, with the call ids the
// items carry), for the conversation store.
nlohmann::json responses_chat_messages(const ChatTurn& turn);

class ResponsesStream {
 public:
  explicit ResponsesStream(ResponsesMeta meta) : meta_(std::move(meta)) {}
  std::string begin(const ChatTurn& turn);
  std::string add(const std::vector<BlockEvent>& events, const ChatTurn& turn);
  std::string end(const ChatTurn& turn);
  // An error event (the request failed after the stream began).
  std::string error(const std::string& message, const std::string& code, const std::string& param);

 private:
  std::string event(nlohmann::json e);
  ResponsesMeta meta_;
  int64_t sequence_ = 0;
};

}  // namespace pagellm::server
