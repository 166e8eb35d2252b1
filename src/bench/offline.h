// Offline benchmarks on an in-process Engine, modelled on vLLM's
// benchmark_latency.py and benchmark_throughput.py. Prompts are random token
// ids (seeded, fresh every iteration so the prefix cache cannot serve them),
// decoding is greedy with ignore_eos, so every request makes exactly
// output_len tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace pagellm {
class Engine;
}

namespace pagellm::bench {

using Log = std::function<void(const std::string&)>;

// One batch of requests run to completion.
struct BatchTiming {
  double first_token_s = 0;   // submit -> the step that gave every request its first token
  double end_s = 0;           // submit -> the step that finished the last request
  int32_t steps_to_first = 0; // steps until then (1 unless the prompts were chunked)
  int32_t steps = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache served (0 expected)
  int64_t preemptions = 0;
};

// Submits `batch_size` requests of `input_len` random ids (seeded with
// `seed`), greedy, ignore_eos, max_tokens `output_len`, all at once, and
// steps the engine until they finish. Throws Error when a request fails.
BatchTiming run_batch(Engine& engine, int32_t batch_size, int32_t input_len, int32_t output_len, uint64_t seed);

// Output tokens of a latency warm-up iteration at most.
constexpr int32_t kWarmupOutputLen = 16;

struct LatencyOptions {
  std::vector<int32_t> input_lens = {128};
  int32_t output_len = 128;
  int32_t batch_size = 1;
  int32_t num_iters = 5;
  int32_t num_iters_warmup = 1;  // each with at most kWarmupOutputLen output tokens
  uint64_t seed = 0;
  void validate() const;
};

struct LatencyCase {
  int32_t input_len = 0, output_len = 0, batch_size = 0;
  std::vector<BatchTiming> iterations;  // measured ones only
  // Per iteration: batch * input_len / first_token_s.
  std::vector<double> prefill_tokens_per_s() const;
  // Per iteration: batch * (output_len - 1) / (end_s - first_token_s); empty
  // when output_len is 1.
  std::vector<double> decode_tokens_per_s() const;
};

std::vector<LatencyCase> run_latency(Engine& engine, const LatencyOptions& opts, const Log& log = {});
nlohmann::json latency_json(const std::vector<LatencyCase>& cases);
std::string latency_summary(const std::vector<LatencyCase>& cases);

struct ThroughputOptions {
  int32_t num_prompts = 64;
  int32_t input_len = 128;
  int32_t output_len = 128;
  int32_t num_iters = 1;
  bool warmup = true;  // one short request first (pages in the weights)
  uint64_t seed = 0;
  void validate() const;
};

struct ThroughputRun {
  int32_t num_requests = 0;
  BatchTiming timing;
  double requests_per_s() const;
  double total_tokens_per_s() const;   // prompt + output
  double output_tokens_per_s() const;
};

std::vector<ThroughputRun> run_throughput(Engine& engine, const ThroughputOptions& opts, const Log& log = {});
nlohmann::json throughput_json(const std::vector<ThroughputRun>& runs, const ThroughputOptions& opts);
std::string throughput_summary(const std::vector<ThroughputRun>& runs, const ThroughputOptions& opts);

// "median [min, max]" with `decimals` digits.
std::string median_range(const Summary& s, int decimals = 1);

// Load averages and CPU of this machine, for the record of a run.
nlohmann::json machine_info();

}  // namespace pagellm::bench
