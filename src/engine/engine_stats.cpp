// What Engine reports about itself: its stats and Prometheus gauges (every
// virtual engine's scheduler summed), its one-line description, the time per
// step phase, and the invariant checks tests run between steps.
#include "engine/engine.h"

#include <fmt/ranges.h>

#include <map>

#include "core/util.h"
#include "kv/kv_sizing.h"
#include "dist/communicator.h"
#include "engine/prefix_tier.h"
#include "engine/request_state.h"

namespace pagellm {

void Engine::check_invariants() const {
  for (const auto& s : schedulers_) s->check_invariants();
}

std::vector<std::pair<int32_t, int32_t>> Engine::kv_available_runs() const {
  std::map<int32_t, int32_t> runs;
  for (const auto& s : schedulers_)
    for (const auto& [length, n] : s->kv().pool().available_runs()) runs[length] += n;
  return {runs.begin(), runs.end()};
}

std::string Engine::describe() const {
  const int64_t per_block = static_cast<int64_t>(backend_->kv_cache_spec().bytes_per_block());
  // vLLM's "maximum concurrency": sequences of max_model_len the pool holds at once.
  const int32_t per_seq = kv_blocks_per_seq(kv_config_.groups, kv_config_.block_size, sched_config_.max_model_len,
                                            sched_config_.max_num_batched_tokens);
  std::string groups =
      kv_config_.groups.size() > 1 ? fmt::format(", groups {}", describe_kv_groups(kv_config_.groups)) : "";
  if (kv_config_.num_state_slots > 0) {
    // Linear-attention layers: a fixed-size state per sequence, beside the blocks.
    const KVCacheSpec& spec = backend_->kv_cache_spec();
    const int64_t slots = static_cast<int64_t>(kv_config_.num_state_slots) * static_cast<int64_t>(schedulers_.size());
    groups += fmt::format(", linear-attention states: {} slots x {} ({} layers){}", slots,
                          format_bytes(static_cast<int64_t>(spec.state.bytes_per_slot())), spec.state.n_layers,
                          kv_config_.state_snapshots ? " and as many snapshots" : "");
  }
  return fmt::format("{}; weights {}; KV cache {} blocks x {} tokens ({} {}{}; {:.2f} sequences of max_model_len {}); "
                     "{}",
                     model_config().describe(), format_bytes(static_cast<int64_t>(model_->weight_bytes())),
                     kv_config_.num_blocks - 1, kv_config_.block_size,
                     format_bytes(per_block * kv_config_.num_blocks), dtype_name(config_.kv_cache_dtype), groups,
                     static_cast<double>(kv_config_.num_blocks - 1) / per_seq, sched_config_.max_model_len,
                     backend_->describe()) +
         (proposer_ ? fmt::format("; {}: {}", config_.speculative.describe(), proposer_->describe()) : "") +
         (comm_ ? fmt::format("; tensor parallel {} x pipeline parallel {} over {}", config_.tensor_parallel_size,
                              config_.pipeline_parallel_size, comm_->describe())
                : "") +
         (config_.pipeline_parallel_size > 1
              ? fmt::format(" (layers per stage {})", fmt::join(model_->geometry().stage_layers, ","))
              : "") +
         (schedulers_.size() > 1 ? fmt::format("; {} steps in flight (virtual engines)", schedulers_.size()) : "") +
         (model_->lora_slots() ? fmt::format("; LoRA: {} adapter slots of rank {} ({} {})",
                                             model_->lora_slots()->max_loras(), model_->lora_slots()->max_rank(),
                                             format_bytes(static_cast<int64_t>(model_->lora_slots()->bytes())),
                                             dtype_name(model_->lora_slots()->dtype()))
                               : "");
}

std::string Engine::profile_report() const {
  const double total = static_cast<double>(phase_ns_[0] + phase_ns_[1] + phase_ns_[2] + phase_ns_[3]);
  if (total <= 0) return "no steps run";
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string report =
      fmt::format("{} steps: schedule {:.1f} ms, forward {:.1f} ms [{}], sample+stop+detokenize {:.1f} ms",
                  metrics_.num_steps, ms(phase_ns_[0]), ms(phase_ns_[1]), backend_->profile_report(), ms(phase_ns_[2]));
  if (proposer_) {
    report += fmt::format(", propose {:.1f} ms", ms(phase_ns_[3]));
    const std::string p = proposer_->profile_report();
    if (!p.empty()) report += " [" + p + "]";
  }
  return report;
}

// All virtual engines together.
KVCacheStats Engine::kv_stats() const {
  KVCacheStats t;
  double fragmented_slots = 0;
  for (const auto& sch : schedulers_) {
    const KVCacheStats k = sch->kv_stats();
    t.block_size = k.block_size;
    t.total_blocks += k.total_blocks;
    t.used_blocks += k.used_blocks;
    t.cached_blocks += k.cached_blocks;
    t.free_blocks += k.free_blocks;
    t.prefix_query_tokens += k.prefix_query_tokens;
    t.prefix_hit_tokens += k.prefix_hit_tokens;
    t.evictions += k.evictions;
    t.following_allocations += k.following_allocations;
    t.contiguous_allocations += k.contiguous_allocations;
    fragmented_slots += k.fragmentation * k.used_blocks;
    t.groups = k.groups;
    t.group_used_blocks.resize(k.group_used_blocks.size());
    for (size_t g = 0; g < k.group_used_blocks.size(); ++g) t.group_used_blocks[g] += k.group_used_blocks[g];
    t.state_slots += k.state_slots;
    t.used_state_slots += k.used_state_slots;
  }
  t.fragmentation = t.used_blocks ? fragmented_slots / t.used_blocks : 0.0;
  return t;
}

void Engine::update_gauges() {
  const KVCacheStats kv = kv_stats();
  metrics_.kv_blocks_total = kv.total_blocks;
  metrics_.kv_blocks_used = kv.used_blocks;
  metrics_.kv_blocks_cached = kv.cached_blocks;
  metrics_.kv_blocks_free = kv.free_blocks;
  metrics_.kv_cache_usage = kv.usage();
  metrics_.kv_fragmentation = kv.fragmentation;
  metrics_.kv_following_allocations = kv.following_allocations;
  metrics_.kv_contiguous_allocations = kv.contiguous_allocations;
  metrics_.kv_blocks_used_full = metrics_.kv_blocks_used_sliding = metrics_.kv_blocks_used_mla_latent = 0;
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    const KvGroupKind kind = kv.groups[g].kind;
    (kind == KvGroupKind::Full      ? metrics_.kv_blocks_used_full
     : kind == KvGroupKind::Sliding ? metrics_.kv_blocks_used_sliding
                                    : metrics_.kv_blocks_used_mla_latent) += kv.group_used_blocks[g];
  }
  metrics_.kv_state_slots_total = kv.state_slots;
  metrics_.kv_state_slots_used = kv.used_state_slots;
  const int64_t block_bytes = static_cast<int64_t>(backend_->kv_cache_spec().bytes_per_block());
  metrics_.num_requests_running = metrics_.num_requests_waiting = metrics_.num_requests_swapped = 0;
  metrics_.prefix_cache_queries = metrics_.prefix_cache_hits = 0;
  metrics_.num_preemptions = metrics_.kv_evicted_blocks = 0;
  metrics_.num_preemptions_recompute = metrics_.num_preemptions_swap = metrics_.num_preemptions_priority = 0;
  metrics_.num_preemptions_fair = 0;
  metrics_.swapped_out_bytes = metrics_.swapped_in_bytes = 0;
  for (const auto& sch : schedulers_) {
    metrics_.num_requests_running += sch->num_running();
    metrics_.num_requests_waiting += sch->num_waiting();
    metrics_.num_requests_swapped += sch->num_swapped();
    metrics_.prefix_cache_queries += sch->prefix_query_tokens();
    metrics_.prefix_cache_hits += sch->prefix_hit_tokens();
    metrics_.num_preemptions += sch->num_preemptions();
    metrics_.kv_evicted_blocks += sch->num_evicted_blocks();
    metrics_.num_preemptions_recompute += sch->num_preemptions_recompute();
    metrics_.num_preemptions_swap += sch->num_preemptions_swap();
    metrics_.num_preemptions_priority += sch->num_preemptions_priority();
    metrics_.num_preemptions_fair += sch->num_preemptions_fair();
    metrics_.swapped_out_bytes += sch->num_blocks_swapped_out() * block_bytes;
    metrics_.swapped_in_bytes += sch->num_blocks_swapped_in() * block_bytes;
  }
  // Requests whose grammar is still compiling wait as well (outside the schedulers).
  metrics_.num_requests_waiting += static_cast<int64_t>(waiting_for_grammar_.size());
  if (prefix_tier_) metrics_.num_requests_waiting += prefix_tier_->num_loading();  // ... or their prefix to load
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.metrics = metrics_;
  s.kv = kv_stats();
  s.num_unfinished_requests = static_cast<int64_t>(requests_.size());
  s.grammars = grammars_->stats();
  if (prefix_tier_) s.kv_tier = prefix_tier_->stats();
  if (kv_events_) s.kv_events = kv_events_->counts();
  if (lora_) {
    s.loras = lora_->list();
    s.max_loras = lora_->config().max_loras;
    for (const auto& [id, r] : requests_) {
      if (!r->lora) continue;
      const Sequence* seq = r->samples.front().seq.get();
      auto& names = seq && seq->status == SeqStatus::Running ? s.running_loras : s.waiting_loras;
      const std::string name = lora_->name_of(r->lora->id());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    std::sort(s.running_loras.begin(), s.running_loras.end());
    std::sort(s.waiting_loras.begin(), s.waiting_loras.end());
  }
  return s;
}

}  // namespace pagellm
