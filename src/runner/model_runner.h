// ModelRunner: turns a StepPlan into ONE forward pass over every scheduled
// token (prefill chunks and decodes mixed) and returns the logits of the
// sequences that sample this step. It never looks at requests or text.
//
// Under tensor or pipeline parallelism (a communicator of several ranks) the
// runner on rank 0 sends each step's block moves and batch to every other
// rank, where serve_worker runs its shard of the same pass. With pipeline
// stages a step is cut into micro-batches of tokens that flow through the
// stages one after another (GPipe's schedule, forward only), and rank 0 (the
// first stage) may submit the next step before the last stage has finished
// this one: its sends are asynchronous, and finish() collects the logits of
// the oldest step. Steps are finished in the order they were submitted.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runner/step_message.h"
#include "scheduler/step_plan.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

class ModelRunner {
 public:
  // comm: the ranks the model is sharded over (model.shard() says how), or
  // null for one rank. micro_batches: per step under pipeline parallelism
  // (0: twice the number of stages).
  explicit ModelRunner(Model& model, dist::Communicator* comm = nullptr, int micro_batches = 0);

  struct Output {
    std::vector<int32_t> entries;    // indices into plan.seqs that sample (sample == true)
    // Per entry: its first row of logits. Entry i has plan.seqs[entries[i]].num_logits()
    // consecutive rows: one per draft token, then the one after the last.
    std::vector<int32_t> first_row;
    // Prompt logprobs: indices into plan.seqs with num_prompt_logits > 0, and
    // the row of each one's first prompt position (its rows come just
    // before its sampling row, if any).
    std::vector<int32_t> prompt_entries, prompt_first_row;
    // Pooling: indices into plan.seqs with num_hidden > 0, each one's first
    // row in `hidden` ([rows, n_embd], final hidden states after the output norm).
    std::vector<int32_t> hidden_entries, hidden_first_row;
    std::vector<float> hidden;
    std::vector<float> logits;       // [rows, n_vocab]; empty when the device sampled
    std::vector<int32_t> tokens;     // per entry, when the device sampled (submit's draws)
    // Row j of entry i.
    const float* row(size_t i, int32_t j, int n_vocab) const {
      return logits.data() + static_cast<size_t>(first_row[i] + j) * static_cast<size_t>(n_vocab);
    }
    // Row j (prompt position start_pos + j) of prompt entry i.
    const float* prompt_row(size_t i, int32_t j, int n_vocab) const {
      return logits.data() + static_cast<size_t>(prompt_first_row[i] + j) * static_cast<size_t>(n_vocab);
    }
  };

  // Performs the plan's block moves (swap-out, swap-in, copy-on-write), then
  // the forward pass over its tokens, if any: submit() then finish().
  void execute(const StepPlan& plan, Output& out);
  // Starts a step. block_shift: added to the plan's block ids (not to the
  // null block 0), when the plan's scheduler owns the blocks from
  // block_shift + 1 on. Under pipeline parallelism it returns once the first
  // stage's share is done; otherwise the step is complete.
  // draws (one per sampling entry, see samples_on_device): the backend
  // samples, and the step returns token ids instead of logits.
  void submit(const StepPlan& plan, int32_t block_shift = 0, const std::vector<SampleDraw>* draws = nullptr);
  // Whether submit may be given draws: one rank, and the backend has the sample op.
  bool samples_on_device() const { return samples_on_device_; }
  // The oldest submitted step's logits.
  void finish(Output& out);

  // No step in flight: frees what the largest step grew on this rank (logits,
  // the model's activations); the next step allocates what it needs.
  void release_buffers();

  // The KV offload tier: whole blocks (a scheduler's ids, shifted by
  // block_shift as in submit) to host bytes and back, between steps; one
  // rank only. Backend::read_kv_blocks says the layout.
  bool has_kv_block_io() const;
  void read_kv_blocks(std::span<const BlockId> blocks, int32_t block_shift, uint8_t* dst);
  void write_kv_blocks(std::span<const BlockId> blocks, int32_t block_shift, const uint8_t* src);

  // Rank > 0: runs the steps rank 0 sends until it sends stop.
  void serve_worker();
  // Rank 0: finishes the steps in flight and tells the workers to stop
  // (once; later calls do nothing).
  void stop_workers();

 private:
  // A step between submit() and finish(); on a worker, the one it runs.
  struct Step {
    std::vector<int32_t> entries, first_row, prompt_entries, prompt_first_row;  // Output's
    std::vector<int32_t> hidden_entries, hidden_first_row, hidden_rows;  // Output's, and the batch rows
    std::vector<float> hidden;
    size_t rows = 0;                          // of logits
    std::vector<float> logits;                // computed here (one stage; else the last stage sends them)
    std::vector<SampleDraw> draws;            // sampled on the device instead ...
    std::vector<int32_t> tokens;              // ... into these
    std::vector<uint8_t> message;             // encoded, sent asynchronously
    uint64_t last_send = 0;                   // ticket of its last asynchronous send
  };

  bool parallel() const;
  void build_message(const StepPlan& plan, int32_t block_shift, Step& step);
  void send_to_workers(const StepMessage& m, Step& step);
  void run(const StepMessage& m, Step& step);
  void pipeline_forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows,
                        const std::vector<int32_t>& hidden_rows, Step& step);

  Model& model_;
  dist::Communicator* comm_;
  int micro_batches_;
  bool workers_stopped_ = false;
  bool samples_on_device_ = false;
  std::unique_ptr<DeviceComm> pp_comm_;  // pipeline stages' hidden states, on device buffers
  StepMessage msg_;  // reused across steps
  std::deque<std::unique_ptr<Step>> in_flight_, spare_;
  std::vector<float> scratch_;  // a micro-batch's logits
  // The last stage: logits of recent steps, with their send's ticket.
  std::deque<std::pair<std::vector<float>, uint64_t>> sent_logits_;
};

}  // namespace pagellm
