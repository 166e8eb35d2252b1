// Building an Engine's parts from its config, in the order they depend on each
// other: the ranks and the backend, the model and its tokenizer, the KV cache
// (sized by plan_kv_budget), the swap pool, the workers, one scheduler per
// virtual engine, the runner, the grammar compiler and the draft proposer.
// Engine's constructor takes the parts; the step loop never comes back here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/kv_layout.h"
#include "engine/engine.h"

namespace pagellm {

// What the KV cache's size depends on (bytes unless said otherwise).
struct KvBudgetInputs {
  KVCacheLayout layout;  // one block, of the pipeline stage with the most layer slots
  int32_t blocks_per_seq = 0;  // one max_model_len sequence's, all KV-cache groups (0: from layout)
  int32_t max_model_len = 0;
  int32_t max_num_seqs = 1;
  int64_t kv_cache_memory = 0;        // --kv-cache-memory; 0: from the device's memory
  double gpu_memory_utilization = 0;  // 0: 0.9 on devices with their own memory
  MemoryInfo memory;                  // the device's, before the cache is allocated
  int64_t weight_bytes = 0;           // the weights this rank holds
  int64_t activation_bytes = 0;       // one full step's
  int64_t state_bytes = 0;            // linear-attention states of every sequence slot (fixed, not paged)
  std::string device;                 // the backend's name, for messages
  int32_t virtual_engines = 1;        // schedulers that split the blocks
};

// Virtual engine i's blocks: cache blocks block_shift + 1 .. block_shift +
// num_blocks - 1, numbered from 1 in its own pool (block 0 is the null block).
struct KvShare {
  int32_t block_shift = 0;
  int32_t num_blocks = 0;  // including the null block
};

struct KvBudget {
  int64_t bytes_per_block = 0;
  int64_t budget_bytes = 0;
  int32_t num_blocks = 0;        // in the cache, including the null block 0
  std::vector<KvShare> shares;   // one per virtual engine
};

// The KV cache's size: as asked (--kv-cache-memory); on a device with its own
// memory (or with --gpu-memory-utilization), the fraction of it left after
// the weights and a full step's activations, never more than is free (as
// vLLM); on host memory, a quarter of what is free, at most what max_num_seqs
// full-length sequences could use, and at least one such sequence. The
// usable blocks are split evenly over the virtual engines (the first ones
// take the remainder). Throws Error when the budget holds no cache.
KvBudget plan_kv_budget(const KvBudgetInputs& in);
// KV-cache groups of the model on the backend (core/kv_layout.h): grouped
// when the config allows, the backend supports them and no sliding KV
// eviction is asked for; else one full-attention group.
KvGroupPlan kv_group_plan(bool allowed, int32_t max_model_len, const Model& model, const Backend& backend);
// Even shares of a cache of num_blocks over count >= 1 virtual engines.
std::vector<KvShare> kv_shares(int32_t num_blocks, int32_t count);

// Everything Engine::load builds. Members are declared in the order they are
// built, so that a failed build frees them in reverse (the model before the
// backend it lives on).
struct EngineParts {
  dist::Communicator* comm = nullptr;  // all ranks, under tensor / pipeline parallelism
  std::unique_ptr<Backend> backend;
  std::unique_ptr<dist::Communicator> tp_group;  // rank 0's stage, with both kinds
  std::unique_ptr<TensorSource> dummy_source;    // owns dummy weights (the model borrows them)
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  SchedulerConfig sched_config;
  KVCacheConfig kv_config;
  std::vector<std::unique_ptr<Scheduler>> schedulers;  // one per virtual engine
  std::vector<int32_t> block_shift;                    // of each scheduler's blocks
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<structured::GrammarCompiler> grammars;
  std::unique_ptr<Proposer> proposer;  // null without speculative decoding
};

EngineParts build_engine_parts(const EngineConfig& config, const LoadProgress& progress);

}  // namespace pagellm
