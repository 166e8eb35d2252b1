#include "api/responses_request.h"

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

// Built-in tools of the Responses API that a local server cannot run.
bool is_builtin_tool(const std::string& type) { return type != "function"; }

std::string text_of_parts(const json& content, const std::string& where) {
  if (content.is_string()) {
    require_valid_utf8(content.get_ref<const std::string&>(), "input");
    return content.get<std::string>();
  }
  if (!content.is_array())
    throw InvalidRequest(fmt::format("{}.content must be a string or a list of content parts", where), "input");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}.content[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw InvalidRequest(fmt::format("{} must be an object with a 'type'", at), "input");
    const std::string type = part["type"].get<std::string>();
    if (type != "input_text" && type != "output_text" && type != "text")
      throw InvalidRequest(fmt::format("{}: content parts of type '{}' are not supported (input_text and output_text "
                                       "only)", at, cut_for_message(type)), "input");
    if (!part.contains("text") || !part["text"].is_string())
      throw InvalidRequest(fmt::format("{} needs a string 'text'", at), "input");
    require_valid_utf8(part["text"].get_ref<const std::string&>(), "input");
    if (!out.empty()) out += '\n';
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string required_string(const json& item, const char* key, const std::string& where) {
  if (!item.contains(key) || !item[key].is_string())
    throw InvalidRequest(fmt::format("{} needs a string '{}'", where, key), "input");
  require_valid_utf8(item[key].get_ref<const std::string&>(), "input");
  return item[key].get<std::string>();
}

// One input item -> chat messages appended to `messages`.
void add_item(const json& item, size_t index, json& messages) {
  const std::string where = fmt::format("input[{}]", index);
  if (!item.is_object()) throw InvalidRequest(fmt::format("{} must be an object", where), "input");
  std::string type = "message";  // EasyInputMessage: {role, content} without a type
  if (item.contains("type")) {
    if (!item["type"].is_string()) throw InvalidRequest(fmt::format("{}.type must be a string", where), "input");
    type = item["type"].get<std::string>();
  }
  if (type == "message") {
    const std::string role = required_string(item, "role", where);
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      throw InvalidRequest(fmt::format("{}.role '{}' is not one of user, system, developer, assistant", where,
                                       cut_for_message(role)), "input");
    if (!item.contains("content")) throw InvalidRequest(fmt::format("{} needs 'content'", where), "input");
    // Chat templates know "system"; "developer" is its newer name.
    messages.push_back({{"role", role == "developer" ? "system" : role},
                        {"content", text_of_parts(item["content"], where)}});
    return;
  }
  if (type == "function_call") {
    const std::string call_id = required_string(item, "call_id", where);
    json call = {{"id", call_id},
                 {"type", "function"},
                 {"function", {{"name", required_string(item, "name", where)},
                               {"arguments", required_string(item, "arguments", where)}}}};
    // Calls that follow an assistant message (or each other) belong to it.
    if (!messages.empty() && messages.back()["role"] == "assistant") {
      json& last = messages.back();
      if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
      last["tool_calls"].push_back(std::move(call));
    } else {
      messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({std::move(call)})}});
    }
    return;
  }
  if (type == "function_call_output") {
    const std::string call_id = required_string(item, "call_id", where);
    if (!item.contains("output")) throw InvalidRequest(fmt::format("{} needs 'output'", where), "input");
    messages.push_back(
        {{"role", "tool"}, {"tool_call_id", call_id}, {"content", text_of_parts(item["output"], where + ".output")}});
    return;
  }
  if (type == "reasoning") return;  // past thinking stays out of the prompt
  throw InvalidRequest(fmt::format("{}: items of type '{}' are not supported (message, function_call, "
                                   "function_call_output and reasoning are)", where, cut_for_message(type)), "input");
}

