#include "api/anthropic_request.h"

#include <fmt/format.h>

#include "api/chat_translation.h"
#include "api/json_fields.h"
#include "api/ordered_field.h"
#include "api/utf8_check.h"
#include "core/error.h"

namespace pagellm::api {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string block_type(const json& block, const std::string& where, const char* param) {
  if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
    throw InvalidRequest(fmt::format("{} must be an object with a 'type'", where), param);
  return block["type"].get<std::string>();
}

std::string string_field(const json& obj, const char* key, const std::string& where, const char* param) {
  if (!obj.contains(key) || !obj[key].is_string())
    throw InvalidRequest(fmt::format("{} needs a string '{}'", where, key), param);
  require_valid_utf8(obj[key].get_ref<const std::string&>(), param);
  return obj[key].get<std::string>();
}

// A string, or a list of text blocks joined by newlines.
std::string text_content(const json& content, const std::string& where, const char* param) {
  if (content.is_string()) {
    require_valid_utf8(content.get_ref<const std::string&>(), param);
    return content.get<std::string>();
  }
  if (!content.is_array())
    throw InvalidRequest(fmt::format("{} must be a string or a list of text blocks", where), param);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = block_type(content[i], at, param);
    if (type != "text")
      throw InvalidRequest(fmt::format("{}: blocks of type '{}' are not supported here (text only)", at,
                                       cut_for_message(type)), param);
    if (!out.empty()) out += '\n';
    out += string_field(content[i], "text", at, param);
  }
  return out;
}

// One Anthropic message -> chat messages: tool results become role "tool"
// messages (before the user's own text, which answers after them).
void add_message(const json& msg, size_t index, json& out) {
  const std::string where = fmt::format("messages[{}]", index);
  if (!msg.is_object()) throw InvalidRequest(fmt::format("{} must be an object", where), "messages");
  const std::string role = string_field(msg, "role", where, "messages");
  if (role != "user" && role != "assistant")
    throw InvalidRequest(fmt::format("{}.role must be user or assistant, not '{}'", where, cut_for_message(role)),
                         "messages");
  if (!msg.contains("content")) throw InvalidRequest(fmt::format("{} needs 'content'", where), "messages");
  const json& content = msg["content"];
  if (content.is_string()) {
    require_valid_utf8(content.get_ref<const std::string&>(), "messages");
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array())
    throw InvalidRequest(fmt::format("{}.content must be a string or a list of content blocks", where), "messages");
  std::string text;
  json calls = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = fmt::format("{}.content[{}]", where, i);
    const json& block = content[i];
    const std::string type = block_type(block, at, "messages");
    if (type == "text") {
      if (!text.empty()) text += '\n';
      text += string_field(block, "text", at, "messages");
    } else if (type == "tool_use") {
      if (role != "assistant")
        throw InvalidRequest(fmt::format("{}: tool_use blocks belong to assistant messages", at), "messages");
      if (!block.contains("input") || !block["input"].is_object())
        throw InvalidRequest(fmt::format("{}.input must be an object", at), "messages");
      calls.push_back({{"id", string_field(block, "id", at, "messages")},
                       {"type", "function"},
                       {"function", {{"name", string_field(block, "name", at, "messages")},
                                     {"arguments", block["input"].dump()}}}});
    } else if (type == "tool_result") {
      if (role != "user")
        throw InvalidRequest(fmt::format("{}: tool_result blocks belong to user messages", at), "messages");
      std::string result = block.contains("content") && !block["content"].is_null()
                               ? text_content(block["content"], at + ".content", "messages")
                               : "";
      if (block.contains("is_error") && block["is_error"] == true) result = "Error: " + result;
      out.push_back(
          {{"role", "tool"}, {"tool_call_id", string_field(block, "tool_use_id", at, "messages")}, {"content", result}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;  // past thinking stays out of the prompt, as chat templates drop it
    } else {
      throw InvalidRequest(fmt::format("{}: content blocks of type '{}' are not supported (text, tool_use, "
                                       "tool_result, thinking)", at, cut_for_message(type)), "messages");
    }
  }
  if (!calls.empty()) {
    out.push_back({{"role", "assistant"}, {"content", text}, {"tool_calls", std::move(calls)}});
  } else if (!text.empty() || role == "assistant" || content.empty()) {
    out.push_back({{"role", role}, {"content", text}});
  }
}

ordered_json translate_tools(const json& body, std::string_view raw) {
  const json& tools = body["tools"];
  if (!tools.is_array()) throw InvalidRequest("'tools' must be a list", "tools");
  const auto ordered = ordered_field(body, raw, {"tools"});
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) throw InvalidRequest(fmt::format("{} must be an object", at), "tools");
    if (has_field(t, "type")) {
      if (!t["type"].is_string()) throw InvalidRequest(fmt::format("{}.type must be a string", at), "tools");
      const std::string type = t["type"].get<std::string>();
      if (type != "custom")
        throw InvalidRequest(fmt::format("{}: the server tool '{}' is not supported by this server; only client "
                                         "tools with an input_schema are", at, cut_for_message(type)), "tools");
    }
    if (!has_field(t, "input_schema") || !t["input_schema"].is_object())
      throw InvalidRequest(fmt::format("{} needs an 'input_schema' object", at), "tools");
    ordered_json f = ordered_json::object();
    f["name"] = t.contains("name") ? to_ordered(t["name"]) : ordered_json();
    if (has_field(t, "description")) f["description"] = to_ordered(t["description"]);
    const bool keep_order = ordered && ordered->is_array() && i < ordered->size() && (*ordered)[i].is_object() &&
                            (*ordered)[i].contains("input_schema");
    f["parameters"] = keep_order ? (*ordered)[i]["input_schema"] : to_ordered(t["input_schema"]);
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

void translate_tool_choice(const json& tc, ordered_json& chat) {
  const char* shape = "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", "
                      "\"name\": ...}";
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string()) throw InvalidRequest(shape, "tool_choice");
  const std::string type = tc["type"].get<std::string>();
  if (type == "auto" || type == "none") {
    chat["tool_choice"] = type;
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    if (!tc.contains("name") || !tc["name"].is_string())
      throw InvalidRequest("'tool_choice' of type tool needs a string 'name'", "tool_choice");
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"].get<std::string>()}}}};
  } else {
    throw InvalidRequest(shape, "tool_choice");
  }
  if (has_field(tc, "disable_parallel_tool_use"))
    chat["parallel_tool_calls"] = !get_bool_field(tc, "disable_parallel_tool_use", false);
}

}  // namespace

