#include "runner/model_runner.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/trace.h"
#include "dist/communicator.h"
#include "dist/device_comm.h"
#include "runner/micro_batch.h"

namespace pagellm {

ModelRunner::ModelRunner(Model& model, dist::Communicator* comm, int micro_batches)
    : model_(model), comm_(comm), micro_batches_(micro_batches) {
  const ModelShard& s = model.shard();
  const int ranks = s.tp_size * s.pp_size;
  PAGELLM_CHECK(ranks == 1 || (comm && comm->size() == ranks), "a model sharded over {} ranks needs a communicator "
                "of that many", ranks);
  if (micro_batches_ <= 0) micro_batches_ = 2 * s.pp_size;
  samples_on_device_ = ranks == 1 && model.can_sample_on_device();
  // The hidden states between pipeline stages go over the device's own
  // communicator when the backend has one (dist/device_comm.h).
  if (s.pp_size > 1) pp_comm_ = dist::make_device_comm(model.backend(), *comm);
}

bool ModelRunner::parallel() const { return comm_ && comm_->size() > 1; }

void ModelRunner::execute(const StepPlan& plan, Output& out) {
  submit(plan);
  finish(out);
}

void ModelRunner::submit(const StepPlan& plan, int32_t block_shift, const std::vector<SampleDraw>* draws) {
  std::unique_ptr<Step> step;
  if (spare_.empty()) {
    step = std::make_unique<Step>();
  } else {
    step = std::move(spare_.front());
    spare_.pop_front();
    // (Its sends were received before its logits came back: no wait in practice.)
    if (parallel()) comm_->wait_sends(step->last_send);
  }
  build_message(plan, block_shift, *step);
  step->draws.clear();
  if (draws) {
    PAGELLM_CHECK(samples_on_device_ && draws->size() == step->entries.size() && step->prompt_entries.empty(),
                  "device draws: {} for {} sampling entries", draws->size(), step->entries.size());
    step->draws = *draws;
  }
  if (parallel()) send_to_workers(msg_, *step);
  run(msg_, *step);
  in_flight_.push_back(std::move(step));
}

void ModelRunner::finish(Output& out) {
  PAGELLM_CHECK(!in_flight_.empty(), "ModelRunner::finish without a step in flight");
  std::unique_ptr<Step> step = std::move(in_flight_.front());
  in_flight_.pop_front();
  out.entries.swap(step->entries);
  out.first_row.swap(step->first_row);
  out.prompt_entries.swap(step->prompt_entries);
  out.prompt_first_row.swap(step->prompt_first_row);
  out.hidden_entries.swap(step->hidden_entries);
  out.hidden_first_row.swap(step->hidden_first_row);
  out.hidden.swap(step->hidden);
  const ModelShard& sh = model_.shard();
  if (sh.pp_size > 1) {
    // Rank 0 is the first stage, never the last. Every step ends with the
    // last stage's message, empty when nothing
    // samples: rank 0 never runs more steps ahead than it has submitted.
    // The logits, then the pooled rows' hidden states.
    const size_t logits_values = step->rows * static_cast<size_t>(model_.config().n_vocab);
    out.logits.resize(logits_values + step->hidden_rows.size() * static_cast<size_t>(model_.config().n_embd));
    comm_->recv(out.logits.data(), out.logits.size() * sizeof(float), (sh.pp_size - 1) * sh.tp_size);
    out.hidden.assign(out.logits.begin() + static_cast<std::ptrdiff_t>(logits_values), out.logits.end());
    out.logits.resize(logits_values);
  } else {
    out.logits.swap(step->logits);
  }
  out.tokens.swap(step->tokens);
  step->tokens.clear();
  spare_.push_back(std::move(step));
}

void ModelRunner::build_message(const StepPlan& plan, int32_t block_shift, Step& step) {
  step.entries.clear();
  step.first_row.clear();
  step.prompt_entries.clear();
  step.prompt_first_row.clear();
  step.hidden_entries.clear();
  step.hidden_first_row.clear();
  step.hidden_rows.clear();
  // The plan's scheduler numbers its blocks from 1; they are blocks
  // block_shift + 1 on of the cache (0 stays the null block).
  auto shift = [block_shift](int32_t b) { return b == 0 ? b : b + block_shift; };
  auto pairs = [](const std::vector<BlockCopy>& v, BlockPairs& p) {
    p.clear();
    for (const auto& c : v) p.emplace_back(c.src, c.dst);
  };
  StepMessage& m = msg_;
  m.kind = StepMessage::Step;
  pairs(plan.swap_out, m.swap_out);
  pairs(plan.swap_in, m.swap_in);
  pairs(plan.block_copies, m.block_copies);
  pairs(plan.state_copies, m.state_copies);
  if (block_shift != 0) {
    for (auto& [src, dst] : m.swap_out) src = shift(src);  // (dst: a host block)
    for (auto& [src, dst] : m.swap_in) dst = shift(dst);
    for (auto& [src, dst] : m.block_copies) src = shift(src), dst = shift(dst);
  }

  BatchInfo& batch = m.batch;
  batch.token_ids.clear();
  batch.positions.clear();
  batch.slot_mapping.clear();
  batch.group_slots.clear();
  batch.seqs.resize(plan.seqs.size());
  m.logits_rows.clear();
  m.hidden_rows.clear();
  int32_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    s.append_input_ids(batch.token_ids);
    plan.append_positions_and_slots(s, batch.positions, batch.slot_mapping, &batch.group_slots);
    SeqInfo& info = batch.seqs[i];
    info.q_start = row;
    info.q_len = s.num_new_tokens;
    info.ctx_len = s.end_pos();
    info.block_table.assign(s.block_table.begin(), s.block_table.end());
    if (block_shift != 0) std::transform(info.block_table.begin(), info.block_table.end(), info.block_table.begin(), shift);
    info.group_tables.resize(s.group_tables.size());
    for (size_t g = 0; g < s.group_tables.size(); ++g) {
      auto& table = info.group_tables[g];
      table.assign(s.group_tables[g].begin(), s.group_tables[g].end());
      if (block_shift != 0) std::transform(table.begin(), table.end(), table.begin(), shift);
    }
    info.kv_sinks = s.kv_sinks;
    info.kv_evicted_to = s.kv_evicted_to;
    info.state_slot = s.state_slot;
    info.lora_slot = s.lora_slot;
    if (s.num_prompt_logits > 0) {
      PAGELLM_CHECK(s.num_prompt_logits <= s.num_new_tokens - s.num_draft_tokens(),
                    "plan entry {}: {} prompt logits rows from {} tokens", i, s.num_prompt_logits, s.num_new_tokens);
      step.prompt_entries.push_back(static_cast<int32_t>(i));
      step.prompt_first_row.push_back(static_cast<int32_t>(m.logits_rows.size()));
      for (int32_t j = 0; j < s.num_prompt_logits; ++j) m.logits_rows.push_back(row + j);
    }
    if (s.num_hidden > 0) {
      PAGELLM_CHECK(s.hidden_begin >= 0 && s.hidden_begin + s.num_hidden <= s.num_new_tokens,
                    "plan entry {}: hidden rows [{}, +{}) of {} tokens", i, s.hidden_begin, s.num_hidden,
                    s.num_new_tokens);
      step.hidden_entries.push_back(static_cast<int32_t>(i));
      step.hidden_first_row.push_back(static_cast<int32_t>(step.hidden_rows.size()));
      for (int32_t j = 0; j < s.num_hidden; ++j) step.hidden_rows.push_back(row + s.hidden_begin + j);
    }
    row += s.num_new_tokens;
    if (s.sample) {
      step.entries.push_back(static_cast<int32_t>(i));
      step.first_row.push_back(static_cast<int32_t>(m.logits_rows.size()));
      for (int32_t j = s.num_logits(); j >= 1; --j) m.logits_rows.push_back(row - j);
    }
  }
  m.hidden_rows = step.hidden_rows;
  // New tokens always go to live blocks (never the null block).
  if (block_shift != 0) {
    for (int64_t& slot : batch.slot_mapping) slot += static_cast<int64_t>(block_shift) * plan.block_size;
    for (auto& slots : batch.group_slots)
      for (int64_t& slot : slots) slot += static_cast<int64_t>(block_shift) * plan.block_size;
  }
}

