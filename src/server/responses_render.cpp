#include "server/responses_render.h"

#include "api/utf8_check.h"

namespace pagellm::server {

using nlohmann::json;

namespace {

std::string item_id(const TurnBlock& b) {
  switch (b.kind) {
    case TurnBlock::Kind::Reasoning: return "rs_" + b.id;
    case TurnBlock::Kind::Text: return "msg_" + b.id;
    case TurnBlock::Kind::ToolCall: return "fc_" + b.id;
  }
  return b.id;
}

std::string call_id(const TurnBlock& b) { return "call_" + b.id; }

// in_progress while the block is open, else completed (incomplete when the
// turn ran out of tokens).
const char* item_status(const ChatTurn& turn, const TurnBlock& b) {
  if (b.open) return "in_progress";
  return turn.finish() == FinishReason::Length ? "incomplete" : "completed";
}

json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json reasoning_part(const std::string& text) { return {{"type", "reasoning_text"}, {"text", text}}; }

const char* response_status(const ChatTurn& turn) {
  switch (turn.finish()) {
    case FinishReason::None: return "in_progress";
    case FinishReason::Length: return "incomplete";
    case FinishReason::Abort: return "cancelled";
    default: return "completed";
  }
}

}  // namespace

json responses_usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}, {"cache_write_tokens", 0}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json responses_output_item(const ChatTurn& turn, size_t index) {
  const TurnBlock& b = turn.blocks().at(index);
  json item = {{"id", item_id(b)}, {"status", item_status(turn, b)}};
  switch (b.kind) {
    case TurnBlock::Kind::Reasoning:
      item["type"] = "reasoning";
      item["summary"] = json::array();
      item["content"] = b.open ? json::array() : json::array({reasoning_part(b.text)});
      break;
    case TurnBlock::Kind::Text:
      item["type"] = "message";
      item["role"] = "assistant";
      item["content"] = b.open ? json::array() : json::array({text_part(b.text)});
      break;
    case TurnBlock::Kind::ToolCall:
      item["type"] = "function_call";
      item["call_id"] = call_id(b);
      item["name"] = b.name;
      item["arguments"] = b.open ? "" : b.text;
      break;
  }
  return item;
}

