// Drafts from a smaller model with the target's vocabulary. The draft model
// has its own backend instance, its own paged KV cache and block tables, and
// keeps per sequence the tokens its cache holds: each step it computes the
// tokens the target accepted since (a prefill on first sight, with prefix
// caching), then proposes k tokens one decode pass at a time, every pass
// batched over all sequences that speculate. After a rejection it rolls its
// cache back to the tokens the target kept; a preempted sequence keeps its
// draft cache until memory is needed for another.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/backend.h"
#include "backend/registry.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "runner/model_runner.h"
#include "sampling/sampler.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

struct DraftModelOptions {
  std::string model;  // GGUF file or Hugging Face folder
  std::string device = "cpu";
  BackendOptions backend_options;
  int32_t block_size = 16;
  int32_t num_blocks = 0;  // its own pool, including the null block
  DType kv_cache_dtype = DType::F16;
  bool enable_prefix_caching = true;
  int32_t max_model_len = 0;
  bool profile = false;
  bool deterministic = false;  // the target's --deterministic
};

class DraftModelProposer : public Proposer {
 public:
  // Loads the draft and checks that its vocabulary is the target's, token for
  // token; throws Error naming the first difference otherwise.
  DraftModelProposer(const DraftModelOptions& options, const Tokenizer& target_tokenizer, int32_t target_n_vocab,
                     const LoadProgress& progress = {});
  ~DraftModelProposer() override;

  void propose(std::span<DraftRequest> requests) override;
  void release(SeqId seq) override;
  std::string describe() const override;
  std::string profile_report() const override;
  double seconds_per_pass() const override { return pass_seconds_; }


 private:
  struct State {
    Sequence seq;  // the target's tokens, then this step's drafts; computed: in the draft cache
  };
  // Makes the draft cache hold the target's tokens up to its last one and
  // plans computing the rest; false when no blocks are left for it.
  bool catch_up(const DraftRequest& r, State& st, std::span<const DraftRequest> wanted);
  bool allocate(SeqId id, int32_t computed, int32_t n, std::span<const DraftRequest> wanted,
                SlotAllocation& alloc);
  // Draws a draft from `row` for request r (greedy: argmax; else from the
  // processed distribution, writing q to `probs`).
  TokenId draw(const DraftRequest& r, const Sequence& seq, float* row, float* probs);

  DraftModelOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KVCacheManager> kv_;
  std::unique_ptr<ModelRunner> runner_;
  Sampler sampler_;
  ModelRunner::Output out_;
  int32_t n_vocab_ = 0;
  int32_t max_len_ = 0;  // positions the draft may use
  std::unordered_map<SeqId, State> states_;
  int64_t forward_ns_ = 0, passes_ = 0, tokens_ = 0;
  double pass_seconds_ = 0;  // moving average of the one-token passes
};

}  // namespace pagellm