// To each worker, asynchronously: the step's bytes live in `step` until
// it is reused.
void ModelRunner::send_to_workers(const StepMessage& m, Step& step) {
  step.message = encode_step(m);
  for (int r = 1; r < comm_->size(); ++r) step.last_send = comm_->send_async(step.message.data(), step.message.size(), r);
}

// Block moves first, in the plan's order: a block swapped out may be written
// by this very step's forward pass.
void ModelRunner::run(const StepMessage& m, Step& step) {
  Backend& be = model_.backend();
  step.rows = m.logits_rows.size();
  if (!m.swap_out.empty()) be.swap_out(m.swap_out);
  if (!m.swap_in.empty()) be.swap_in(m.swap_in);
  if (!m.block_copies.empty()) be.copy_blocks(m.block_copies);
  if (!m.state_copies.empty()) be.copy_states(m.state_copies);
  if (m.batch.seqs.empty()) be.synchronize();  // the moves are done before the next plan reuses their blocks
  if (model_.shard().pp_size > 1) {
    // (Block moves only: just the last stage's message.) The last stage
    // pools what rank 0 planned; rank 0's residual stream is whole under
    // tensor parallelism alone, so there only rank 0 reads hidden rows.
    pipeline_forward(m.batch, m.logits_rows, m.hidden_rows, step);
    return;
  }
  if (m.batch.seqs.empty()) return;
  if (!step.draws.empty()) {
    model_.begin_pass(m.batch, static_cast<int64_t>(m.logits_rows.size()));
    model_.embed();
    model_.run_layers();
    model_.compute_logits(m.logits_rows);
    step.logits.clear();
    step.tokens.resize(step.draws.size());
    model_.sample_on_device(step.draws, step.tokens.data());
  } else {
    step.logits.resize(step.rows * static_cast<size_t>(model_.config().n_vocab));
    model_.forward(m.batch, m.logits_rows, step.logits.data());
  }
  step.hidden.resize(step.hidden_rows.size() * static_cast<size_t>(model_.config().n_embd));
  model_.final_hidden(step.hidden_rows, step.hidden.data());
}

