// EngineStats (+ the server's own HTTP counters) -> Prometheus text format
// 0.0.4, named as vLLM's metrics with the pagellm: prefix and labelled
// model_name="...". deploy/grafana-dashboard.json plots these names.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/async_engine.h"

namespace pagellm::server {

// Responses by route and status code, counted by the HTTP layer.
class HttpCounters {
 public:
  void add(const std::string& route, int status);
  std::map<std::pair<std::string, int>, int64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

// A label value escaped for the text format (backslash, quote, newline).
std::string escape_label_value(const std::string& v);
// A sample value as Prometheus clients write it: "1.0", "0.25", "+Inf", "NaN".
std::string format_metric_value(double v);

// Which names /metrics uses (--metrics-prefix): pagellm:..., vLLM's vllm:...
// (so vLLM's dashboards and alerts work unchanged), or both. The names after
// the prefix are vLLM's wherever vLLM has the series.
enum class MetricsPrefix : uint8_t { Pagellm, Vllm, Both };
MetricsPrefix metrics_prefix_from_name(const std::string& name);  // throws Error

std::string render_metrics(const EngineStats& stats, const std::string& model_name,
                           const std::map<std::pair<std::string, int>, int64_t>& http = {},
                           MetricsPrefix prefix = MetricsPrefix::Pagellm);

}  // namespace pagellm::server