AnthropicRequest parse_anthropic_request(const json& body, std::string_view raw) {
  AnthropicRequest r;
  for (const char* key : {"mcp_servers", "container"})
    if (has_field(body, key)) throw InvalidRequest(fmt::format("'{}' is not supported by this server", key), key);
  if (!has_field(body, "max_tokens")) throw InvalidRequest("'max_tokens' is required", "max_tokens");
  r.stream = get_bool_field(body, "stream", false);

  ordered_json& chat = r.chat_body;
  chat = ordered_json::object();
  json messages = json::array();
  if (has_field(body, "system")) {
    const std::string system = text_content(body["system"], "'system'", "system");
    messages.push_back({{"role", "system"}, {"content", system}});
  }
  if (!has_field(body, "messages")) throw InvalidRequest("'messages' is required", "messages");
  const json& in = body["messages"];
  if (!in.is_array()) throw InvalidRequest("'messages' must be a list of messages", "messages");
  if (in.empty()) throw InvalidRequest("'messages' must not be empty", "messages");
  for (size_t i = 0; i < in.size(); ++i) add_message(in[i], i, messages);
  chat["messages"] = to_ordered(messages);

  chat["max_tokens"] = to_ordered(body["max_tokens"]);
  if (has_field(body, "stop_sequences")) {
    if (!body["stop_sequences"].is_array())
      throw InvalidRequest("'stop_sequences' must be a list of strings", "stop_sequences");
    chat["stop"] = to_ordered(body["stop_sequences"]);
  }
  // Anthropic's sampling fields, then chat completions' (vLLM's) as extensions.
  for (const char* key : {"temperature", "top_p", "top_k", "seed", "min_p", "presence_penalty", "frequency_penalty",
                          "repetition_penalty", "ignore_eos", "min_tokens", "priority", "chat_template_kwargs"})
    if (has_field(body, key)) chat[key] = to_ordered(body[key]);
  if (has_field(body, "tools")) chat["tools"] = translate_tools(body, raw);
  if (has_field(body, "tool_choice")) translate_tool_choice(body["tool_choice"], chat);
  if (has_field(body, "thinking")) {
    const json& t = body["thinking"];
    if (!t.is_object() || !t.contains("type") || !(t["type"] == "enabled" || t["type"] == "disabled" ||
                                                     t["type"] == "adaptive"))
      throw InvalidRequest("'thinking' must be {\"type\": \"enabled\" | \"disabled\"}", "thinking");
    if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = ordered_json::object();
    // (a kwargs that is no object stays, for the chat parser's 400)
    if (chat["chat_template_kwargs"].is_object())
      chat["chat_template_kwargs"]["enable_thinking"] = t["type"] != "disabled";
  }
  r.chat_body_text = chat.dump();
  return r;
}

GenerationRequest parse_anthropic_chat(const AnthropicRequest& r, const ServedModel& m) {
  static const FieldRenames renames = {
      {{"stop", "stop_sequences"}},
      {{"].function.parameters", "].input_schema"},
       {"): parameters: ", "): input_schema: "},
       {"].function.name", "].name"}}};
  return parse_translated_chat(r.chat_body_text, m, renames);
}

}  // namespace pagellm::api
