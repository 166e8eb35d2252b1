// Engine arguments as a library takes them: one JSON object with vLLM's
// EngineArgs names (the Python package's LLM(**kwargs), the C API's options).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/engine.h"

namespace pagellm::embed {

struct EngineArgs {
  EngineConfig config;
  // vLLM's engine-wide seed: requests without a seed of their own get one
  // derived from it and their submission number, so a run is reproducible.
  std::optional<uint64_t> seed;
  std::string chat_template;  // a file or inline template; empty: the model's
};

// Keys (all optional; null means the default):
//   model, tokenizer, load_format (auto | dummy), dummy_shape, dummy_type,
//   device, backend_options {key: value}, num_threads, exact_matmul,
//   gpu_memory_utilization, block_size, kv_cache_memory (bytes or "2GiB"),
//   kv_cache_memory_bytes, kv_cache_dtype (auto | fp16 | f32 | int8), max_model_len,
//   max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
//   enable_chunked_prefill, block_allocation, scheduling_policy,
//   preemption_mode, preemption_policy (aggressive | conservative),
//   long_prefill_token_threshold, priority_aging_steps, swap_space (GiB),
//   speculative_config (object or JSON text), seed, chat_template, profile,
//   deterministic, step_composition (fcfs | length-aware), kv_eviction
//   (none | sliding), attention_sinks;
//   accepted for vLLM compatibility: dtype ("auto"), trust_remote_code,
//   enforce_eager, disable_log_stats, tensor_parallel_size and
//   pipeline_parallel_size (1).
// Throws InvalidRequest naming the key for unknown keys, wrong types and
// values out of range. No model means the default one (default_model_path).
EngineArgs parse_engine_args(const nlohmann::json& args);

// The default model (Gemma 3 270M Q4_K_M) as installed by tools/setup.sh:
// $PAGELLM_MODEL, else the path setup wrote to build/default-model.txt, else
// the model package's cache. Throws Error with the set-up command when missing.
std::string default_model_path();

}  // namespace pagellm::embed
