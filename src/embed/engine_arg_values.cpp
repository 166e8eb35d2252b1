// Values of engine arguments: from the command line's text or from JSON,
// checked against their row of the table, and EngineArgs built from them.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "api/json_fields.h"
#include "core/util.h"
#include "embed/engine_arg_table.h"

namespace pagellm::embed {
namespace {

using nlohmann::json;

std::string quoted(const std::string& text) { return fmt::format("'{}'", cut_for_message(text)); }

// A JSON value as a message shows it: text in quotes, the rest as JSON.
std::string shown(const json& v) {
  if (v.is_string()) return quoted(v.get<std::string>());
  return cut_for_message(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

[[noreturn]] void wrong_type(const char* expected, const std::string& got) {
  throw ArgValueError(fmt::format("must be {}, got {}", expected, got));
}

json checked_int(const EngineArg& arg, int64_t i) {
  if (!arg.choices.empty()) {
    if (std::find(arg.choices.begin(), arg.choices.end(), std::to_string(i)) == arg.choices.end())
      throw ArgValueError(fmt::format("{} not in {}", i, arg.range_text()));
  } else if (i < arg.min || i > arg.max) {
    throw ArgValueError(fmt::format("must be an integer in {}, got {}", arg.range_text(), i));
  }
  return i;
}

json checked_float(const EngineArg& arg, double d) {
  const bool above_min = arg.open_min ? d > arg.min_f : d >= arg.min_f;  // false for NaN
  if (!above_min || !(d <= arg.max_f))
    throw ArgValueError(fmt::format("must be a number in {}, got {}", arg.range_text(), d));
  return d;
}

json checked_size(const EngineArg& arg, int64_t bytes, const std::string& as_given) {
  if (bytes < arg.min) throw ArgValueError(fmt::format("must be {}, got {}", arg.range_text(), as_given));
  return bytes;
}

json checked_choice(const EngineArg& arg, const std::string& text) {
  if (std::find(arg.choices.begin(), arg.choices.end(), text) == arg.choices.end())
    throw ArgValueError(fmt::format("{} not in {}", quoted(text), arg.range_text()));
  return text;
}

const char* const kSizeExpected = "a size such as 2GiB, 512MiB or 1000000";

json int_from_text(const EngineArg& arg, const std::string& text) {
  int64_t i = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
  if (ec == std::errc::result_out_of_range)
    throw ArgValueError(fmt::format("must be an integer in {}, got {}", arg.range_text(), text));
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) wrong_type("an integer", quoted(text));
  return checked_int(arg, i);
}

json float_from_text(const EngineArg& arg, const std::string& text) {
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(d)) wrong_type("a number", quoted(text));
  return checked_float(arg, d);
}

json bool_from_text(const std::string& text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* yes : {"true", "1", "yes", "on"})
    if (lower == yes) return true;
  for (const char* no : {"false", "0", "no", "off"})
    if (lower == no) return false;
  wrong_type("true or false", quoted(text));
}

json size_from_text(const EngineArg& arg, const std::string& text) {
  int64_t bytes = 0;
  try {
    bytes = parse_byte_size(text);
  } catch (const std::exception&) {
    wrong_type(kSizeExpected, quoted(text));
  }
  return checked_size(arg, bytes, quoted(text));
}

// One KEY=VALUE as {KEY: VALUE}.
json entry_from_text(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) wrong_type("KEY=VALUE", quoted(text));
  return json::object({{text.substr(0, eq), text.substr(eq + 1)}});
}

json one_from_text(const EngineArg& arg, const std::string& text) {
  switch (arg.type) {
    case ArgType::Int: return int_from_text(arg, text);
    case ArgType::Float: return float_from_text(arg, text);
    case ArgType::Bool: return bool_from_text(text);
    case ArgType::Size: return size_from_text(arg, text);
    case ArgType::Choice: return checked_choice(arg, text);
    case ArgType::Map: return entry_from_text(text);
    default: return text;  // Text, List, Json
  }
}

// 5, or 5.0 as pydantic takes it in vLLM; not 5.5.
json int_from_json(const EngineArg& arg, const json& v) {
  const bool fractional = v.is_number_float() && std::trunc(v.get<double>()) != v.get<double>();
  if (!v.is_number() || fractional) wrong_type("an integer", v.is_number() ? shown(v) : json_type_name(v));
  const bool fits = v.is_number_unsigned()  ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                    : v.is_number_integer() ? true
                                            : v.get<double>() >= -0x1p63 && v.get<double>() < 0x1p63;
  if (!fits) throw ArgValueError(fmt::format("must be an integer in {}, got {}", arg.range_text(), shown(v)));
  return checked_int(arg, v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>()));
}

json size_from_json(const EngineArg& arg, const json& v) {
  if (v.is_string()) return size_from_text(arg, v.get<std::string>());
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    wrong_type(kSizeExpected, v.is_number() ? shown(v) : json_type_name(v));
  return checked_size(arg, v.get<int64_t>(), shown(v));
}

