#include "bench/dataset.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <map>

#include "bench/offline.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "engine/engine.h"

namespace pagellm::bench {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

std::vector<DatasetPrompt> load_dataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open the dataset '{}'", path);
  std::vector<DatasetPrompt> prompts;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", path, line_no);
    nlohmann::json j;
    try {
      j = parse_json_bounded(line, kRequestJsonLimits, where);
    } catch (const std::exception& e) {
      fail("{}", e.what());
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
      fail("{}: expected an object with a non-empty \"prompt\" string", where);
    DatasetPrompt p;
    p.prompt = j["prompt"].get<std::string>();
    for (const char* key : {"temperature", "top_p"}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number()) fail("{}: \"{}\" must be a number", where, key);
      (std::string(key) == "top_p" ? p.top_p : p.temperature) = j[key].get<float>();
    }
    if (j.contains("seed")) {
      if (!j["seed"].is_number_unsigned()) fail("{}: \"seed\" must be a non-negative integer", where);
      p.seed = j["seed"].get<uint64_t>();
    }
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1 ||
          j["max_tokens"].get<int64_t>() > (1 << 20))
        fail("{}: \"max_tokens\" must be a positive integer", where);
      p.max_tokens = j["max_tokens"].get<int32_t>();
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) fail("the dataset '{}' holds no prompt", path);
  return prompts;
}

SpecCounts spec_counts(const EngineMetrics& m) {
  return {m.spec_decode_num_drafts, m.spec_decode_num_draft_tokens, m.spec_decode_num_accepted_tokens};
}

SpecCounts operator-(const SpecCounts& a, const SpecCounts& b) {
  return {a.drafts - b.drafts, a.draft_tokens - b.draft_tokens, a.accepted - b.accepted};
}

SpecCounts& operator+=(SpecCounts& a, const SpecCounts& b) {
  a.drafts += b.drafts;
  a.draft_tokens += b.draft_tokens;
  a.accepted += b.accepted;
  return a;
}

nlohmann::json spec_json(const SpecCounts& s) {
  return {{"num_drafts", s.drafts},
          {"num_draft_tokens", s.draft_tokens},
          {"num_accepted_tokens", s.accepted},
          {"acceptance_rate", s.acceptance_rate()},
          {"mean_accepted_length", s.mean_accepted_length()}};
}

std::string spec_summary(const SpecCounts& s) {
  if (s.drafts == 0) return "";
  return fmt::format("  speculative decoding: {} verifications, {} of {} draft tokens accepted: acceptance rate "
                     "{:.1f}%, mean accepted length {:.2f}\n",
                     s.drafts, s.accepted, s.draft_tokens, 100.0 * s.acceptance_rate(), s.mean_accepted_length());
}

double DatasetRun::decode_tokens_per_s() const {
  // Sum of tokens over sum of times: each request's share weighs by its length.
  double tokens = 0, time = 0;
  for (size_t i = 0; i < tpot_s.size(); ++i) {
    const double n = static_cast<double>(outputs[i].size()) - 1.0;
    if (n <= 0) continue;
    tokens += n;
    time += tpot_s[i] * n;
  }
  return time > 0 ? tokens / time : 0.0;
}

namespace {

DatasetRun run_once(Engine& engine, const std::vector<DatasetPrompt>& prompts, const DatasetOptions& opts,
                    size_t count, uint64_t run_id) {
  PAGELLM_CHECK(!engine.has_unfinished(), "the engine still has unfinished requests");
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < count; ++i) {
    EngineRequest r;
    r.id = fmt::format("data-{}-{}", run_id, i);
    r.prompt_ids = engine.tokenizer().encode(prompts[i].prompt, true, false);
    r.params.temperature = prompts[i].temperature;
    r.params.top_p = prompts[i].top_p;
    r.params.seed = prompts[i].seed;
    r.params.max_tokens = prompts[i].max_tokens > 0 ? prompts[i].max_tokens : opts.default_max_tokens;
    engine.validate(r);
    reqs.push_back(std::move(r));
  }
  DatasetRun run;
  run.outputs.resize(count);
  std::vector<Clock::time_point> first(count), last(count);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < count; ++i) index[reqs[i].id] = i;
  const SpecCounts spec0 = spec_counts(engine.metrics());
  const auto t0 = Clock::now();
  for (EngineRequest& r : reqs) {
    run.prompt_tokens += static_cast<int64_t>(r.prompt_ids.size());
    engine.add_request(std::move(r));
  }
  while (engine.has_unfinished()) {
    const std::vector<RequestOutput> outs = engine.step();
    const auto now = Clock::now();
    for (const RequestOutput& out : outs) {
      if (!out.error.empty()) {
        while (engine.has_unfinished()) engine.step();
        fail("benchmark request {} failed: {}", out.request_id, out.error);
      }
      const size_t i = index.at(out.request_id);
      for (const CompletionDelta& d : out.completions) {
        if (d.token_ids.empty()) continue;
        if (run.outputs[i].empty()) first[i] = now;
        last[i] = now;
        run.outputs[i].insert(run.outputs[i].end(), d.token_ids.begin(), d.token_ids.end());
        run.output_tokens += static_cast<int64_t>(d.token_ids.size());
      }
    }
  }
  run.elapsed_s = seconds(t0, Clock::now());
  for (size_t i = 0; i < count; ++i) {
    const size_t n = run.outputs[i].size();
    if (n >= 2) run.tpot_s.push_back(seconds(first[i], last[i]) / double(n - 1));
    else run.tpot_s.push_back(0.0);
  }
  run.spec = spec_counts(engine.metrics()) - spec0;
  return run;
}

}  // namespace

