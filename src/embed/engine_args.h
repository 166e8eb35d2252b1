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
  std::string trace;          // the command line's --trace: a timeline written at exit
};

// The keys are the snake_case names of the rows of engine_arg_table.h
// (max_num_seqs, kv_cache_memory or kv_cache_memory_bytes, num_threads, ...),
// all optional; null means the default. tensor_parallel_size and
// pipeline_parallel_size must be 1 (one rank). Throws InvalidRequest naming
// the key for unknown keys, wrong types and values out of range. No model
// means the default one (default_model_path).
EngineArgs parse_engine_args(const nlohmann::json& args);

// The default model (Gemma 3 270M Q4_K_M) as installed by tools/setup.sh:
// $PAGELLM_MODEL, else the path setup wrote to build/default-model.txt, else
// the model package's cache. Throws Error with the set-up command when missing.
std::string default_model_path();

}  // namespace pagellm::embed
