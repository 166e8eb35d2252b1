// Offline benchmark over a prompt file instead of random token ids: the
// workload speculative decoding is judged on (outputs that copy from their
// prompts) needs real text. Each line of the JSONL file is an object
// {"prompt": TEXT, "max_tokens": N, "temperature": T, "top_p": P, "seed": S}
// (all but prompt optional; greedy by default). Decoding stops at
// end-of-sequence, so two engine configurations that decode alike (with and
// without n-gram speculation, also for seeded sampling) produce the same
// tokens and their times compare directly.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace pagellm {
class Engine;
struct EngineMetrics;
}

namespace pagellm::bench {

using Log = std::function<void(const std::string&)>;

struct DatasetPrompt {
  std::string prompt;
  int32_t max_tokens = 0;  // 0: the run's default
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
};

// Throws Error naming the line for anything but such objects.
std::vector<DatasetPrompt> load_dataset(const std::string& path);

// Speculative decoding counters over a run.
struct SpecCounts {
  int64_t drafts = 0, draft_tokens = 0, accepted = 0;
  double acceptance_rate() const { return draft_tokens ? double(accepted) / double(draft_tokens) : 0.0; }
  // Tokens per verification: the accepted drafts and the one after them.
  double mean_accepted_length() const { return drafts ? 1.0 + double(accepted) / double(drafts) : 0.0; }
};
SpecCounts spec_counts(const EngineMetrics& m);
SpecCounts operator-(const SpecCounts& a, const SpecCounts& b);
SpecCounts& operator+=(SpecCounts& a, const SpecCounts& b);
nlohmann::json spec_json(const SpecCounts& s);
// "" when nothing was proposed.
std::string spec_summary(const SpecCounts& s);

struct DatasetOptions {
  std::string path;
  int32_t default_max_tokens = 128;
  int32_t num_iters = 1;
  bool warmup = true;  // the first prompt once, off the clock
};

struct DatasetRun {
  double elapsed_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::vector<double> tpot_s;  // per request: (last token - first token) / (output tokens - 1)
  std::vector<std::vector<int32_t>> outputs;  // per prompt, in file order
  SpecCounts spec;
  double output_tokens_per_s() const { return elapsed_s > 0 ? double(output_tokens) / elapsed_s : 0.0; }
  // Output tokens after each request's first, per second of its decoding, summed over requests.
  double decode_tokens_per_s() const;
};

// Submits every prompt at once (the engine's --max-num-seqs sets how many run
// together) and steps until all finish; num_iters times.
std::vector<DatasetRun> run_dataset(Engine& engine, const DatasetOptions& opts, const Log& log = {});
nlohmann::json dataset_json(const std::vector<DatasetRun>& runs, const DatasetOptions& opts);
std::string dataset_summary(const std::vector<DatasetRun>& runs, const DatasetOptions& opts);

}  // namespace pagellm::bench
