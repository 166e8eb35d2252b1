#include "bench/serve_metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace pagellm::bench {

ServeMetrics compute_serve_metrics(const std::vector<RequestRecord>& records, double duration_s) {
  constexpr size_t kMaxErrors = 5;
  ServeMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.failed;
      if (m.errors.size() < kMaxErrors && std::find(m.errors.begin(), m.errors.end(), r.error) == m.errors.end())
        m.errors.push_back(r.error);
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2el.push_back(r.latency_s);
    if (r.output_tokens > 1) tpot.push_back((r.latency_s - r.ttft_s) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
  }
  m.ttft_s = summarize(ttft);
  m.tpot_s = summarize(tpot);
  m.itl_s = summarize(itl);
  m.e2el_s = summarize(e2el);
  return m;
}

nlohmann::json serve_metrics_json(const ServeMetrics& m) {
  return {{"completed", m.completed},
          {"failed", m.failed},
          {"duration_s", m.duration_s},
          {"total_input_tokens", m.total_input_tokens},
          {"total_output_tokens", m.total_output_tokens},
          {"request_throughput", m.request_throughput},
          {"output_throughput", m.output_throughput},
          {"total_token_throughput", m.total_token_throughput},
          {"ttft_ms", to_json(m.ttft_s, 1000)},
          {"tpot_ms", to_json(m.tpot_s, 1000)},
          {"itl_ms", to_json(m.itl_s, 1000)},
          {"e2el_ms", to_json(m.e2el_s, 1000)},
          {"errors", m.errors}};
}

std::string serve_metrics_summary(const ServeMetrics& m) {
  std::string s = fmt::format(
      "serve: {} completed, {} failed in {:.2f} s\n"
      "  requests/s           {:.3f}\n"
      "  output tokens/s      {:.2f}\n"
      "  total tokens/s       {:.2f}\n"
      "  {:<6} {:>10} {:>10} {:>10} {:>10} (ms)\n",
      m.completed, m.failed, m.duration_s, m.request_throughput, m.output_throughput, m.total_token_throughput,
      "", "mean", "p50", "p90", "p99");
  auto row = [&](const char* name, const Summary& x) {
    if (x.count == 0) return fmt::format("  {:<6} {:>10}\n", name, "-");
    return fmt::format("  {:<6} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", name, x.mean * 1000, x.median * 1000,
                       x.p90 * 1000, x.p99 * 1000);
  };
  s += row("TTFT", m.ttft_s);
  s += row("TPOT", m.tpot_s);
  s += row("ITL", m.itl_s);
  s += row("E2EL", m.e2el_s);
  for (const std::string& e : m.errors) s += fmt::format("  error: {}\n", e);
  return s;
}

}  // namespace pagellm::bench
