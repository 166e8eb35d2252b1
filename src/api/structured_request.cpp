#include "api/structured_request.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "api/json_fields.h"
#include "api/ordered_field.h"
#include "core/error.h"
#include "structured/grammar.h"

namespace pagellm::api {
namespace {

using nlohmann::json;
using Kind = StructuredOutputs::Kind;

// A schema given as an object or as JSON text (vLLM takes both). Text is
// measured against the limits before it is parsed: it escaped the body's
// nesting limit.
std::string schema_text(const json& v, const GrammarLimits& limits, const char* param) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    StructuredOutputs measured;
    measured.kind = Kind::Json;
    measured.spec = s;
    structured::check_grammar_limits(measured, limits, param);
    json parsed;
    try {
      parsed = json::parse(s);
    } catch (const json::exception&) {
      throw InvalidRequest(fmt::format("'{}' is a string that is not JSON", param), param);
    }
    if (!parsed.is_object() && !parsed.is_boolean())
      throw InvalidRequest(fmt::format("'{}' must hold a JSON schema object", param), param);
    return s;
  }
  throw InvalidRequest(fmt::format("'{}' must be a JSON schema (an object)", param), param);
}

std::string string_field(const json& v, const char* param) {
  if (!v.is_string()) throw InvalidRequest(fmt::format("'{}' must be a string", param), param);
  return v.get<std::string>();
}

std::string choice_list(const json& v, const char* param) {
  if (!v.is_array() || v.empty())
    throw InvalidRequest(fmt::format("'{}' must be a non-empty list of strings", param), param);
  for (const json& c : v)
    if (!c.is_string()) throw InvalidRequest(fmt::format("'{}' must be a non-empty list of strings", param), param);
  return v.dump();
}

struct Found {
  StructuredOutputs spec;
  const char* param = nullptr;  // the field that set it
};

void set_once(Found& f, Kind kind, std::string text, const char* param) {
  if (f.param)
    throw InvalidRequest(
        fmt::format("'{}' and '{}' both constrain the output; give only one structured output", f.param, param),
        param);
  f.spec.kind = kind;
  f.spec.spec = std::move(text);
  f.param = param;
}

void read_response_format(const json& body, const GrammarLimits& limits, Found& f) {
  if (!has_field(body, "response_format")) return;
  const json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    throw InvalidRequest("'response_format' must be an object with a 'type'", "response_format");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return;
  if (type == "json_object") return set_once(f, Kind::JsonObject, "", "response_format");
  if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      throw InvalidRequest("response_format type 'json_schema' needs a 'json_schema' object", "response_format");
    const json& js = rf["json_schema"];
    if (!has_field(js, "schema")) return set_once(f, Kind::JsonObject, "", "response_format");
    return set_once(f, Kind::Json, schema_text(js["schema"], limits, "response_format"), "response_format");
  }
  throw InvalidRequest(
      fmt::format("response_format type '{}' is not supported (text, json_object or json_schema)", cut_for_message(type)),
      "response_format");
}

void read_structured_outputs(const json& body, const GrammarLimits& limits, Found& f) {
  const char* param = "structured_outputs";
  if (!has_field(body, param)) return;
  const json& so = body[param];
  if (!so.is_object()) throw InvalidRequest("'structured_outputs' must be an object", param);
  int kinds = 0;
  for (const char* key : {"json", "regex", "choice", "grammar", "json_object", "structural_tag"})
    if (has_field(so, key) && !(std::string(key) == "json_object" && so[key] == false)) ++kinds;
  if (kinds > 1)
    throw InvalidRequest("'structured_outputs' may hold only one of json, regex, choice, grammar, json_object, "
                         "structural_tag", param);
  if (has_field(so, "json")) set_once(f, Kind::Json, schema_text(so["json"], limits, param), param);
  if (has_field(so, "regex")) set_once(f, Kind::Regex, string_field(so["regex"], param), param);
  if (has_field(so, "choice")) set_once(f, Kind::Choice, choice_list(so["choice"], param), param);
  if (has_field(so, "grammar")) set_once(f, Kind::Grammar, string_field(so["grammar"], param), param);
  if (get_bool_field(so, "json_object", false)) set_once(f, Kind::JsonObject, "", param);
  if (has_field(so, "structural_tag")) {
    const json& st = so["structural_tag"];
    if (!st.is_string() && !st.is_object())
      throw InvalidRequest("'structured_outputs.structural_tag' must be an object or JSON text", param);
    set_once(f, Kind::StructuralTag, st.is_string() ? st.get<std::string>() : st.dump(), param);
  }
  if (get_bool_field(so, "disable_any_whitespace", false)) f.spec.any_whitespace = false;
}

void read_guided_fields(const json& body, const GrammarLimits& limits, Found& f) {
  if (has_field(body, "guided_json")) set_once(f, Kind::Json, schema_text(body["guided_json"], limits, "guided_json"),
                                                "guided_json");
  if (has_field(body, "guided_regex"))
    set_once(f, Kind::Regex, string_field(body["guided_regex"], "guided_regex"), "guided_regex");
  if (has_field(body, "guided_choice"))
    set_once(f, Kind::Choice, choice_list(body["guided_choice"], "guided_choice"), "guided_choice");
  if (has_field(body, "guided_grammar"))
    set_once(f, Kind::Grammar, string_field(body["guided_grammar"], "guided_grammar"), "guided_grammar");
  for (const char* key : {"guided_decoding_backend", "guided_whitespace_pattern"})
    if (has_field(body, key) && !body[key].is_string())
      throw InvalidRequest(fmt::format("'{}' must be a string", key), key);
}

// The schema of field `param`, in the client's key order; empty when the raw
// text is not at hand (then the sorted text stands).
std::string ordered_schema(const json& body, std::string_view raw, const char* param) {
  std::vector<std::string> path = {"response_format", "json_schema", "schema"};
  if (std::string_view(param) == "guided_json") path = {"guided_json"};
  if (std::string_view(param) == "structured_outputs") path = {"structured_outputs", "json"};
  const auto v = ordered_field(body, raw, path);
  return v && v->is_object() ? v->dump() : "";
}

}  // namespace

StructuredOutputs parse_structured_outputs(const json& body, const GrammarLimits& limits, std::string_view raw_body) {
  Found f;
  read_response_format(body, limits, f);
  read_structured_outputs(body, limits, f);
  read_guided_fields(body, limits, f);
  if (!f.param) return f.spec;
  if (f.spec.kind == Kind::Json && !raw_body.empty())
    if (std::string ordered = ordered_schema(body, raw_body, f.param); !ordered.empty()) f.spec.spec = std::move(ordered);
  f.spec.field = f.param;
  structured::validate(f.spec, limits, f.param);
  return f.spec;
}

}  // namespace pagellm::api
