#include "bench/offline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <set>
#include <thread>

#include "bench/prompts.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "engine/engine.h"

namespace pagellm::bench {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Seeds of different batches and rows never collide for realistic counts.
uint64_t row_seed(uint64_t seed, int32_t row) { return seed * 1000003ull + static_cast<uint64_t>(row); }
}  // namespace

BatchTiming run_batch(Engine& engine, int32_t batch_size, int32_t input_len, int32_t output_len, uint64_t seed) {
  PAGELLM_CHECK(batch_size > 0 && input_len > 0 && output_len > 0,
                "batch size, input length and output length must be positive ({}, {}, {})", batch_size, input_len,
                output_len);
  PAGELLM_CHECK(!engine.has_unfinished(), "the engine still has unfinished requests");
  static uint64_t batch_counter = 0;
  const uint64_t batch_id = ++batch_counter;
  const int32_t vocab = engine.model_config().n_vocab;
  std::vector<EngineRequest> requests(static_cast<size_t>(batch_size));
  for (int32_t i = 0; i < batch_size; ++i) {
    EngineRequest& r = requests[i];
    r.id = fmt::format("bench-{}-{}", batch_id, i);
    r.prompt_ids = random_token_ids(input_len, vocab, row_seed(seed, i));
    r.params.temperature = 0;
    r.params.max_tokens = output_len;
    r.params.ignore_eos = true;
    engine.validate(r);  // before any is queued: a bad size fails cleanly
  }
  BatchTiming t;
  const int64_t preempt0 = engine.metrics().num_preemptions;
  std::set<std::string> started;
  const auto t0 = Clock::now();
  for (EngineRequest& r : requests) engine.add_request(std::move(r));
  while (engine.has_unfinished()) {
    const std::vector<RequestOutput> outs = engine.step();
    ++t.steps;
    for (const RequestOutput& out : outs) {
      if (!out.error.empty()) {
        while (engine.has_unfinished()) engine.step();  // leave the engine clean for the caller
        fail("benchmark request {} failed: {}", out.request_id, out.error);
      }
      for (const CompletionDelta& d : out.completions) {
        t.output_tokens += static_cast<int64_t>(d.token_ids.size());
        if (!d.token_ids.empty()) started.insert(out.request_id);
      }
      if (out.finished) {
        t.prompt_tokens += out.num_prompt_tokens;
        t.cached_tokens += out.num_cached_tokens;
      }
    }
    if (t.steps_to_first == 0 && static_cast<int32_t>(started.size()) == batch_size) {
      t.first_token_s = seconds_since(t0);
      t.steps_to_first = t.steps;
    }
  }
  t.end_s = seconds_since(t0);
  t.preemptions = engine.metrics().num_preemptions - preempt0;
  return t;
}

void LatencyOptions::validate() const {
  PAGELLM_CHECK(!input_lens.empty(), "no input length given");
  for (int32_t n : input_lens) PAGELLM_CHECK(n > 0, "--input-len must be positive, got {}", n);
  PAGELLM_CHECK(output_len > 0, "--output-len must be positive, got {}", output_len);
  PAGELLM_CHECK(batch_size > 0, "--batch-size must be positive, got {}", batch_size);
  PAGELLM_CHECK(num_iters > 0, "--num-iters must be positive, got {}", num_iters);
  PAGELLM_CHECK(num_iters_warmup >= 0, "--num-iters-warmup must not be negative, got {}", num_iters_warmup);
}

std::vector<double> LatencyCase::prefill_tokens_per_s() const {
  std::vector<double> v;
  for (const BatchTiming& t : iterations)
    if (t.first_token_s > 0) v.push_back(static_cast<double>(batch_size) * input_len / t.first_token_s);
  return v;
}

std::vector<double> LatencyCase::decode_tokens_per_s() const {
  std::vector<double> v;
  if (output_len < 2) return v;
  for (const BatchTiming& t : iterations) {
    const double s = t.end_s - t.first_token_s;
    if (s > 0) v.push_back(static_cast<double>(batch_size) * (output_len - 1) / s);
  }
  return v;
}

