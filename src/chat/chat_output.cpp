#include "chat/chat_output.h"

#include <nlohmann/json.hpp>

namespace pagellm::chat {

ChatOutputStream::ChatOutputStream(const ChatOutputOptions& options) : options_(options) {
  if (options_.reasoning) reasoning_ = options_.reasoning->stream(options_.prompt_ends_in_think);
  if (options_.tools == ToolMode::Auto && options_.tool_parser) tools_ = options_.tool_parser->stream();
}

void ChatOutputStream::content_in(std::string_view text, bool final, ChatDelta& out) {
  const size_t calls_before = out.calls.size();
  switch (options_.tools) {
    case ToolMode::Named:
    case ToolMode::Required:
      forced_.append(text);
      break;
    case ToolMode::Auto:
      if (tools_) {
        ToolParseResult r = tools_->feed(text);
        if (final) r.append(tools_->finish());
        out.content += r.content;
        for (ToolCall& c : r.calls) out.calls.push_back(std::move(c));
        break;
      }
      [[fallthrough]];
    case ToolMode::None:
      out.content.append(text);
      break;
  }
  if (final && options_.tools == ToolMode::Named) {
    // The grammar held the text to the function's parameters; a cut-off text
    // (max_tokens) is passed on as it is, as OpenAI does.
    out.calls.push_back({options_.named_function, forced_});
  } else if (final && options_.tools == ToolMode::Required) {
    const nlohmann::ordered_json list = nlohmann::ordered_json::parse(forced_, nullptr, false);
    bool parsed = list.is_array();
    if (parsed)
      for (const auto& item : list)
        if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) parsed = false;
    if (parsed) {
      for (const auto& item : list) {
        const auto params = item.contains("parameters") ? item["parameters"] : nlohmann::ordered_json::object();
        out.calls.push_back({item["name"].get<std::string>(), params.dump()});
      }
    } else {
      out.content += forced_;  // cut off before the list closed
    }
  }
  num_calls_ += out.calls.size() - calls_before;
}

ChatDelta ChatOutputStream::feed(std::string_view text) {
  ChatDelta out;
  if (reasoning_) {
    ReasoningSplit s = reasoning_->feed(text);
    out.reasoning = std::move(s.reasoning);
    content_in(s.content, false, out);
  } else {
    content_in(text, false, out);
  }
  return out;
}

ChatDelta ChatOutputStream::finish() {
  ChatDelta out;
  std::string rest;
  if (reasoning_) {
    ReasoningSplit s = reasoning_->finish();
    out.reasoning = std::move(s.reasoning);
    rest = std::move(s.content);
  }
  content_in(rest, true, out);
  return out;
}

void ChatDelta::append(ChatDelta&& later) {
  reasoning += later.reasoning;
  content += later.content;
  for (ToolCall& c : later.calls) calls.push_back(std::move(c));
}

ChatDelta parse_chat_output(const ChatOutputOptions& options, std::string_view text) {
  ChatOutputStream s(options);
  ChatDelta d = s.feed(text);
  d.append(s.finish());
  return d;
}

bool prompt_ends_in_think(std::string_view prompt) {
  while (!prompt.empty() && (prompt.back() == '\n' || prompt.back() == ' ')) prompt.remove_suffix(1);
  return prompt.ends_with("<think>");
}

}  // namespace pagellm::chat