void ModelRunner::pipeline_forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows,
                                   const std::vector<int32_t>& hidden_rows, Step& step) {
  const ShardGeometry& g = model_.geometry();
  // Global rank = stage * tp_size + tp_rank: each rank of a stage's tensor
  // parallel group talks to the rank with its tp_rank in the next stage.
  const ModelShard& sh = model_.shard();
  const int prev = (sh.pp_rank - 1) * sh.tp_size + sh.tp_rank, next = (sh.pp_rank + 1) * sh.tp_size + sh.tp_rank;
  const int last_stage_lead = (sh.pp_size - 1) * sh.tp_size;
  const int rank = comm_->rank();
  const int64_t d = model_.config().n_embd, vocab = model_.config().n_vocab;
  // Micro-batches of about equal token counts, each of at least
  // kMinMicroBatchTokens: every micro-batch streams the stage's weights
  // again, so cutting a memory-bound decode step only adds weight traffic
  // (docs/scaling.md measures it); prefill-sized steps gain.
  constexpr int64_t kMinMicroBatchTokens = 64;
  const std::vector<int32_t> ends = batch.n_tokens() == 0 ? std::vector<int32_t>{}
                                    : micro_batch_ends(batch.n_tokens(), micro_batches_, kMinMicroBatchTokens);
  // The last stage's logits of the whole step, then its pooled rows' hidden states.
  std::vector<float> stage_logits;
  const size_t logits_values = logits_rows.size() * static_cast<size_t>(vocab);
  if (g.last_stage) {
    // A buffer whose send has been received: rank 0 holds at most pp_size
    // steps in flight and takes their logits in order.
    if (sent_logits_.size() >= static_cast<size_t>(sh.pp_size)) {
      comm_->wait_sends(sent_logits_.front().second);
      stage_logits.swap(sent_logits_.front().first);
      sent_logits_.pop_front();
    }
    stage_logits.resize(logits_values + hidden_rows.size() * static_cast<size_t>(d));
  }
  BatchInfo mb;
  std::vector<int32_t> rows, slots;  // a micro-batch's logits rows, and where they go in the step's
  std::vector<int32_t> pooled, pooled_slots;  // the same for its hidden rows
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
    pooled.clear();
    pooled_slots.clear();
    for (size_t j = 0; j < hidden_rows.size(); ++j)
      if (hidden_rows[j] >= r0 && hidden_rows[j] < r1) {
        pooled.push_back(hidden_rows[j] - r0);
        pooled_slots.push_back(static_cast<int32_t>(j));
      }
    const size_t hidden_values = static_cast<size_t>((r1 - r0) * d);
    r0 = r1;
    model_.begin_pass(mb, static_cast<int64_t>(rows.size()));
    Buffer* per_layer = model_.per_layer_input_buffer();
    if (g.first_stage) {
      model_.embed();
    } else {
      pp_comm_->recv(model_.hidden_states(), hidden_values, prev);
      if (per_layer) pp_comm_->recv(*per_layer, static_cast<size_t>(model_.per_layer_input_values()), prev);
    }
    model_.run_layers();
    if (!g.last_stage) {
      // In stream order: rank 0 goes on to its next step without waiting for the next stage.
      pp_comm_->send(model_.hidden_states(), hidden_values, next);
      if (per_layer) pp_comm_->send(*per_layer, static_cast<size_t>(model_.per_layer_input_values()), next);
      continue;
    }
    scratch_.resize(rows.size() * static_cast<size_t>(vocab));
    model_.compute_logits(rows, scratch_.data());
    for (size_t j = 0; j < rows.size(); ++j)
      std::copy_n(scratch_.data() + static_cast<int64_t>(j) * vocab, vocab,
                  stage_logits.data() + static_cast<int64_t>(slots[j]) * vocab);
    if (pooled.empty()) continue;
    scratch_.resize(pooled.size() * static_cast<size_t>(d));
    model_.final_hidden(pooled, scratch_.data());
    for (size_t j = 0; j < pooled.size(); ++j)
      std::copy_n(scratch_.data() + static_cast<int64_t>(j) * d, d,
                  stage_logits.data() + logits_values + static_cast<int64_t>(pooled_slots[j]) * d);
  }
  // The last stage sends the step's logits at once, after its last
  // micro-batch (its tensor-parallel rank 0 does; all of them hold them);
  // rank 0, the first stage, receives them in finish(). Asynchronously: rank
  // 0 may be busy with a later step's first stage, together with ranks that
  // wait for this stage to take their hidden states.
  if (g.last_stage) {
    const uint64_t ticket = rank == last_stage_lead
                                ? comm_->send_async(stage_logits.data(), stage_logits.size() * sizeof(float), 0)
                                : 0;
    sent_logits_.emplace_back(std::move(stage_logits), ticket);
  }
}