std::vector<LatencyCase> run_latency(Engine& engine, const LatencyOptions& opts, const Log& log) {
  opts.validate();
  std::vector<LatencyCase> cases;
  uint64_t seed = opts.seed;
  for (int32_t input_len : opts.input_lens) {
    LatencyCase c{input_len, opts.output_len, opts.batch_size, {}};
    for (int32_t it = 0; it < opts.num_iters_warmup + opts.num_iters; ++it) {
      const bool warmup = it < opts.num_iters_warmup;
      // Warm-up pages in the weights and grows the buffers for this prompt
      // size; a short decode is enough for that.
      const int32_t out_len = warmup ? std::min(opts.output_len, kWarmupOutputLen) : opts.output_len;
      BatchTiming t = run_batch(engine, opts.batch_size, input_len, out_len, seed++);
      if (log) {
        const double decode_s = t.end_s - t.first_token_s;
        log(fmt::format("{} {}: input {} x {}: prefill {:.3f} s ({} step{}), decode {:.3f} s", warmup ? "warmup" : "iter",
                        warmup ? it + 1 : it - opts.num_iters_warmup + 1, opts.batch_size, input_len, t.first_token_s,
                        t.steps_to_first, t.steps_to_first == 1 ? "" : "s", decode_s));
        if (t.cached_tokens > 0) log(fmt::format("warning: {} prompt tokens came from the prefix cache", t.cached_tokens));
      }
      if (!warmup) c.iterations.push_back(t);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

namespace {
nlohmann::json timing_json(const BatchTiming& t) {
  return {{"first_token_s", t.first_token_s}, {"end_s", t.end_s},
          {"steps_to_first", t.steps_to_first}, {"steps", t.steps},
          {"prompt_tokens", t.prompt_tokens}, {"output_tokens", t.output_tokens},
          {"cached_tokens", t.cached_tokens}, {"preemptions", t.preemptions}};
}
}  // namespace

nlohmann::json latency_json(const std::vector<LatencyCase>& cases) {
  nlohmann::json out = nlohmann::json::array();
  for (const LatencyCase& c : cases) {
    std::vector<double> prefill_s, decode_s;
    nlohmann::json iters = nlohmann::json::array();
    for (const BatchTiming& t : c.iterations) {
      prefill_s.push_back(t.first_token_s);
      decode_s.push_back(t.end_s - t.first_token_s);
      iters.push_back(timing_json(t));
    }
    out.push_back({{"input_len", c.input_len},
                   {"output_len", c.output_len},
                   {"batch_size", c.batch_size},
                   {"prefill_tokens_per_s", to_json(summarize(c.prefill_tokens_per_s()))},
                   {"decode_tokens_per_s", to_json(summarize(c.decode_tokens_per_s()))},
                   {"prefill_s", to_json(summarize(prefill_s))},
                   {"decode_s", to_json(summarize(decode_s))},
                   {"iterations", iters}});
  }
  return out;
}

std::string median_range(const Summary& s, int decimals) {
  if (s.count == 0) return "-";
  return fmt::format("{:.{}f} [{:.{}f}, {:.{}f}]", s.median, decimals, s.min, decimals, s.max, decimals);
}

std::string latency_summary(const std::vector<LatencyCase>& cases) {
  if (cases.empty()) return "";
  const LatencyCase& c0 = cases.front();
  std::string s = fmt::format("latency: batch {}, {} output tokens, {} iterations; median [min, max]\n", c0.batch_size,
                              c0.output_len, c0.iterations.size());
  s += fmt::format("  {:>6}  {:>28}  {:>28}  {:>14}\n", "input", "prefill tokens/s", "decode tokens/s", "prefill s");
  for (const LatencyCase& c : cases) {
    std::vector<double> prefill_s;
    for (const BatchTiming& t : c.iterations) prefill_s.push_back(t.first_token_s);
    s += fmt::format("  {:>6}  {:>28}  {:>28}  {:>14.3f}\n", c.input_len, median_range(summarize(c.prefill_tokens_per_s())),
                     median_range(summarize(c.decode_tokens_per_s())), summarize(prefill_s).median);
  }
  return s;
}

void ThroughputOptions::validate() const {
  PAGELLM_CHECK(num_prompts > 0, "--num-prompts must be positive, got {}", num_prompts);
  PAGELLM_CHECK(input_len > 0, "--input-len must be positive, got {}", input_len);
  PAGELLM_CHECK(output_len > 0, "--output-len must be positive, got {}", output_len);
  PAGELLM_CHECK(num_iters > 0, "--num-iters must be positive, got {}", num_iters);
}

double ThroughputRun::requests_per_s() const { return timing.end_s > 0 ? num_requests / timing.end_s : 0; }
double ThroughputRun::total_tokens_per_s() const {
  return timing.end_s > 0 ? static_cast<double>(timing.prompt_tokens + timing.output_tokens) / timing.end_s : 0;
}
double ThroughputRun::output_tokens_per_s() const {
  return timing.end_s > 0 ? static_cast<double>(timing.output_tokens) / timing.end_s : 0;
}

std::vector<ThroughputRun> run_throughput(Engine& engine, const ThroughputOptions& opts, const Log& log) {
  opts.validate();
  uint64_t seed = opts.seed;
  if (opts.warmup) {
    // Pages in the weights and grows the buffers once, off the clock.
    const BatchTiming w = run_batch(engine, 1, opts.input_len, std::min(opts.output_len, 4), seed + 0x5eed);
    if (log) log(fmt::format("warmup: 1 request in {:.3f} s", w.end_s));
  }
  std::vector<ThroughputRun> runs;
  for (int32_t it = 0; it < opts.num_iters; ++it) {
    ThroughputRun r;
    r.num_requests = opts.num_prompts;
    r.timing = run_batch(engine, opts.num_prompts, opts.input_len, opts.output_len, seed++);
    if (log)
      log(fmt::format("iter {}: {} requests in {:.2f} s ({:.1f} output tokens/s, {} steps, {} preemptions)", it + 1,
                      r.num_requests, r.timing.end_s, r.output_tokens_per_s(), r.timing.steps, r.timing.preemptions));
    runs.push_back(r);
  }
  return runs;
}

nlohmann::json throughput_json(const std::vector<ThroughputRun>& runs, const ThroughputOptions& opts) {
  std::vector<double> elapsed, rps, total, output;
  nlohmann::json iters = nlohmann::json::array();
  for (const ThroughputRun& r : runs) {
    elapsed.push_back(r.timing.end_s);
    rps.push_back(r.requests_per_s());
    total.push_back(r.total_tokens_per_s());
    output.push_back(r.output_tokens_per_s());
    iters.push_back(timing_json(r.timing));
  }
  return {{"num_prompts", opts.num_prompts},
          {"input_len", opts.input_len},
          {"output_len", opts.output_len},
          {"elapsed_s", to_json(summarize(elapsed))},
          {"requests_per_s", to_json(summarize(rps))},
          {"total_tokens_per_s", to_json(summarize(total))},
          {"output_tokens_per_s", to_json(summarize(output))},
          {"iterations", iters}};
}

std::string throughput_summary(const std::vector<ThroughputRun>& runs, const ThroughputOptions& opts) {
  std::vector<double> elapsed, rps, total, output;
  for (const ThroughputRun& r : runs) {
    elapsed.push_back(r.timing.end_s);
    rps.push_back(r.requests_per_s());
    total.push_back(r.total_tokens_per_s());
    output.push_back(r.output_tokens_per_s());
  }
  std::string s = fmt::format("throughput: {} prompts x ({} in + {} out) tokens, {} run{}; median [min, max]\n",
                              opts.num_prompts, opts.input_len, opts.output_len, runs.size(), runs.size() == 1 ? "" : "s");
  s += fmt::format("  elapsed s         {}\n", median_range(summarize(elapsed), 2));
  s += fmt::format("  requests/s        {}\n", median_range(summarize(rps), 3));
  s += fmt::format("  total tokens/s    {}\n", median_range(summarize(total)));
  s += fmt::format("  output tokens/s   {}\n", median_range(summarize(output)));
  return s;
}

namespace {
std::string first_line_with(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (key.empty() || line.rfind(key, 0) == 0) return line;
  return "";
}
}  // namespace

nlohmann::json machine_info() {
  std::string cpu = first_line_with("/proc/cpuinfo", "model name");
  if (const size_t colon = cpu.find(':'); colon != std::string::npos) cpu = cpu.substr(colon + 2);
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return {{"cpu", cpu},
          {"features", cpu_features().describe()},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"loadavg", first_line_with("/proc/loadavg", "")},
          {"time_utc", when}};
}

}  // namespace pagellm::bench