std::vector<DatasetRun> run_dataset(Engine& engine, const DatasetOptions& opts, const Log& log) {
  PAGELLM_CHECK(opts.num_iters > 0, "--num-iters must be positive, got {}", opts.num_iters);
  PAGELLM_CHECK(opts.default_max_tokens > 0, "--output-len must be positive, got {}", opts.default_max_tokens);
  const std::vector<DatasetPrompt> prompts = load_dataset(opts.path);
  static uint64_t run_counter = 0;
  if (opts.warmup) {
    const DatasetRun w = run_once(engine, prompts, opts, 1, ++run_counter);
    if (log) log(fmt::format("warmup: 1 request in {:.3f} s", w.elapsed_s));
  }
  std::vector<DatasetRun> runs;
  for (int32_t it = 0; it < opts.num_iters; ++it) {
    DatasetRun r = run_once(engine, prompts, opts, prompts.size(), ++run_counter);
    if (log)
      log(fmt::format("iter {}: {} requests in {:.2f} s ({} output tokens, {:.1f} decode tokens/s)", it + 1,
                      prompts.size(), r.elapsed_s, r.output_tokens, r.decode_tokens_per_s()));
    runs.push_back(std::move(r));
  }
  return runs;
}

namespace {

// The runs' figures side by side, and their speculative counts summed.
struct Aggregate {
  std::vector<double> elapsed, output, decode, tpot_ms;
  SpecCounts spec;
};

Aggregate aggregate(const std::vector<DatasetRun>& runs) {
  Aggregate a;
  for (const DatasetRun& r : runs) {
    a.elapsed.push_back(r.elapsed_s);
    a.output.push_back(r.output_tokens_per_s());
    a.decode.push_back(r.decode_tokens_per_s());
    for (double t : r.tpot_s)
      if (t > 0) a.tpot_ms.push_back(t * 1000.0);
    a.spec += r.spec;
  }
  return a;
}

}  // namespace

nlohmann::json dataset_json(const std::vector<DatasetRun>& runs, const DatasetOptions& opts) {
  const Aggregate a = aggregate(runs);
  nlohmann::json iters = nlohmann::json::array();
  for (const DatasetRun& r : runs)
    iters.push_back({{"elapsed_s", r.elapsed_s},
                     {"prompt_tokens", r.prompt_tokens},
                     {"output_tokens", r.output_tokens},
                     {"decode_tokens_per_s", r.decode_tokens_per_s()},
                     {"speculative", spec_json(r.spec)},
                     {"output_token_ids", r.outputs}});
  return {{"dataset", opts.path},
          {"num_prompts", runs.empty() ? 0 : runs.front().outputs.size()},
          {"default_max_tokens", opts.default_max_tokens},
          {"elapsed_s", to_json(summarize(a.elapsed))},
          {"output_tokens_per_s", to_json(summarize(a.output))},
          {"decode_tokens_per_s", to_json(summarize(a.decode))},
          {"tpot_ms", to_json(summarize(a.tpot_ms))},
          {"speculative", spec_json(a.spec)},
          {"iterations", iters}};
}

std::string dataset_summary(const std::vector<DatasetRun>& runs, const DatasetOptions& opts) {
  const Aggregate a = aggregate(runs);
  std::string s = fmt::format("dataset: {} prompts from {}, {} run{}; median [min, max]\n",
                              runs.empty() ? 0 : runs.front().outputs.size(), opts.path, runs.size(),
                              runs.size() == 1 ? "" : "s");
  s += fmt::format("  elapsed s          {}\n", median_range(summarize(a.elapsed), 2));
  s += fmt::format("  output tokens/s    {}\n", median_range(summarize(a.output)));
  s += fmt::format("  decode tokens/s    {}\n", median_range(summarize(a.decode)));
  s += fmt::format("  TPOT ms            {}\n", median_range(summarize(a.tpot_ms), 2));
  s += spec_summary(a.spec);
  return s;
}

}  // namespace pagellm::bench