void ModelRunner::serve_worker() {
  PAGELLM_CHECK(parallel() && comm_->rank() != 0, "serve_worker runs on ranks other than 0");
  Step step;
  std::vector<uint8_t> bytes;
  for (;;) {
    comm_->recv_any_size(bytes, 0);
    const StepMessage m = decode_step(bytes);
    if (m.kind == StepMessage::Shutdown) return;
    run(m, step);
  }
}

bool ModelRunner::has_kv_block_io() const {
  return !parallel() && model_.backend().supports(Feature::KvBlockIO);
}

namespace {

std::vector<int32_t> shifted(std::span<const BlockId> blocks, int32_t block_shift) {
  std::vector<int32_t> out(blocks.begin(), blocks.end());
  for (int32_t& b : out)
    if (b != kNullBlock) b += block_shift;
  return out;
}

}  // namespace

void ModelRunner::read_kv_blocks(std::span<const BlockId> blocks, int32_t block_shift, uint8_t* dst) {
  PAGELLM_CHECK(!parallel(), "KV blocks are copied to the host on one rank only");
  model_.backend().read_kv_blocks(shifted(blocks, block_shift), dst);
}

void ModelRunner::write_kv_blocks(std::span<const BlockId> blocks, int32_t block_shift, const uint8_t* src) {
  PAGELLM_CHECK(!parallel(), "KV blocks are copied from the host on one rank only");
  model_.backend().write_kv_blocks(shifted(blocks, block_shift), src);
}

void ModelRunner::release_buffers() {
  PAGELLM_CHECK(in_flight_.empty(), "release_buffers: {} steps in flight", in_flight_.size());
  if (parallel())
    for (const auto& step : spare_) comm_->wait_sends(step->last_send);  // their messages may still be in flight
  spare_.clear();
  std::vector<float>().swap(scratch_);
  model_.release_buffers();
}

void ModelRunner::stop_workers() {
  if (!parallel() || comm_->rank() != 0 || workers_stopped_) return;
  workers_stopped_ = true;
  Output unused;
  while (!in_flight_.empty()) finish(unused);
  StepMessage m;
  m.kind = StepMessage::Shutdown;
  Step step;
  send_to_workers(m, step);
  comm_->wait_sends(step.last_send);
}

}  // namespace pagellm
