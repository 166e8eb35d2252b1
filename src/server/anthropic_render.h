// A chat turn (server/chat_turn.h) in the shapes of Anthropic's Messages API:
// the message object (content blocks thinking / text / tool_use, stop_reason
// end_turn / max_tokens / stop_sequence / tool_use, usage), the streamed
// events (message_start, content_block_start, content_block_delta with
// text_delta / thinking_delta / input_json_delta, content_block_stop,
// message_delta, message_stop) and the error shape
// {"type": "error", "error": {"type": ..., "message": ...}}. Pure: no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/chat_turn.h"

namespace pagellm::server {

struct AnthropicMeta {
  std::string id;  // msg_...
  std::string model;
  int64_t prompt_tokens = 0;  // usage before the engine reports it (message_start)
};

nlohmann::json anthropic_message(const AnthropicMeta& meta, const ChatTurn& turn);
// null while running.
nlohmann::json anthropic_stop_reason(const ChatTurn& turn);
// Anthropic's error type for an HTTP status (invalid_request_error, authentication_error, ...).
const char* anthropic_error_type(int status);
nlohmann::json anthropic_error_body(int status, const std::string& message);

class AnthropicStream {
 public:
  explicit AnthropicStream(AnthropicMeta meta) : meta_(std::move(meta)) {}
  std::string begin(const ChatTurn& turn);
  std::string add(const std::vector<BlockEvent>& events, const ChatTurn& turn);
  std::string end(const ChatTurn& turn);
  std::string error(int status, const std::string& message);

 private:
  AnthropicMeta meta_;
};

// "event: <type>\ndata: <json>\n\n"
std::string anthropic_event(const nlohmann::json& e);

}  // namespace pagellm::server
