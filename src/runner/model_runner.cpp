#include "runner/model_runner.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/trace.h"
#include "dist/communicator.h"
#include "runner/micro_batch.h"

namespace pagellm {

ModelRunner::ModelRunner(Model& model, dist::Communicator* comm, int micro_batches)
    : model_(model), comm_(comm), micro_batches_(micro_batches) {
  const ModelShard& s = model.shard();
  const int ranks = s.tp_size * s.pp_size;
  PAGELLM_CHECK(ranks == 1 || (comm && comm->size() == ranks), "a model sharded over {} ranks needs a communicator "
                "of that many", ranks);
  if (micro_batches_ <= 0) micro_batches_ = 2 * s.pp_size;
}

bool ModelRunner::parallel() const { return comm_ && comm_->size() > 1; }

void ModelRunner::execute(const StepPlan& plan, Output& out) {
  out.entries.clear();
  out.first_row.clear();
  auto pairs = [](const std::vector<BlockCopy>& v, BlockPairs& p) {
    p.clear();
    for (const auto& c : v) p.emplace_back(c.src, c.dst);
  };
  StepMessage& m = msg_;
  m.kind = StepMessage::Step;
  pairs(plan.swap_out, m.swap_out);
  pairs(plan.swap_in, m.swap_in);
  pairs(plan.block_copies, m.block_copies);

  BatchInfo& batch = m.batch;
  batch.token_ids.clear();
  batch.positions.clear();
  batch.slot_mapping.clear();
  batch.seqs.resize(plan.seqs.size());
  m.logits_rows.clear();
  int32_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    s.append_input_ids(batch.token_ids);
    plan.append_positions_and_slots(s, batch.positions, batch.slot_mapping);
    SeqInfo& info = batch.seqs[i];
    info.q_start = row;
    info.q_len = s.num_new_tokens;
    info.ctx_len = s.end_pos();
    info.block_table.assign(s.block_table.begin(), s.block_table.end());
    info.kv_sinks = s.kv_sinks;
    info.kv_evicted_to = s.kv_evicted_to;
    row += s.num_new_tokens;
    if (s.sample) {
      out.entries.push_back(static_cast<int32_t>(i));
      out.first_row.push_back(static_cast<int32_t>(m.logits_rows.size()));
      for (int32_t j = s.num_logits(); j >= 1; --j) m.logits_rows.push_back(row - j);
    }
  }
  const size_t vocab = static_cast<size_t>(model_.config().n_vocab);
  out.logits.resize(m.logits_rows.size() * vocab);
  if (parallel()) broadcast(m);
  run(m, out.logits.data());
}

// Block moves first, in the plan's order: a block swapped out may be written
// by this very step's forward pass.
void ModelRunner::run(const StepMessage& m, float* logits) {
  Backend& be = model_.backend();
  if (!m.swap_out.empty()) be.swap_out(m.swap_out);
  if (!m.swap_in.empty()) be.swap_in(m.swap_in);
  if (!m.block_copies.empty()) be.copy_blocks(m.block_copies);
  if (m.batch.seqs.empty()) {
    be.synchronize();  // the moves are done before the next plan reuses their blocks
    return;
  }
  if (model_.shard().pp_size > 1) pipeline_forward(m.batch, m.logits_rows, logits);
  else model_.forward(m.batch, m.logits_rows, logits);
}

