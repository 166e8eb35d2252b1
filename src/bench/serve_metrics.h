// What one streamed request measured, and the aggregate figures of a serving
// benchmark, defined as in vLLM's benchmark_serving.py: TTFT (time to first
// token), TPOT (time per output token after the first), ITL (gaps between
// successive streamed chunks, over all requests), E2EL (end-to-end latency).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace pagellm::bench {

struct RequestRecord {
  bool success = false;
  std::string error;
  int32_t prompt_tokens = 0;   // as intended (text prompts: approximately)
  int32_t output_tokens = 0;   // usage.completion_tokens, else the chunks with text
  double start_s = 0;          // since the benchmark started
  double ttft_s = 0;
  double latency_s = 0;
  std::vector<double> itl_s;   // gaps between successive chunks with text
  int32_t turn = 0;            // multi-turn runs: the turn of its conversation (0: the first)
};

struct ServeMetrics {
  int32_t completed = 0, failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0;       // completed requests / s
  double output_throughput = 0;        // output tokens / s
  double total_token_throughput = 0;   // (input + output) tokens / s
  Summary ttft_s, tpot_s, itl_s, e2el_s;
  std::vector<std::string> errors;     // the first few distinct ones
};

// Successful requests count; failed ones only add to `failed` and `errors`.
ServeMetrics compute_serve_metrics(const std::vector<RequestRecord>& records, double duration_s);

// Throughputs and counts as numbers; latencies in milliseconds as
// {mean, median, p90, p99, min, max, stddev, count} per metric.
nlohmann::json serve_metrics_json(const ServeMetrics& m);
std::string serve_metrics_summary(const ServeMetrics& m);

}  // namespace pagellm::bench
