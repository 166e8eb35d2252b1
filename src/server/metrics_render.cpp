#include "server/metrics_render.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <ctime>

#include "core/error.h"

namespace pagellm::server {

void HttpCounters::add(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_[{route, status}]++;
}

std::map<std::pair<std::string, int>, int64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

MetricsPrefix metrics_prefix_from_name(const std::string& name) {
  if (name == "pagellm") return MetricsPrefix::Pagellm;
  if (name == "vllm") return MetricsPrefix::Vllm;
  if (name == "both") return MetricsPrefix::Both;
  fail("--metrics-prefix must be pagellm, vllm or both, not '{}'", name);
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);  // shortest round-trip form
}

namespace {

// Names are written without their prefix ("num_requests_running"); the
// writer puts its prefix ("" or "vllm:") before each.
class Writer {
 public:
  Writer(const std::string& model, std::string prefix)
      : labels_("model_name=\"" + escape_label_value(model) + "\""), prefix_(std::move(prefix)) {}

  void header(const std::string& name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {}{} {}\n# TYPE {}{} {}\n", prefix_, name, help, prefix_, name, type);
  }
  void sample(const std::string& name, double v, const std::string& extra_labels = "") {
    out_ += fmt::format("{}{}{{{}{}}} {}\n", prefix_, name, labels_, extra_labels.empty() ? "" : "," + extra_labels,
                        format_metric_value(v));
  }
  void gauge(const std::string& name, double v, const char* help) {
    header(name, "gauge", help);
    sample(name, v);
  }
  void counter(const std::string& name, double v, const char* help) {
    header(name, "counter", help);
    sample(name, v);
  }
  // One family whose samples differ by one label: {label value, sample value} each.
  void by_label(const std::string& name, const char* type, const char* help, const char* label,
                std::initializer_list<std::pair<const char*, double>> samples) {
    header(name, type, help);
    for (const auto& [value, v] : samples) sample(name, v, fmt::format("{}=\"{}\"", label, value));
  }
  void histogram(const std::string& name, const Histogram& h, const char* help) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.counts().size(); ++i) {
      cumulative += h.counts()[i];
      const std::string le = i < h.bounds().size() ? format_metric_value(h.bounds()[i]) : "+Inf";
      sample(name + "_bucket", static_cast<double>(cumulative), "le=\"" + le + "\"");
    }
    sample(name + "_sum", h.sum());
    sample(name + "_count", static_cast<double>(h.count()));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string labels_;
  std::string prefix_;
  std::string out_;
};

}  // namespace

