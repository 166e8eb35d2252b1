// Tensor and pipeline parallelism across processes (launched with mpirun):
// rank 0 runs the engine (server, tokenizer, scheduler, sampler); every other
// rank loads its shard of the model and runs the forward passes rank 0 sends
// (ModelRunner::serve_worker). docs/scaling.md describes the layout.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/engine.h"
#include "model/shard.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

// Ranks a config asks for (tensor x pipeline parallel size).
int parallel_ranks(const EngineConfig& c);
// The process's communicator over every rank (MPI, started on first use);
// null when the config asks for one rank. Fails when the launch does not
// have exactly parallel_ranks(c) processes.
dist::Communicator* parallel_communicator(const EngineConfig& c);
ModelShard parallel_shard(const EngineConfig& c, int rank);
// The communicator a model's tensor-parallel all-reduces use: the world when
// there are no pipeline stages, else the group of this rank's stage (split
// from the world, held in `group`); null without tensor parallelism.
dist::Communicator* tensor_parallel_communicator(const EngineConfig& c, dist::Communicator* world,
                                                 std::unique_ptr<dist::Communicator>& group);

// On ranks other than 0 of a parallel run: serves rank 0's steps, then exits
// the process (0 when rank 0 stopped it, 1 on an error). Returns at once on
// rank 0 and in one-rank runs. Commands call it before building an Engine.
void run_worker_if_parallel(const EngineConfig& c);

// What rank 0 sends the workers once the engine has sized its KV cache.
struct WorkerInit {
  int32_t num_blocks = 0;
  int32_t max_model_len = 0;
  int32_t deterministic = 0;
  int32_t kv_groups = 0;  // rank 0 keeps KV-cache groups: each rank plans the same ones
  int32_t state_slots = 0;  // linear-attention state slots (every virtual engine's)
};

// The model (and the tokenizer) as the config names it; shared by the
// engine and the workers, so every rank loads the same weights.
struct LoadedModel {
  std::unique_ptr<TensorSource> dummy_source;  // owns dummy weights (the model borrows them)
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
LoadedModel load_model_and_tokenizer(const EngineConfig& c, Backend& backend, const LoadProgress& progress,
                                     const ModelShard& shard);

}  // namespace pagellm
