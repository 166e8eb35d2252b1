// PrefixTier: the engine's side of the KV offload tier (kv/kv_offload.h),
// the prefix cache's second level. Internal to src/engine.
//
// Store (write-through): after each step, the blocks the scheduler committed
// (full, with their hash) are copied out of the pool by the runner and
// queued for the tier's I/O thread, unless the tier has them already. So a
// block evicted from the pool later costs nothing, and a restart finds what
// the disk tier kept.
//
// Load: a new sequence whose prompt continues past the pool's prefix hit
// into blocks the tier holds does not go to the scheduler yet: the I/O thread
// reads those blocks (the request waits, as for a grammar compile). Once
// read, the scheduler's KV manager takes fresh blocks for them, registered
// as cached (import_prefix), the runner fills them, and the sequence is
// added; its admission then finds them as prefix-cache hits (cached_tokens
// counts them). The imported blocks stay pinned until the sequence is
// admitted (or a few dozen steps pass), and pins hold at most half the pool.
// A sequence near the head of a scheduler's waiting queue (preempted, or an
// n > 1 sample waiting for a seat) gets the blocks the pool lacks loaded the
// same way, while it stays in the queue; loaded blocks the full pool has no
// room for yet are kept and offered again at the next steps, not read again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/request_state.h"
#include "kv/kv_offload.h"
#include "runner/model_runner.h"
#include "scheduler/scheduler.h"

namespace pagellm {

class PrefixTier {
 public:
  // Null when the config asks for no tier, or it cannot run here (the
  // reason is logged: no prefix caching, linear-attention states, an
  // encoder, parallel ranks, sliding KV eviction, a draft model, a backend
  // without block copies, no tier that opens).
  static std::unique_ptr<PrefixTier> create(const EngineConfig& config, Model& model, const KVCacheConfig& kv_config,
                                            const SchedulerConfig& sched, ModelRunner& runner, bool parallel,
                                            const LoraRegistry* lora);

  // After a scheduler's step is done: store its committed blocks.
  void store_committed(Scheduler& scheduler, int32_t block_shift, const SeqOwners& owners);
  // A sequence about to be added: true when part of its prefix is loading
  // (the engine adds it once take_ready() returns it).
  bool begin_load(Sequence& seq, const Scheduler& scheduler, int32_t ve);
  // Before scheduler ve plans a step: sequences near the head of its waiting
  // queue (preempted ones, n > 1 samples waiting for a seat; they stay
  // there) have the blocks of their prefix that the pool lacks and the tier
  // holds loaded and imported, pinned, so that their admission finds them.
  // One admitted before its load is done computes them as before.
  void prefetch_waiting(const Scheduler& scheduler, int32_t ve);
  // Sequences whose loads are done, their blocks imported into their
  // scheduler's pool and filled: add them now.
  std::vector<Sequence*> take_ready(std::span<const std::unique_ptr<Scheduler>> schedulers,
                                    std::span<const int32_t> block_shifts);
  bool loading() const { return !loads_.empty(); }
  // Sequences not in a scheduler yet because their prefix is loading.
  int32_t num_loading() const {
    return static_cast<int32_t>(std::count_if(loads_.begin(), loads_.end(), [](const Load& l) { return !l.resident; }));
  }
  // Waits up to the timeout for a load to finish (an otherwise idle engine).
  void wait_for_load(int milliseconds) const;
  // After scheduler ve planned a step: release the pins of sequences it admitted.
  void after_schedule(Scheduler& scheduler, int32_t ve);
  // A sequence leaves (abort): its load is dropped, its pin released.
  void forget(SeqId seq, std::span<const std::unique_ptr<Scheduler>> schedulers);

  KvTierReport stats() const;
  void flush() { offload_->flush(); }  // tests

 private:
  PrefixTier(std::unique_ptr<KvOffload> offload, ModelRunner& runner, const LoraRegistry* lora, int32_t block_size);
  const TierKey& fingerprint() const { return offload_->config().fingerprint; }
  // Keys of blocks [0, n) of the sequence's chain (group 0).
  std::vector<TierKey> chain_keys(const Sequence& seq, int32_t n);
  void extend_chain(const Sequence& seq, int32_t n, std::vector<TierKey>& chain);
  uint64_t adapter_fingerprint(int32_t lora_id);
  static bool waits(const Sequence& seq);  // waiting or preempted: not admitted (yet)
  // resident: the sequence stays in its scheduler; else it joins it once loaded.
  bool start_load(Sequence& seq, const KVCacheManager& kv, int32_t ve, bool resident);

  struct Load {
    Sequence* seq = nullptr;
    int32_t ve = 0;
    int32_t max_blocks = 0;
    std::shared_ptr<TierLoad> job;
    std::vector<int32_t> index;  // each job block's place in the sequence
    bool resident = false;       // the sequence waits in its scheduler (prefetch_waiting)
    int32_t retries = 0;         // resident: steps its blocks found too little room
  };
  struct Pin {
    const Sequence* seq = nullptr;
    int32_t ve = 0;
    int32_t pin = -1;
    int32_t steps = 0;
  };

  std::unique_ptr<KvOffload> offload_;
  ModelRunner& runner_;
  const LoraRegistry* lora_;
  int32_t block_size_;
  std::vector<Load> loads_;  // arrival order: sequences join their scheduler in it
  std::unordered_map<SeqId, Pin> pins_;
  // A waiting sequence -> its scheduler and the steps before its next prefetch.
  std::unordered_map<SeqId, std::pair<int32_t, int32_t>> backoff_;
  std::unordered_map<int32_t, uint64_t> adapter_fps_;
  KvTierReport st_;
};

}  // namespace pagellm
