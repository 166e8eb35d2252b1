#include "bench/kv_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace pagellm::bench {

KvReport run_kv_report(Engine& engine, const KvReportOptions& o, const std::function<void(const std::string&)>& log) {
  std::mt19937_64 rng(o.seed);
  const int32_t vocab = engine.model_config().n_vocab;
  std::uniform_int_distribution<int32_t> token(1, vocab - 1);
  std::uniform_int_distribution<int32_t> in_len(o.min_input, o.max_input);
  std::uniform_int_distribution<int32_t> out_len(o.min_output, o.max_output);
  for (int32_t i = 0; i < o.num_prompts; ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    // Room for at least one output token under a short --max-model-len.
    r.prompt_ids.resize(static_cast<size_t>(std::min(in_len(rng), engine.max_model_len() - 1)));
    for (auto& t : r.prompt_ids) t = token(rng);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = std::max(1, std::min(out_len(rng), engine.max_model_len() -
                                                                  static_cast<int32_t>(r.prompt_ids.size())));
    engine.add_request(std::move(r));
  }
  KvReport rep;
  while (engine.has_unfinished()) {
    engine.step();
    ++rep.steps;
    const KVCacheStats kv = engine.stats().kv;
    if (kv.used_blocks > rep.peak_used) {
      rep.peak_used = kv.used_blocks;
      rep.peak_cached = kv.cached_blocks;
      rep.peak_free = kv.free_blocks;
      rep.peak_fragmentation = kv.fragmentation;
      rep.peak_runs = engine.kv_available_runs();
    }
  }
  const EngineStats s = engine.stats();
  rep.block_size = s.kv.block_size;
  rep.total_blocks = s.kv.total_blocks;
  rep.preemptions = s.metrics.num_preemptions;
  rep.following_allocations = s.kv.following_allocations;
  rep.contiguous_allocations = s.kv.contiguous_allocations;
  if (log) log(fmt::format("kv report: {} requests in {} steps, {} preemptions", o.num_prompts, rep.steps, rep.preemptions));
  return rep;
}

std::string kv_report_summary(const KvReport& r) {
  std::string s = fmt::format(
      "kv report: {} blocks of {} tokens; at the fullest step: {} used, {} cached, {} free; fragmentation {:.1f}%\n"
      "  contiguous placement: {} of {} blocks that followed another went next to it ({:.1f}%)\n"
      "  runs of available blocks at the fullest step (length: count):",
      r.total_blocks, r.block_size, r.peak_used, r.peak_cached, r.peak_free, 100.0 * r.peak_fragmentation,
      r.contiguous_allocations, r.following_allocations, 100.0 * r.contiguous_hit_rate());
  // Power-of-two buckets keep the line short for big pools.
  std::vector<std::pair<int32_t, int64_t>> buckets;
  for (const auto& [len, count] : r.peak_runs) {
    int32_t lo = 1;
    while (lo * 2 <= len) lo *= 2;
    if (buckets.empty() || buckets.back().first != lo) buckets.push_back({lo, 0});
    buckets.back().second += count;
  }
  for (const auto& [lo, count] : buckets)
    s += lo == 1 ? fmt::format(" 1: {}", count) : fmt::format(" {}-{}: {}", lo, 2 * lo - 1, count);
  return s + "\n";
}

nlohmann::json kv_report_json(const KvReport& r) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& [len, count] : r.peak_runs) runs.push_back({{"length", len}, {"count", count}});
  return {{"block_size", r.block_size},
          {"total_blocks", r.total_blocks},
          {"steps", r.steps},
          {"preemptions", r.preemptions},
          {"peak", {{"used", r.peak_used}, {"cached", r.peak_cached}, {"free", r.peak_free},
                    {"fragmentation", r.peak_fragmentation}, {"available_runs", runs}}},
          {"following_allocations", r.following_allocations},
          {"contiguous_allocations", r.contiguous_allocations},
          {"contiguous_hit_rate", r.contiguous_hit_rate()}};
}

}  // namespace pagellm::bench
