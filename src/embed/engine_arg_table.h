// The engine's arguments, one row each: name, type, default, bounds, help and
// where the value goes. The CLI flags and so the --config YAML keys
// (cli/engine_options.h) and the JSON arguments of the Python package and the
// C API (engine_args.h) are all made from this table, so every path takes the
// same names and checks a value with the same words.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "embed/engine_args.h"

namespace pagellm::embed {

enum class ArgType {
  Int,     // an integer in [min, max], or one of `choices`
  Float,   // a number in [min_f, max_f] ((min_f, max_f] with open_min)
  Bool,    // a flag on the command line
  Size,    // bytes, "2GiB" or a number, at least `min`
  Text,
  Choice,  // one of `choices`
  List,    // repeatable text (JSON: a list of strings)
  Map,     // KEY=VALUE, repeatable (JSON: an object)
  Json,    // a JSON object (on the command line: its text)
};

// Where a row is offered: the command line (flags and --config) or the
// library's JSON (Python, C), or both.
enum class ArgScope { All, CommandLine, Library };

struct EngineArg {
  std::string name{};                // the flag without dashes: "max-num-seqs"
  std::vector<std::string> aliases{};  // other spellings, vLLM's among them ("kv-cache-memory-bytes")
  std::string short_flag{};          // "-m", or empty
  std::string negation{};            // Bool: the flag that turns it off ("no-prefix-caching")
  ArgType type = ArgType::Text;
  std::string default_text{};        // set before the given values; empty: the config's own default
  int64_t min = 0, max = 0;          // Int (both), Size (min)
  double min_f = 0, max_f = 0;       // Float
  bool open_min = false;             // Float: min_f itself is out
  std::vector<std::string> choices{};  // Choice; Int when not empty
  std::string help{};
  ArgScope scope = ArgScope::All;
  // The checked value (see arg_value_from_text) into the arguments; may throw
  // for what only the target knows (a dtype name, a speculative config).
  void (*apply)(EngineArgs& args, const nlohmann::json& value) = nullptr;

  std::string key() const;         // the JSON / Python name: "max_num_seqs"
  std::string range_text() const;  // "[1, 1048576]", "{8, 16, 32, 64}", ... for help and messages
  bool on_command_line() const { return scope != ArgScope::Library; }
  bool in_library() const { return scope != ArgScope::CommandLine; }
};

const std::vector<EngineArg>& engine_arg_table();
// By name or alias, dashes or underscores; nullptr when none.
const EngineArg* find_engine_arg(std::string_view name);

// What a --scheduling-preset sets: argument name -> text (the arguments
// given explicitly win). nullptr for an unknown preset.
using PresetValues = std::vector<std::pair<std::string, std::string>>;
const PresetValues* scheduling_preset(std::string_view name);

// A value that does not fit its argument. The message says why without naming
// the argument; each path names it its own way ("--max-num-seqs: ...",
// "engine argument 'max_num_seqs': ...").
class ArgValueError : public std::runtime_error {
 public:
  ArgValueError(const std::string& why, const EngineArg* arg = nullptr) : std::runtime_error(why), arg_(arg) {}
  const EngineArg* arg() const { return arg_; }

 private:
  const EngineArg* arg_;
};

// A value as `apply` takes it: an integer (Int; Size in bytes), a number, a
// boolean, text (Text, Choice, Json), a list of text or an object of text
// (Map), its bounds checked. From the command line's text (one entry, or
// several for List and Map) or from JSON. Throw ArgValueError.
nlohmann::json arg_value_from_text(const EngineArg& arg, const std::vector<std::string>& texts);
nlohmann::json arg_value_from_json(const EngineArg& arg, const nlohmann::json& value);

// Throws ArgValueError when `text` is not a value of `arg`, the target's own
// checks included (the command line's validators).
void check_arg_text(const EngineArg& arg, const std::string& text);

// EngineArgs from the table's defaults and the given values.
class EngineArgsBuilder {
 public:
  EngineArgsBuilder();
  // Both throw ArgValueError naming `arg`.
  void set_text(const EngineArg& arg, const std::vector<std::string>& texts);
  void set_json(const EngineArg& arg, const nlohmann::json& value);
  // Then the --scheduling-preset's values for what was not given, and the
  // default model when none is given and the format is not dummy.
  EngineArgs finish() &&;

 private:
  void set(const EngineArg& arg, const nlohmann::json& value);
  EngineArgs args_;
  std::map<const EngineArg*, nlohmann::json> given_;
};

}  // namespace pagellm::embed