// An input item as GET /v1/responses/{id}/input_items lists it: a message's
// string content as one text part, a type and a status on every item (the
// server adds ids).
json listed_input_item(const json& item) {
  json out = item;
  if (!out.contains("type")) out["type"] = "message";
  if (out["type"] == "message" && out.contains("content") && out["content"].is_string()) {
    const bool assistant = out.value("role", "") == "assistant";
    json part = {{"type", assistant ? "output_text" : "input_text"}, {"text", out["content"]}};
    if (assistant) part["annotations"] = json::array();
    out["content"] = json::array({std::move(part)});
  }
  if (!out.contains("status")) out["status"] = "completed";
  return out;
}

// Responses' flat function tools -> chat's {"type": "function", "function": {...}}.
ordered_json translate_tools(const json& body, std::string_view raw) {
  const json& tools = body["tools"];
  if (!tools.is_array()) throw InvalidRequest("'tools' must be a list", "tools");
  const auto ordered = ordered_field(body, raw, {"tools"});
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      throw InvalidRequest(fmt::format("tools[{}] must be an object with a 'type'", i), "tools");
    const std::string type = t["type"].get<std::string>();
    if (is_builtin_tool(type))
      throw InvalidRequest(fmt::format("tools[{}]: the built-in tool '{}' is not supported by this server; only "
                                       "function tools are", i, cut_for_message(type)), "tools");
    ordered_json f = ordered_json::object();
    if (t.contains("name")) f["name"] = to_ordered(t["name"]);
    if (has_field(t, "description")) f["description"] = to_ordered(t["description"]);
    if (has_field(t, "parameters")) {
      const bool keep_order = ordered && ordered->is_array() && i < ordered->size() && (*ordered)[i].is_object() &&
                              (*ordered)[i].contains("parameters");
      f["parameters"] = keep_order ? (*ordered)[i]["parameters"] : to_ordered(t["parameters"]);
    }
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

ordered_json translate_tool_choice(const json& tc) {
  if (tc.is_string()) return tc.get<std::string>();  // none / auto / required: checked by the chat parser
  if (tc.is_object() && tc.contains("type") && tc["type"] == "function") {
    if (!tc.contains("name") || !tc["name"].is_string())
      throw InvalidRequest("'tool_choice' of type function needs a string 'name'", "tool_choice");
    return {{"type", "function"}, {"function", {{"name", tc["name"].get<std::string>()}}}};
  }
  if (tc.is_object() && tc.contains("type") && tc["type"].is_string())
    throw InvalidRequest(fmt::format("'tool_choice' of type '{}' is not supported (none, auto, required or a "
                                     "function)", cut_for_message(tc["type"].get<std::string>())), "tool_choice");
  throw InvalidRequest("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
                       "tool_choice");
}

// text.format -> response_format.
void translate_text_format(const json& body, std::string_view raw, ordered_json& chat) {
  const json& text = body["text"];
  if (!text.is_object()) throw InvalidRequest("'text' must be an object", "text");
  if (!has_field(text, "format")) return;
  const json& f = text["format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    throw InvalidRequest("'text.format' must be an object with a 'type'", "text.format");
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return;
  if (type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
    return;
  }
  if (type != "json_schema")
    throw InvalidRequest(fmt::format("'text.format' type '{}' is not supported (text, json_object or json_schema)",
                                     cut_for_message(type)), "text.format");
  if (!has_field(f, "schema")) throw InvalidRequest("'text.format' of type json_schema needs a 'schema'", "text.format");
  const auto ordered = ordered_field(body, raw, {"text", "format", "schema"});
  ordered_json js = {{"name", f.value("name", json("response")).is_string() ? f.value("name", "response") : "response"},
                     {"schema", ordered ? *ordered : to_ordered(f["schema"])}};
  chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

// Sampling fields that mean the same in both APIs (the vLLM extras included).
constexpr const char* kSamplingFields[] = {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                           "frequency_penalty", "repetition_penalty", "stop", "logit_bias",
                                           "ignore_eos", "min_tokens", "parallel_tool_calls", "user", "priority",
                                           "chat_template_kwargs"};

}  // namespace

std::string read_previous_response_id(const json& body) {
  if (!has_field(body, "previous_response_id")) return "";
  const json& v = body["previous_response_id"];
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    throw InvalidRequest("'previous_response_id' must be a non-empty string", "previous_response_id");
  return v.get<std::string>();
}

ResponsesRequest parse_responses_request(const json& body, std::string_view raw, const json& history) {
  ResponsesRequest r;
  for (const char* key : {"background", "conversation", "prompt"})
    if (has_field(body, key) && !(body[key].is_boolean() && !body[key].get<bool>()))
      throw InvalidRequest(fmt::format("'{}' is not supported by this server", key), key);
  if (has_field(body, "top_logprobs") && !(body["top_logprobs"].is_number() && body["top_logprobs"] == 0))
    throw InvalidRequest("'top_logprobs' is not supported on /v1/responses by this server", "top_logprobs");
  if (has_field(body, "truncation") && body["truncation"] != "disabled")
    throw InvalidRequest("'truncation' must be \"disabled\" (this server does not drop input to fit)", "truncation");
  r.stream = get_bool_field(body, "stream", false);
  r.store = get_bool_field(body, "store", true);
  r.previous_response_id = read_previous_response_id(body);

  ordered_json& chat = r.chat_body;
  chat = ordered_json::object();
  json messages = json::array();
  if (has_field(body, "instructions")) {
    if (!body["instructions"].is_string()) throw InvalidRequest("'instructions' must be a string", "instructions");
    require_valid_utf8(body["instructions"].get_ref<const std::string&>(), "instructions");
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
    r.echo["instructions"] = body["instructions"];
  }
  if (!history.is_array()) throw InvalidRequest("the stored conversation is not a list", "previous_response_id");
  for (const json& m : history) r.conversation.push_back(m);
  if (!has_field(body, "input")) throw InvalidRequest("'input' is required", "input");
  const json& input = body["input"];
  if (input.is_string()) {
    require_valid_utf8(input.get_ref<const std::string&>(), "input");
    r.conversation.push_back({{"role", "user"}, {"content", input}});
    r.input_items.push_back(listed_input_item({{"role", "user"}, {"content", input}}));
  } else if (input.is_array()) {
    if (input.empty()) throw InvalidRequest("'input' must not be empty", "input");
    json added = json::array();
    for (size_t i = 0; i < input.size(); ++i) add_item(input[i], i, added);
    for (json& m : added) r.conversation.push_back(std::move(m));
    for (const json& item : input) r.input_items.push_back(listed_input_item(item));
  } else {
    throw InvalidRequest("'input' must be a string or a list of input items", "input");
  }
  for (const json& m : r.conversation) messages.push_back(m);
  chat["messages"] = to_ordered(messages);

  if (has_field(body, "max_output_tokens")) {
    chat["max_tokens"] = to_ordered(body["max_output_tokens"]);
    r.echo["max_output_tokens"] = body["max_output_tokens"];
  }
  for (const char* key : kSamplingFields)
    if (has_field(body, key)) chat[key] = to_ordered(body[key]);
  if (has_field(body, "tools")) chat["tools"] = translate_tools(body, raw);
  if (has_field(body, "tool_choice")) chat["tool_choice"] = translate_tool_choice(body["tool_choice"]);
  if (has_field(body, "text")) translate_text_format(body, raw, chat);

  for (const char* key : {"temperature", "top_p", "parallel_tool_calls", "metadata", "text", "user", "tools",
                          "tool_choice", "reasoning"})
    if (has_field(body, key)) r.echo[key] = body[key];
  r.chat_body_text = chat.dump();
  return r;
}

GenerationRequest parse_responses_chat(const ResponsesRequest& r, const ServedModel& m) {
  static const FieldRenames renames = {
      {{"max_tokens", "max_output_tokens"}, {"messages", "input"}, {"response_format", "text.format"}},
      {{"].function.parameters", "].parameters"}, {"].function.name", "].name"}}};
  return parse_translated_chat(r.chat_body_text, m, renames);
}

}  // namespace pagellm::api
