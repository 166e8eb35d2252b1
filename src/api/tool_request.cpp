#include "api/tool_request.h"

#include <fmt/format.h>

#include <set>

#include "api/json_fields.h"
#include "api/ordered_field.h"
#include "core/error.h"
#include "structured/grammar.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// The grammar of tool_choice "required": a list of one call per element, each
// {"name": <a declared function>, "parameters": <its schema>} (vLLM's shape).
std::string required_schema(const nlohmann::ordered_json& functions, bool parallel) {
  using ojson = nlohmann::ordered_json;
  ojson any_of = ojson::array();
  for (const ojson& f : functions) {
    ojson call = ojson::object();
    call["type"] = "object";
    call["properties"]["name"] = {{"type", "string"}, {"enum", {f["name"]}}};
    call["properties"]["parameters"] = f["parameters"];
    call["required"] = {"name", "parameters"};
    any_of.push_back(std::move(call));
  }
  ojson schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any_of}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema.dump();
}

// The functions' {name, parameters} with each schema in the client's key
// order when the raw text has it.
nlohmann::ordered_json ordered_functions(const json& body, const json& functions, std::string_view raw) {
  const auto tools = ordered_field(body, raw, {"tools"});
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < functions.size(); ++i) {
    nlohmann::ordered_json params;
    if (tools && tools->is_array() && i < tools->size() && (*tools)[i].is_object() &&
        (*tools)[i].contains("function") && (*tools)[i]["function"].is_object() &&
        (*tools)[i]["function"].contains("parameters") && (*tools)[i]["function"]["parameters"].is_object())
      params = (*tools)[i]["function"]["parameters"];
    else
      params = nlohmann::ordered_json::parse(functions[i]["parameters"].dump());
    out.push_back({{"name", functions[i]["name"]}, {"parameters", std::move(params)}});
  }
  return out;
}

// The checked tools; `functions` gets {name, parameters} of each.
json read_tools(const json& body, json& functions, const GrammarLimits& limits) {
  for (const char* key : {"functions", "function_call"})
    if (has_field(body, key))
      throw InvalidRequest(fmt::format("'{}' (the deprecated function calling) is not supported; use 'tools'", key), key);
  json out = nullptr;
  if (has_field(body, "tools")) {
    const json& tools = body["tools"];
    if (!tools.is_array()) throw InvalidRequest("'tools' must be a list", "tools");
    std::set<std::string> names;
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
          !t["function"].is_object())
        throw InvalidRequest(fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}", i),
                             "tools");
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"].get<std::string>()))
        throw InvalidRequest(fmt::format("tools[{}].function.name must be 1-64 letters, digits, '_', '-' or '.'", i),
                             "tools");
      const std::string name = f["name"].get<std::string>();
      if (!names.insert(name).second)
        throw InvalidRequest(fmt::format("tools[{}]: the function '{}' is declared twice", i, name), "tools");
      json params = has_field(f, "parameters") ? f["parameters"] : json{{"type", "object"}, {"properties", json::object()}};
      if (!params.is_object())
        throw InvalidRequest(fmt::format("tools[{}].function.parameters must be a JSON schema object", i), "tools");
      StructuredOutputs check;
      check.kind = StructuredOutputs::Kind::Json;
      check.spec = params.dump();
      try {
        structured::validate(check, limits, "tools");
      } catch (const InvalidRequest& e) {
        throw InvalidRequest(fmt::format("tools[{}] ('{}'): parameters: {}", i, name, e.what()), "tools");
      }
      functions.push_back({{"name", name}, {"parameters", std::move(params)}});
    }
    if (!tools.empty()) out = tools;
  }
  return out;
}

}  // namespace

json parse_tool_list(const json& body, const GrammarLimits& limits) {
  json functions = json::array();
  return read_tools(body, functions, limits);
}

ChatTools parse_tools(const json& body, const ToolSettings& settings, std::string_view raw_body) {
  ChatTools out;
  json functions = json::array();  // {name, parameters}, checked
  out.tools = read_tools(body, functions, settings.grammar_limits);

  // tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
  std::string choice = out.tools.is_null() ? "none" : "auto";
  std::string named;
  if (has_field(body, "tool_choice")) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      choice = tc.get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        throw InvalidRequest("'tool_choice' must be none, auto, required or a named function", "tool_choice");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      choice = "named";
      named = tc["function"]["name"].get<std::string>();
    } else {
      throw InvalidRequest("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                           "{\"name\": ...}}", "tool_choice");
    }
  }
  if (choice != "none" && out.tools.is_null())
    throw InvalidRequest(fmt::format("'tool_choice' {} needs 'tools'", choice == "named" ? "naming a function" : choice),
                         "tool_choice");
  const bool parallel = get_bool_field(body, "parallel_tool_calls", true);
  if (choice == "auto") {
    if (!settings.enable_auto_tool_choice || !settings.parser)
      throw InvalidRequest("\"auto\" tool choice requires the server's --enable-auto-tool-choice and "
                           "--tool-call-parser", "tool_choice");
    out.mode = chat::ToolMode::Auto;
  } else if (choice == "required") {
    out.mode = chat::ToolMode::Required;
    out.grammar.kind = StructuredOutputs::Kind::Json;
    out.grammar.any_whitespace = false;  // calls are data: JSON as json.dumps writes it
    out.grammar.spec = required_schema(ordered_functions(body, functions, raw_body), parallel);
    out.grammar.field = "tool_choice";
  } else if (choice == "named") {
    const nlohmann::ordered_json ordered = ordered_functions(body, functions, raw_body);
    const nlohmann::ordered_json* params = nullptr;
    for (const auto& f : ordered)
      if (f["name"] == named) params = &f["parameters"];
    if (!params)
      throw InvalidRequest(fmt::format("'tool_choice' names '{}', which is not among the tools", named), "tool_choice");
    out.mode = chat::ToolMode::Named;
    out.named_function = named;
    out.grammar.kind = StructuredOutputs::Kind::Json;
    out.grammar.any_whitespace = false;
    out.grammar.spec = params->dump();
    out.grammar.field = "tool_choice";
  }
  return out;
}

}  // namespace pagellm::api
