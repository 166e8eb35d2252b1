#include "server/anthropic_render.h"

#include <variant>

namespace pagellm::server {

using nlohmann::json;

namespace {

std::string tool_use_id(const TurnBlock& b) { return "toolu_" + b.id; }

json tool_input(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, false);
  return input.is_object() ? input : json::object();
}

// The block as it starts (empty) or as it ended.
json block_json(const TurnBlock& b, bool started) {
  switch (b.kind) {
    case TurnBlock::Kind::Reasoning:
      return {{"type", "thinking"}, {"thinking", started ? "" : b.text}, {"signature", ""}};
    case TurnBlock::Kind::Text: return {{"type", "text"}, {"text", started ? "" : b.text}};
    case TurnBlock::Kind::ToolCall:
      return {{"type", "tool_use"},
              {"id", tool_use_id(b)},
              {"name", b.name},
              {"input", started ? json::object() : tool_input(b.text)}};
  }
  return nullptr;
}

json usage_json(const AnthropicMeta& meta, const ChatTurn& turn) {
  // Anthropic counts cache reads apart from input_tokens.
  const Usage& u = turn.usage();
  const int64_t prompt = u.prompt_tokens > 0 ? u.prompt_tokens : meta.prompt_tokens;
  return {{"input_tokens", prompt - u.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.completion_tokens}};
}

json stop_sequence_json(const ChatTurn& turn) {
  if (const auto* s = std::get_if<std::string>(&turn.stop_reason())) return *s;
  return nullptr;
}

}  // namespace

std::string anthropic_event(const json& e) {
  return "event: " + e["type"].get<std::string>() + "\ndata: " +
         e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json anthropic_stop_reason(const ChatTurn& turn) {
  switch (turn.finish()) {
    case FinishReason::None: return nullptr;
    case FinishReason::Length: return "max_tokens";
    default: break;
  }
  if (turn.has_calls()) return "tool_use";
  if (std::holds_alternative<std::string>(turn.stop_reason())) return "stop_sequence";
  return "end_turn";
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error_body(int status, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

json anthropic_message(const AnthropicMeta& meta, const ChatTurn& turn) {
  json content = json::array();
  for (const TurnBlock& b : turn.blocks())
    if (!b.open) content.push_back(block_json(b, false));
  return {{"id", meta.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", meta.model},
          {"content", std::move(content)},
          {"stop_reason", anthropic_stop_reason(turn)},
          {"stop_sequence", stop_sequence_json(turn)},
          {"usage", usage_json(meta, turn)}};
}

// ---- streaming ----

std::string AnthropicStream::begin(const ChatTurn& turn) {
  json message = anthropic_message(meta_, turn);
  message["content"] = json::array();
  // Anthropic's own streams send a ping after message_start; clients skip it.
  return anthropic_event({{"type", "message_start"}, {"message", std::move(message)}}) +
         anthropic_event({{"type", "ping"}});
}

std::string AnthropicStream::add(const std::vector<BlockEvent>& events, const ChatTurn& turn) {
  std::string out;
  for (const BlockEvent& ev : events) {
    const TurnBlock& b = turn.blocks().at(ev.index);
    switch (ev.type) {
      case BlockEvent::Type::Open:
        out += anthropic_event(
            {{"type", "content_block_start"}, {"index", ev.index}, {"content_block", block_json(b, true)}});
        break;
      case BlockEvent::Type::Append: {
        json delta;
        if (b.kind == TurnBlock::Kind::Text)
          delta = {{"type", "text_delta"}, {"text", ev.text}};
        else if (b.kind == TurnBlock::Kind::Reasoning)
          delta = {{"type", "thinking_delta"}, {"thinking", ev.text}};
        else
          delta = {{"type", "input_json_delta"}, {"partial_json", ev.text}};
        out += anthropic_event({{"type", "content_block_delta"}, {"index", ev.index}, {"delta", std::move(delta)}});
        break;
      }
      case BlockEvent::Type::Close:
        out += anthropic_event({{"type", "content_block_stop"}, {"index", ev.index}});
        break;
    }
  }
  return out;
}

std::string AnthropicStream::end(const ChatTurn& turn) {
  return anthropic_event({{"type", "message_delta"},
                          {"delta", {{"stop_reason", anthropic_stop_reason(turn)},
                                     {"stop_sequence", stop_sequence_json(turn)}}},
                          {"usage", usage_json(meta_, turn)}}) +
         anthropic_event({{"type", "message_stop"}});
}

std::string AnthropicStream::error(int status, const std::string& message) {
  return anthropic_event(anthropic_error_body(status, message));
}

}  // namespace pagellm::server