json list_from_json(const json& v) {
  if (!v.is_array()) wrong_type("a list of text", json_type_name(v));
  for (const json& e : v)
    if (!e.is_string()) wrong_type("a list of text", fmt::format("{} in it", json_type_name(e)));
  return v;
}

// {key: text, number or boolean} as {key: text}.
json map_from_json(const json& v) {
  if (!v.is_object()) wrong_type("an object", json_type_name(v));
  json texts = json::object();
  for (const auto& item : v.items()) {
    const json& e = item.value();
    if (e.is_string()) texts[item.key()] = e;
    else if (e.is_boolean()) texts[item.key()] = e.get<bool>() ? "true" : "false";
    else if (e.is_number()) texts[item.key()] = e.dump();
    else
      throw ArgValueError(
          fmt::format("entry '{}' must be text, a number or a boolean, got {}", item.key(), json_type_name(e)));
  }
  return texts;
}

// `apply`, its failures as ArgValueError of `arg`.
void apply_checked(const EngineArg& arg, EngineArgs& args, const json& value) {
  try {
    arg.apply(args, value);
  } catch (const std::exception& e) {
    // Parsers below name the flag themselves ("--speculative-config: ..."):
    // the path that reports it names it its own way.
    std::string why = e.what();
    if (why.starts_with("--" + arg.name)) {
      why.erase(0, arg.name.size() + 2);
      why.erase(0, why.find_first_not_of(": "));
    }
    throw ArgValueError(why, &arg);
  }
}

}  // namespace

json arg_value_from_text(const EngineArg& arg, const std::vector<std::string>& texts) {
  if (arg.type == ArgType::List || arg.type == ArgType::Map) {
    json all = arg.type == ArgType::List ? json::array() : json::object();
    for (const std::string& text : texts) {
      if (arg.type == ArgType::List) all.push_back(text);
      else all.update(one_from_text(arg, text));
    }
    return all;
  }
  if (texts.empty()) throw ArgValueError("needs a value");
  return one_from_text(arg, texts.back());  // the last one given wins
}

json arg_value_from_json(const EngineArg& arg, const json& v) {
  switch (arg.type) {
    case ArgType::Int:
      return int_from_json(arg, v);
    case ArgType::Float:
      if (!v.is_number()) wrong_type("a number", json_type_name(v));
      return checked_float(arg, v.get<double>());
    case ArgType::Bool:
      if (!v.is_boolean()) wrong_type("true or false", shown(v));
      return v;
    case ArgType::Size:
      return size_from_json(arg, v);
    case ArgType::List:
      return list_from_json(v);
    case ArgType::Map:
      return map_from_json(v);
    case ArgType::Json:
      if (v.is_object()) return v.dump();
      if (!v.is_string()) wrong_type("an object or its JSON text", json_type_name(v));
      return v;
    default:  // Text, Choice
      if (!v.is_string()) wrong_type("text", json_type_name(v));
      return one_from_text(arg, v.get<std::string>());
  }
}

void check_arg_text(const EngineArg& arg, const std::string& text) {
  EngineArgs scratch;
  apply_checked(arg, scratch, arg_value_from_text(arg, {text}));
}

EngineArgsBuilder::EngineArgsBuilder() {
  for (const EngineArg& arg : engine_arg_table())
    if (!arg.default_text.empty()) arg.apply(args_, arg_value_from_text(arg, {arg.default_text}));
}

void EngineArgsBuilder::set(const EngineArg& arg, const json& value) {
  apply_checked(arg, args_, value);
  given_[&arg] = value;
}

void EngineArgsBuilder::set_text(const EngineArg& arg, const std::vector<std::string>& texts) {
  try {
    set(arg, arg_value_from_text(arg, texts));
  } catch (const ArgValueError& e) {
    throw ArgValueError(e.what(), &arg);
  }
}

void EngineArgsBuilder::set_json(const EngineArg& arg, const json& value) {
  try {
    set(arg, arg_value_from_json(arg, value));
  } catch (const ArgValueError& e) {
    throw ArgValueError(e.what(), &arg);
  }
}

EngineArgs EngineArgsBuilder::finish() && {
  const auto preset = given_.find(find_engine_arg("scheduling-preset"));
  if (preset != given_.end()) {
    for (const auto& [name, text] : *scheduling_preset(preset->second.get<std::string>())) {
      const EngineArg* arg = find_engine_arg(name);
      if (!given_.count(arg)) arg->apply(args_, arg_value_from_text(*arg, {text}));
    }
  }
  EngineConfig& c = args_.config;
  if (c.model.empty() && c.load_format == "auto") c.model = default_model_path();
  return std::move(args_);
}

}  // namespace pagellm::embed
