#include "cli/yaml_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace pagellm::cli {
namespace {

// A nested YAML value as JSON, with YAML's plain scalars typed (so that
// `num_speculative_tokens: 4` stays a number).
nlohmann::json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : n) j.push_back(to_json(e));
    return j;
  }
  if (!n.IsScalar()) return nullptr;
  if (n.Tag() != "!") {  // not quoted: a number, a boolean or null may be meant
    int64_t i;
    double d;
    bool b;
    if (YAML::convert<int64_t>::decode(n, i)) return i;
    if (YAML::convert<double>::decode(n, d)) return d;
    if (YAML::convert<bool>::decode(n, b)) return b;
    if (n.Scalar() == "null" || n.Scalar() == "~") return nullptr;
  }
  return n.Scalar();
}

}  // namespace

std::vector<YamlFlag> read_yaml_flags(std::istream& in, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(in);
  } catch (const YAML::Exception& e) {
    fail("--config {}: not valid YAML: {}", path, e.what());
  }
  std::vector<YamlFlag> flags;
  if (root.IsNull()) return flags;  // an empty file
  if (!root.IsMap()) fail("--config {}: expected a mapping of flag names to values", path);
  for (const auto& kv : root) {
    YamlFlag f;
    if (!kv.first.IsScalar()) fail("--config {}: flag names must be plain text", path);
    f.name = kv.first.as<std::string>();
    std::replace(f.name.begin(), f.name.end(), '_', '-');  // vLLM's files use either spelling
    const YAML::Node& v = kv.second;
    if (v.IsScalar()) {
      f.values = {v.as<std::string>()};
    } else if (v.IsSequence()) {
      for (const auto& e : v) {
        if (!e.IsScalar()) fail("--config {}: '{}': list entries must be plain values", path, f.name);
        f.values.push_back(e.as<std::string>());
      }
    } else if (v.IsMap()) {
      f.values = {to_json(v).dump()};
    } else {
      fail("--config {}: '{}' has no value", path, f.name);
    }
    flags.push_back(std::move(f));
  }
  return flags;
}

void apply_config_file(CLI::App* app, const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("--config: cannot open '{}'", path);
  for (const YamlFlag& f : read_yaml_flags(in, path)) {
    CLI::Option* opt = app->get_option_no_throw("--" + f.name);
    if (!opt || f.name == "config" || f.name == "help")
      fail("--config {}: '{}' is not a flag of `{}`", path, f.name, app->get_name());
    if (opt->count() > 0) continue;  // the command line wins
    try {
      // A switch's value as its name means it: `no-prefix-caching: true` turns caching off.
      const bool is_switch = opt->get_expected_max() == 0 && f.values.size() == 1;
      opt->add_result(is_switch ? std::vector<std::string>{opt->get_flag_value(f.name, f.values[0])} : f.values);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      fail("--config {}: {}", path, e.what());  // CLI11 names the flag
    }
  }
}

}  // namespace pagellm::cli