void ModelRunner::pipeline_forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows, float* logits) {
  const ShardGeometry& g = model_.geometry();
  // Global rank = stage * tp_size + tp_rank: each rank of a stage's tensor
  // parallel group talks to the rank with its tp_rank in the next stage.
  const ModelShard& sh = model_.shard();
  const int prev = (sh.pp_rank - 1) * sh.tp_size + sh.tp_rank, next = (sh.pp_rank + 1) * sh.tp_size + sh.tp_rank;
  const int last_stage_lead = (sh.pp_size - 1) * sh.tp_size;
  const int64_t d = model_.config().n_embd, vocab = model_.config().n_vocab;
  // Micro-batches of about equal token counts, each of at least
  // kMinMicroBatchTokens: every micro-batch streams the stage's weights
  // again, so cutting a memory-bound decode step only adds weight traffic
  // (docs/scaling.md measures it); prefill-sized steps gain.
  constexpr int64_t kMinMicroBatchTokens = 64;
  const std::vector<int32_t> ends = micro_batch_ends(batch.n_tokens(), micro_batches_, kMinMicroBatchTokens);
  stage_logits_.resize(logits_rows.size() * static_cast<size_t>(vocab));
  BatchInfo mb;
  std::vector<int32_t> rows, slots;  // a micro-batch's logits rows, and where they go in the step's
  int32_t r0 = 0;
  for (const int32_t r1 : ends) {
    trace::Scope scope("micro-batch", "runner");
    slice_batch(batch, r0, r1, mb);
    rows.clear();
    slots.clear();
    for (size_t j = 0; j < logits_rows.size(); ++j)
      if (logits_rows[j] >= r0 && logits_rows[j] < r1) {
        rows.push_back(logits_rows[j] - r0);
        slots.push_back(static_cast<int32_t>(j));
      }
    const int64_t tokens = r1 - r0;
    r0 = r1;
    model_.begin_pass(mb, static_cast<int64_t>(rows.size()));
    scratch_.resize(static_cast<size_t>(std::max<int64_t>(tokens * d, static_cast<int64_t>(rows.size()) * vocab)));
    if (g.first_stage) {
      model_.embed();
    } else {
      comm_->recv(scratch_.data(), static_cast<size_t>(tokens * d) * sizeof(float), prev);
      model_.hidden_from_host(scratch_.data());
    }
    model_.run_layers();
    if (!g.last_stage) {
      model_.hidden_to_host(scratch_.data());
      comm_->send(scratch_.data(), static_cast<size_t>(tokens * d) * sizeof(float), next);
      continue;
    }
    model_.compute_logits(rows, scratch_.data());
    for (size_t j = 0; j < rows.size(); ++j)
      std::copy_n(scratch_.data() + static_cast<int64_t>(j) * vocab, vocab,
                  stage_logits_.data() + static_cast<int64_t>(slots[j]) * vocab);
  }
  // The last stage sends the step's logits at once, after its last
  // micro-batch (its tensor-parallel rank 0 does; all of them hold them):
  // rank 0 is then done sending and waits for them.
  const size_t bytes = stage_logits_.size() * sizeof(float);
  const int rank = comm_->rank();
  if (rank == last_stage_lead && rank != 0 && bytes > 0) comm_->send(stage_logits_.data(), bytes, 0);
  if (rank == 0 && bytes > 0) {
    if (g.last_stage) std::copy(stage_logits_.begin(), stage_logits_.end(), logits);
    else comm_->recv(logits, bytes, last_stage_lead);
  }
}

void ModelRunner::broadcast(const StepMessage& m) {
  std::vector<uint8_t> bytes = encode_step(m);
  uint64_t size = bytes.size();
  comm_->broadcast(&size, sizeof(size), 0);
  comm_->broadcast(bytes.data(), bytes.size(), 0);
}

StepMessage ModelRunner::receive() {
  uint64_t size = 0;
  comm_->broadcast(&size, sizeof(size), 0);
  PAGELLM_CHECK(size > 0 && size < (uint64_t{1} << 34), "step message of {} bytes", size);
  std::vector<uint8_t> bytes(size);
  comm_->broadcast(bytes.data(), bytes.size(), 0);
  return decode_step(bytes);
}

void ModelRunner::serve_worker() {
  PAGELLM_CHECK(parallel() && comm_->rank() != 0, "serve_worker runs on ranks other than 0");
  const size_t vocab = static_cast<size_t>(model_.config().n_vocab);
  std::vector<float> logits;
  for (;;) {
    StepMessage m = receive();
    if (m.kind == StepMessage::Shutdown) return;
    logits.resize(m.logits_rows.size() * vocab);
    run(m, logits.data());
  }
}

void ModelRunner::stop_workers() {
  if (!parallel() || comm_->rank() != 0 || workers_stopped_) return;
  workers_stopped_ = true;
  StepMessage m;
  m.kind = StepMessage::Shutdown;
  broadcast(m);
}

}  // namespace pagellm