std::string render_metrics(const EngineStats& stats, const std::string& model_name,
                           const std::map<std::pair<std::string, int>, int64_t>& http, MetricsPrefix prefix) {
  if (prefix == MetricsPrefix::Both)
    return render_metrics(stats, model_name, http, MetricsPrefix::Pagellm) +
           render_metrics(stats, model_name, http, MetricsPrefix::Vllm);
  const EngineMetrics& m = stats.metrics;
  Writer w(model_name, prefix == MetricsPrefix::Vllm ? "vllm:" : "pagellm:");
  w.gauge("num_requests_running", static_cast<double>(m.num_requests_running),
          "Number of requests in model execution batches.");
  w.gauge("num_requests_waiting", static_cast<double>(m.num_requests_waiting),
          "Number of requests waiting to be processed.");
  w.gauge("kv_cache_usage_perc", m.kv_cache_usage, "KV-cache usage. 1 means 100 percent usage.");
  w.gauge("kv_blocks_total", static_cast<double>(m.kv_blocks_total), "KV-cache blocks in the pool.");
  w.gauge("kv_blocks_used", static_cast<double>(m.kv_blocks_used),
          "KV-cache blocks held by running or waiting requests.");
  w.by_label("kv_blocks_used_by_kind", "gauge",
             "Used KV-cache blocks by the kind of layers they serve (sliding: sliding-window layers' KV-cache "
             "groups, which hold only the blocks their window sees; mla_latent: multi-head latent attention "
             "layers, one latent vector per token).",
             "kind",
             {{"full", static_cast<double>(m.kv_blocks_used_full)},
              {"sliding", static_cast<double>(m.kv_blocks_used_sliding)},
              {"mla_latent", static_cast<double>(m.kv_blocks_used_mla_latent)}});
  w.gauge("kv_state_slots_total", static_cast<double>(m.kv_state_slots_total),
          "Linear-attention (Gated DeltaNet) state slots: each running sequence of such a model holds one, "
          "a fixed-size state beside its KV blocks (0 for other models).");
  w.gauge("kv_state_slots_used", static_cast<double>(m.kv_state_slots_used),
          "Linear-attention state slots held by sequences.");
  w.gauge("kv_blocks_cached", static_cast<double>(m.kv_blocks_cached),
          "Free KV-cache blocks that still hold a cached prefix.");
  w.gauge("kv_blocks_free", static_cast<double>(m.kv_blocks_free), "Free KV-cache blocks.");
  w.counter("prefix_cache_queries_total", static_cast<double>(m.prefix_cache_queries),
            "Prefix cache queries, in terms of number of queried tokens.");
  w.counter("prefix_cache_hits_total", static_cast<double>(m.prefix_cache_hits),
            "Prefix cache hits, in terms of number of cached tokens.");
  w.counter("num_preemptions_total", static_cast<double>(m.num_preemptions),
            "Cumulative number of preemptions from the engine.");
  w.by_label("preemptions_by_cause_total", "counter",
             "Preemptions by cause: KV blocks ran out, a higher-priority request took the seat, or a request "
             "below its fair share of seats did.",
             "cause",
             {{"kv_cache",
               static_cast<double>(m.num_preemptions - m.num_preemptions_priority - m.num_preemptions_fair)},
              {"priority", static_cast<double>(m.num_preemptions_priority)},
              {"fairness", static_cast<double>(m.num_preemptions_fair)}});
  w.counter("kv_evicted_blocks_total", static_cast<double>(m.kv_evicted_blocks),
            "KV blocks released by sliding eviction (--kv-eviction sliding) as windows moved on.");
  w.gauge("kv_fragmentation", m.kv_fragmentation,
          "Token slots in used KV blocks that hold no token, as a fraction of all slots in used blocks.");
  w.counter("kv_block_allocations_following_total", static_cast<double>(m.kv_following_allocations),
            "KV blocks allocated right after a sequence's last block.");
  w.counter("kv_block_allocations_contiguous_total", static_cast<double>(m.kv_contiguous_allocations),
            "Of those, blocks placed next to the sequence's last block (contiguous placement hits).");
  w.by_label("preemptions_by_mode_total", "counter",
             "Preemptions by how the sequence gets its KV back (swap: host pool; recompute).", "mode",
             {{"recompute", static_cast<double>(m.num_preemptions_recompute)},
              {"swap", static_cast<double>(m.num_preemptions_swap)}});
  w.by_label("kv_swapped_bytes_total", "counter", "KV-cache bytes copied to (out) and from (in) the host pool.",
             "direction",
             {{"out", static_cast<double>(m.swapped_out_bytes)}, {"in", static_cast<double>(m.swapped_in_bytes)}});
  w.gauge("num_requests_swapped", static_cast<double>(m.num_requests_swapped),
          "Sequences whose KV cache is swapped out to the host pool.");
  if (const KvEventCounts& e = stats.kv_events; e.enabled) {
    w.counter("kv_events_published_total", static_cast<double>(e.published), "KV events published on /v1/kv_events.");
    w.counter("kv_events_dropped_total", static_cast<double>(e.dropped),
              "KV events subscribers missed by reading too slowly (each got a fresh snapshot instead).");
    w.counter("kv_events_resyncs_total", static_cast<double>(e.resyncs),
              "Snapshots sent to subscribers that fell behind.");
    w.gauge("kv_events_stored_blocks", static_cast<double>(e.stored_blocks),
            "Blocks the published KV events say are stored now.");
    w.gauge("kv_events_subscribers", static_cast<double>(e.subscribers), "Clients reading /v1/kv_events now.");
  }
  if (const KvTierReport& t = stats.kv_tier; t.enabled) {
    // Per tier (host, disk): one family per figure, labelled by tier.
    const auto per_tier = [&](const char* name, const char* type, const char* help, int64_t TierStats::*field) {
      w.header(name, type, help);
      for (const auto& [tier, st] : t.offload.tiers)
        w.sample(name, static_cast<double>(st.*field), fmt::format("tier=\"{}\"", tier));
    };
    per_tier("kv_offload_blocks", "gauge", "KV blocks held by the offload tier.", &TierStats::blocks);
    per_tier("kv_offload_bytes", "gauge", "Bytes held by the offload tier (disk: whole files).", &TierStats::bytes);
    per_tier("kv_offload_capacity_bytes", "gauge", "Size bound of the offload tier.", &TierStats::capacity_bytes);
    per_tier("kv_offload_stored_blocks_total", "counter", "KV blocks written to the offload tier.",
             &TierStats::stored_blocks);
    per_tier("kv_offload_stored_bytes_total", "counter", "Bytes written to the offload tier.", &TierStats::stored_bytes);
    per_tier("kv_offload_loaded_blocks_total", "counter", "KV blocks read back from the offload tier (its hits).",
             &TierStats::loaded_blocks);
    per_tier("kv_offload_loaded_bytes_total", "counter", "Bytes read back from the offload tier.",
             &TierStats::loaded_bytes);
    per_tier("kv_offload_evicted_blocks_total", "counter", "KV blocks dropped from the offload tier to stay in its bound.",
             &TierStats::evicted_blocks);
    per_tier("kv_offload_rejected_files_total", "counter",
             "Block files ignored and deleted: corrupt, truncated, tampered, or of another model or format.",
             &TierStats::rejected_files);
    per_tier("kv_offload_write_errors_total", "counter", "Failed writes (after one, the disk tier stops storing).",
             &TierStats::write_errors);
    w.counter("kv_offload_hit_tokens_total", static_cast<double>(t.hit_tokens),
              "Prompt tokens brought into the KV cache from the offload tier instead of computed (counted in "
              "cached_tokens and prefix_cache_hits_total).");
    w.counter("kv_offload_imported_blocks_total", static_cast<double>(t.imported_blocks),
              "KV blocks brought into the KV cache from the offload tier, every KV-cache group's.");
    w.counter("kv_offload_dropped_stores_total", static_cast<double>(t.offload.dropped_stores),
              "KV blocks not stored because the offload tier's write queue was full.");
    w.by_label("kv_offload_seconds_total", "counter",
               "Time of the offload tier: copies between the KV cache and host memory on the step thread "
               "(store_copy, load_copy) and its I/O thread's work (store_io, load_io).",
               "op",
               {{"store_copy", t.copy_out_seconds},
                {"store_io", t.offload.store_seconds},
                {"load_io", t.offload.load_seconds},
                {"load_copy", t.copy_in_seconds}});
  }
  w.counter("prompt_tokens_total", static_cast<double>(m.prompt_tokens), "Number of prefill tokens processed.");
  w.counter("generation_tokens_total", static_cast<double>(m.generation_tokens),
            "Number of generation tokens processed.");
  w.counter("engine_steps_total", static_cast<double>(m.num_steps), "Engine iterations (forward passes).");
  w.counter("device_sampled_tokens_total", static_cast<double>(m.tokens_sampled_on_device),
            "Tokens drawn by the backend's sample op, so that only their ids left the device.");
  w.counter("spec_decode_num_drafts_total", static_cast<double>(m.spec_decode_num_drafts),
            "Speculative decoding: verifications of one sequence's drafts.");
  w.counter("spec_decode_num_draft_tokens_total", static_cast<double>(m.spec_decode_num_draft_tokens),
            "Speculative decoding: draft tokens verified.");
  w.counter("spec_decode_num_accepted_tokens_total", static_cast<double>(m.spec_decode_num_accepted_tokens),
            "Speculative decoding: draft tokens accepted.");
  if (!m.spec_decode_accepted_per_pos.empty()) {
    w.header("spec_decode_num_accepted_tokens_per_pos_total", "counter",
             "Speculative decoding: accepted draft tokens by position in the draft (0: first).");
    for (size_t i = 0; i < m.spec_decode_accepted_per_pos.size(); ++i)
      w.sample("spec_decode_num_accepted_tokens_per_pos_total",
               static_cast<double>(m.spec_decode_accepted_per_pos[i]), fmt::format("position=\"{}\"", i));
  }
  const structured::GrammarCompilerStats& g = stats.grammars;
  w.counter("structured_output_compile_requests_total", static_cast<double>(g.requests),
            "Requests with a structured output (each asks the grammar cache once).");
  w.counter("structured_output_cache_hits_total", static_cast<double>(g.cache_hits),
            "Structured-output grammars found in the compiled-grammar cache.");
  w.counter("structured_output_compile_failures_total", static_cast<double>(g.failed),
            "Grammars that failed to compile.");
  w.counter("structured_output_compile_seconds_total", g.compile_seconds,
            "Time spent compiling grammars, in seconds (off the engine's step thread).");
  w.counter("structured_output_compile_over_budget_total", static_cast<double>(g.over_budget),
            "Grammar compiles stopped at their time or memory budget (of the failures).");
  w.counter("structured_output_compile_cancelled_total", static_cast<double>(g.cancelled),
            "Grammar compiles dropped because every request waiting for them left.");
  w.gauge("structured_output_compiles_in_progress", static_cast<double>(g.in_progress),
          "Grammar compiles running now (each in a worker process).");
  w.gauge("structured_output_compiles_queued", static_cast<double>(g.queued),
          "Grammar compiles waiting for a compile worker.");
  w.gauge("structured_output_cached_grammars", static_cast<double>(g.cached),
          "Compiled grammars held in the cache.");
  w.gauge("structured_output_cache_bytes", static_cast<double>(g.cached_bytes),
          "Memory of the compiled grammars in the cache (xgrammar's estimate).");
  w.histogram("structured_output_compile_time_seconds", g.compile_time,
              "Histogram of grammar compile time in seconds (worker process start to result).");

  w.header("request_success_total", "counter", "Count of successfully processed requests.");
  std::map<std::string, int64_t> success = m.request_success;
  for (const char* reason : {"stop", "length", "abort"}) success.emplace(reason, 0);
  for (const auto& [reason, count] : success)
    w.sample("request_success_total", static_cast<double>(count),
             "finished_reason=\"" + escape_label_value(reason) + "\"");

  w.histogram("time_to_first_token_seconds", m.time_to_first_token,
              "Histogram of time to first token in seconds.");
  w.histogram("inter_token_latency_seconds", m.inter_token_latency,
              "Histogram of inter-token latency in seconds.");
  w.histogram("e2e_request_latency_seconds", m.e2e_request_latency,
              "Histogram of end to end request latency in seconds.");
  w.histogram("request_queue_time_seconds", m.request_queue_time,
              "Histogram of time spent in WAITING phase for request.");
  w.histogram("iteration_tokens_total", m.iteration_tokens, "Histogram of number of tokens per engine_step.");
  w.histogram("scheduler_seconds", m.scheduler_seconds, "Histogram of time spent in the scheduler per engine step.");
  w.histogram("batch_fill_ratio", m.batch_fill_ratio,
              "Histogram of tokens scheduled per step over the step's token budget (max_num_batched_tokens).");
  w.by_label("step_forward_seconds_total", "counter",
             "Forward-pass time by phase; a mixed step's time is shared by its prefill and decode tokens.", "phase",
             {{"prefill", m.forward_seconds_prefill}, {"decode", m.forward_seconds_decode}});
  w.by_label("step_tokens_total", "counter", "Tokens computed by phase (decode: one token behind, with its drafts).",
             "phase",
             {{"prefill", static_cast<double>(m.step_tokens_prefill)},
              {"decode", static_cast<double>(m.step_tokens_decode)}});

  if (!http.empty()) {
    w.header("http_requests_total", "counter", "HTTP responses by route and status code.");
    for (const auto& [key, count] : http)
      w.sample("http_requests_total", static_cast<double>(count),
               fmt::format("route=\"{}\",status=\"{}\"", escape_label_value(key.first), key.second));
  }
  if (stats.max_loras > 0) {
    // vLLM's shape: the adapters are labels (comma-separated names); the value is the sample's time.
    const auto names = [](const std::vector<std::string>& v) {
      return escape_label_value(fmt::format("{}", fmt::join(v, ",")));
    };
    w.header("lora_requests_info", "gauge", "Running stats on LoRA requests: the adapters of running and waiting "
             "requests, and --max-loras, as labels; the value is the time of the sample.");
    w.sample("lora_requests_info", static_cast<double>(std::time(nullptr)),
             fmt::format("running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\",max_lora=\"{}\"",
                         names(stats.running_loras), names(stats.waiting_loras), stats.max_loras));
  }
  return w.take();
}

}  // namespace pagellm::server
