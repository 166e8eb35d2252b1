// Engine flags shared by serve, generate and bench, named as vLLM's.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pagellm::cli {

// Raw flag values; to_config() validates them into an EngineConfig.
struct EngineFlags {
  std::string model;
  std::string tokenizer;
  std::string load_format = "auto";
  std::string dummy_shape = "tinyllama-1.1b";
  std::string dummy_type = "q4_0";
  std::string device = "cpu";
  std::vector<std::string> backend_plugins;
  std::vector<std::string> backend_options;  // KEY=VALUE
  int threads = -1;  // -1: not given (the backend's default)
  double gpu_memory_utilization = 0;
  int block_size = 16;
  std::string kv_cache_memory;  // e.g. 2GiB; empty: automatic
  std::string kv_cache_dtype = "auto";
  int max_model_len = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int long_prefill_token_threshold = 0;
  std::string scheduling_preset;  // latency | throughput | balanced; empty: none
  std::string preemption_policy = "aggressive";
  int priority_aging_steps = 256;
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  std::string block_allocation = "any";
  std::string scheduling_policy = "fcfs";
  std::string step_composition = "fcfs";
  std::string kv_eviction = "none";
  int attention_sinks = 4;
  std::string preemption_mode = "recompute";
  double swap_space_gib = 4;
  std::string speculative_config;  // JSON (vLLM's --speculative-config)
  bool exact_matmul = false;
  bool deterministic = false;
  int64_t seed = -1;  // -1: not given
  bool profile = false;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int pipeline_micro_batches = 0;
  std::string pipeline_layer_partition;  // "12,10": layers per stage, or "balanced"
  std::string trace;  // Chrome-trace JSON written at exit
  // Structured outputs (structured/grammar.h).
  std::string grammar_max_bytes = "64KiB";
  int grammar_max_depth = GrammarLimits{}.max_depth;
  int64_t grammar_max_nodes = GrammarLimits{}.max_nodes;
  int grammar_compile_workers = 4;
  double grammar_compile_timeout = 10;
  std::string grammar_compile_memory = "1GiB";
  std::string grammar_cache_memory = "128MiB";

  std::string config_file;  // --config FILE.yaml
  // Reads --config into the command's options not given on the command line
  // (once; to_config() calls it too). Commands call it before reading their
  // own flags.
  void load_config_file() const;
  EngineConfig to_config() const;

  // The flags a --scheduling-preset sets unless given (on the command line or
  // in --config).
  CLI::Option* max_num_seqs_opt = nullptr;
  CLI::Option* max_num_batched_tokens_opt = nullptr;
  CLI::Option* long_prefill_opt = nullptr;
  CLI::Option* preemption_policy_opt = nullptr;
  CLI::App* app = nullptr;
  mutable bool config_loaded = false;
};

// What each --scheduling-preset sets (docs/performance.md measures them).
struct SchedulingPreset {
  const char* name;
  int max_num_batched_tokens;
  int max_num_seqs;
  int long_prefill_token_threshold;
  const char* preemption_policy;
};
const SchedulingPreset* find_scheduling_preset(const std::string& name);

// Registers the flags on `app` (and --config); the returned object is filled by parsing.
std::shared_ptr<EngineFlags> add_engine_flags(CLI::App* app);

// Starts the --trace timeline when asked; writes it when destroyed.
class TraceSession {
 public:
  explicit TraceSession(std::string path);
  ~TraceSession();

 private:
  std::string path_;
};

// Loading progress: a bar on a terminal, one log line otherwise.
LoadProgress load_progress_reporter();

}  // namespace pagellm::cli
