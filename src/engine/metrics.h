// Engine counters and latency histograms, kept by the engine and rendered by
// the server as Prometheus text. Names follow vLLM's metrics.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/histogram.h"

namespace pagellm {

struct EngineMetrics {
  // Gauges (set every step).
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, kv_blocks_free = 0;
  double kv_cache_usage = 0;  // used / total
  double kv_fragmentation = 0;
  // Used blocks by the kind of KV-cache group whose tables hold them.
  int64_t kv_blocks_used_full = 0, kv_blocks_used_sliding = 0, kv_blocks_used_mla_latent = 0;
  int64_t kv_state_slots_total = 0, kv_state_slots_used = 0;  // linear-attention states (one per running sequence)
  // Blocks allocated right after a sequence's last block, and those placed
  // next to it (contiguous placement's hits).
  int64_t kv_following_allocations = 0, kv_contiguous_allocations = 0;
  // Counters.
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t kv_evicted_blocks = 0;  // --kv-eviction sliding: blocks that left a window
  int64_t num_preemptions_recompute = 0, num_preemptions_swap = 0;
  int64_t num_preemptions_priority = 0;  // by cause: for a higher-priority request (the rest: KV blocks)
  int64_t num_preemptions_fair = 0;      // ... for a request below its fair share of seats
  // Forward time and tokens by phase: a step's time is shared between its
  // prefill and decode tokens in proportion (decode: one token behind, with
  // its drafts).
  double forward_seconds_prefill = 0, forward_seconds_decode = 0;
  int64_t step_tokens_prefill = 0, step_tokens_decode = 0;
  int64_t swapped_out_bytes = 0, swapped_in_bytes = 0;
  int64_t num_requests_swapped = 0;  // gauge: sequences whose KV is in the host pool
  int64_t num_steps = 0;
  int64_t tokens_sampled_on_device = 0;  // drawn by the backend's sample op (only ids left it)
  std::map<std::string, int64_t> request_success;  // finish reason -> count
  // Speculative decoding (vLLM's names): verifications with drafts, drafts
  // verified, drafts accepted, and accepted drafts by position (0: first).
  int64_t spec_decode_num_drafts = 0, spec_decode_num_draft_tokens = 0, spec_decode_num_accepted_tokens = 0;
  std::vector<int64_t> spec_decode_accepted_per_pos;  // [num_speculative_tokens]
  // Histograms (seconds, tokens).
  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram e2e_request_latency;
  Histogram request_queue_time;
  Histogram iteration_tokens;
  Histogram scheduler_seconds;  // time in Scheduler::schedule() per step
  Histogram batch_fill_ratio;   // tokens scheduled / max_num_batched_tokens, per step

  EngineMetrics();
};

}  // namespace pagellm
