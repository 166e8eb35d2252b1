#include "engine/parallel.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/util.h"
#include "dist/communicator.h"
#include "engine/engine_builder.h"
#include "model/dummy.h"
#include "runner/model_runner.h"

namespace pagellm {

int parallel_ranks(const EngineConfig& c) { return c.tensor_parallel_size * c.pipeline_parallel_size; }

dist::Communicator* parallel_communicator(const EngineConfig& c) {
  PAGELLM_CHECK(c.tensor_parallel_size >= 1 && c.pipeline_parallel_size >= 1,
                "--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  const int ranks = parallel_ranks(c);
  if (ranks == 1) return nullptr;
  static std::unique_ptr<dist::Communicator> world;  // MPI lives as long as the process
  if (!world) world = dist::make_mpi_communicator();
  PAGELLM_CHECK(world->size() == ranks,
                "--tensor-parallel-size {} x --pipeline-parallel-size {} needs {} processes; this run has {} "
                "(launch with mpirun -np {})",
                c.tensor_parallel_size, c.pipeline_parallel_size, ranks, world->size(), ranks);
  return world.get();
}

ModelShard parallel_shard(const EngineConfig& c, int rank) {
  ModelShard s;
  s.tp_size = c.tensor_parallel_size;
  s.pp_size = c.pipeline_parallel_size;
  s.tp_rank = rank % s.tp_size;
  s.pp_rank = rank / s.tp_size;
  s.layer_partition = c.pipeline_layer_partition;
  s.balance_stages = c.pipeline_balance_stages;
  return s;
}

dist::Communicator* tensor_parallel_communicator(const EngineConfig& c, dist::Communicator* world,
                                                 std::unique_ptr<dist::Communicator>& group) {
  if (!world) return nullptr;
  const ModelShard s = parallel_shard(c, world->rank());
  if (s.pp_size > 1) group = world->split(s.pp_rank, s.tp_rank);  // collective: every rank splits
  if (s.tp_size == 1) return nullptr;
  return group ? group.get() : world;
}

namespace {

int run_worker(const EngineConfig& c, dist::Communicator& comm) {
  for (const std::string& plugin : c.backend_plugins) load_backend_plugin(plugin);
  auto backend = create_backend(c.device, c.backend_options);
  LoadedModel lm = load_model_and_tokenizer(c, *backend, {}, parallel_shard(c, comm.rank()));
  Model& model = *lm.model;
  std::unique_ptr<dist::Communicator> stage_group;
  model.set_tp_communicator(tensor_parallel_communicator(c, &comm, stage_group));
  WorkerInit init;
  comm.broadcast(&init, sizeof(init), 0);
  PAGELLM_CHECK(init.num_blocks > 1, "rank 0 sent a KV cache of {} blocks", init.num_blocks);
  model.set_context_length(init.max_model_len);
  const KvGroupPlan groups = kv_group_plan(init.kv_groups != 0, init.max_model_len, model, *backend);
  PAGELLM_CHECK(groups.grouped() == (init.kv_groups != 0), "rank {}: its backend cannot keep KV-cache groups",
                comm.rank());
  backend->allocate_kv_cache(
      model.kv_cache_spec(c.block_size, init.num_blocks, c.kv_cache_dtype, &groups, init.state_slots));
  if (init.deterministic) backend->set_deterministic(true);
  spdlog::info("rank {} (pid {}): {} layers [{}, {}), {} of {} heads, {} weights", comm.rank(), getpid(),
               model.geometry().layer_end -
               model.geometry().layer_begin, model.geometry().layer_begin, model.geometry().layer_end,
               model.geometry().n_head, model.config().n_head, format_bytes(static_cast<int64_t>(model.weight_bytes())));
  ModelRunner runner(model, &comm, c.pipeline_micro_batches);
  runner.serve_worker();
  return 0;
}

}  // namespace

void run_worker_if_parallel(const EngineConfig& c) {
  dist::Communicator* comm = parallel_communicator(c);
  if (!comm || comm->rank() == 0) return;
  int code = 1;
  try {
    code = run_worker(c, *comm);
  } catch (const std::exception& e) {
    spdlog::error("rank {}: {}", comm->rank(), e.what());
  }
  // A failed worker ends the whole job (rank 0 included) instead of leaving
  // the others waiting for it.
  if (code != 0) dist::abort_job_if_parallel(code);
  std::fflush(nullptr);
  std::exit(code);
}

}  // namespace pagellm