json responses_object(const ResponsesMeta& meta, const ChatTurn& turn) {
  json output = json::array();
  for (size_t i = 0; i < turn.blocks().size(); ++i)
    if (!turn.blocks()[i].open) output.push_back(responses_output_item(turn, i));
  const json& e = meta.echo;
  auto echoed = [&](const char* key, json fallback) { return e.contains(key) ? e[key] : fallback; };
  json r = {{"id", meta.id},
            {"object", "response"},
            {"created_at", meta.created},
            {"status", response_status(turn)},
            {"model", meta.model},
            {"output", std::move(output)},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", echoed("instructions", nullptr)},
            {"max_output_tokens", echoed("max_output_tokens", nullptr)},
            {"metadata", echoed("metadata", json::object())},
            {"parallel_tool_calls", echoed("parallel_tool_calls", true)},
            {"previous_response_id", meta.previous_response_id.empty() ? json(nullptr) : json(meta.previous_response_id)},
            {"reasoning", echoed("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
            {"store", meta.store},
            {"temperature", echoed("temperature", 1.0)},
            {"text", echoed("text", json{{"format", {{"type", "text"}}}})},
            {"tool_choice", echoed("tool_choice", "auto")},
            {"tools", echoed("tools", json::array())},
            {"top_p", echoed("top_p", 1.0)},
            {"truncation", "disabled"},
            {"usage", turn.finished() ? responses_usage_json(turn.usage()) : json(nullptr)}};
  if (e.contains("user")) r["user"] = e["user"];
  if (turn.finish() == FinishReason::Length) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return r;
}

json responses_chat_messages(const ChatTurn& turn) {
  json message = {{"role", "assistant"}, {"content", turn.text()}};
  json calls = json::array();
  for (const TurnBlock& b : turn.blocks())
    if (b.kind == TurnBlock::Kind::ToolCall)
      calls.push_back({{"id", call_id(b)}, {"type", "function"}, {"function", {{"name", b.name}, {"arguments", b.text}}}});
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return json::array({std::move(message)});
}

// ---- streaming ----

std::string ResponsesStream::event(json e) {
  e["sequence_number"] = sequence_++;
  const std::string type = e["type"].get<std::string>();
  return "event: " + type + "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponsesStream::begin(const ChatTurn& turn) {
  const json r = responses_object(meta_, turn);
  std::string out = event({{"type", "response.created"}, {"response", r}});
  out += event({{"type", "response.in_progress"}, {"response", r}});
  return out;
}

std::string ResponsesStream::add(const std::vector<BlockEvent>& events, const ChatTurn& turn) {
  std::string out;
  for (const BlockEvent& ev : events) {
    const TurnBlock& b = turn.blocks().at(ev.index);
    const json where = {{"item_id", item_id(b)}, {"output_index", ev.index}};
    auto with = [&](json e) {
      e.update(where);
      return e;
    };
    const bool is_text = b.kind == TurnBlock::Kind::Text;
    const bool is_call = b.kind == TurnBlock::Kind::ToolCall;
    const char* prefix = is_text ? "response.output_text" : "response.reasoning_text";
    switch (ev.type) {
      case BlockEvent::Type::Open: {
        // As it opened: the events are rendered after the turn took the
        // whole output, which may have finished the block already.
        json item = responses_output_item(turn, ev.index);
        item["status"] = "in_progress";
        if (is_call)
          item["arguments"] = "";
        else
          item["content"] = json::array();
        out += event({{"type", "response.output_item.added"}, {"output_index", ev.index}, {"item", std::move(item)}});
        if (!is_call)
          out += event(with({{"type", "response.content_part.added"},
                             {"content_index", 0},
                             {"part", is_text ? text_part("") : reasoning_part("")}}));
        break;
      }
      case BlockEvent::Type::Append:
        if (is_call)
          out += event(with({{"type", "response.function_call_arguments.delta"}, {"delta", ev.text}}));
        else if (is_text)
          out += event(with({{"type", "response.output_text.delta"},
                             {"content_index", 0},
                             {"delta", ev.text},
                             {"logprobs", json::array()}}));
        else
          out += event(with({{"type", "response.reasoning_text.delta"}, {"content_index", 0}, {"delta", ev.text}}));
        break;
      case BlockEvent::Type::Close:
        if (is_call) {
          out += event(with(
              {{"type", "response.function_call_arguments.done"}, {"arguments", b.text}, {"name", b.name}}));
        } else {
          json done = {{"type", std::string(prefix) + ".done"}, {"content_index", 0}, {"text", b.text}};
          if (is_text) done["logprobs"] = json::array();
          out += event(with(std::move(done)));
          out += event(with({{"type", "response.content_part.done"},
                             {"content_index", 0},
                             {"part", is_text ? text_part(b.text) : reasoning_part(b.text)}}));
        }
        out += event({{"type", "response.output_item.done"},
                      {"output_index", ev.index},
                      {"item", responses_output_item(turn, ev.index)}});
        break;
    }
  }
  return out;
}

std::string ResponsesStream::end(const ChatTurn& turn) {
  const char* type = turn.finish() == FinishReason::Length ? "response.incomplete" : "response.completed";
  return event({{"type", type}, {"response", responses_object(meta_, turn)}});
}

std::string ResponsesStream::error(const std::string& message, const std::string& code, const std::string& param) {
  return event({{"type", "error"},
                {"message", message},
                {"code", code.empty() ? json(nullptr) : json(code)},
                {"param", param.empty() ? json(nullptr) : json(param)}});
}

}  // namespace pagellm::server
