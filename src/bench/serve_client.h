// `bench serve`: streams /v1/completions requests at any OpenAI-compatible
// server (ours, vLLM, llama.cpp's servers), one thread per request in
// flight, and measures TTFT / ITL / end-to-end latency per request. Bounded
// in count (num_prompts), concurrency and total time; loopback only unless
// allowed.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/offline.h"
#include "bench/serve_metrics.h"
#include "bench/stats.h"

namespace pagellm {
class Tokenizer;
}

namespace pagellm::bench {

struct BaseUrl {
  std::string host;    // without brackets for IPv6
  int port = 80;
  std::string prefix;  // path before the endpoint, without a trailing '/'
};

// "http://HOST[:PORT][/PREFIX]". Throws Error for other schemes (https is not
// built in) or malformed URLs.
BaseUrl parse_base_url(const std::string& url);
// localhost, 127.0.0.0/8 and ::1: by name and literal only, nothing resolved.
bool is_loopback_host(const std::string& host);

struct ServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;                  // empty: the first of GET /v1/models
  int32_t num_prompts = 32;
  int32_t max_concurrency = 8;        // 0: all requests may be in flight
  double request_rate = std::numeric_limits<double>::infinity();  // per second, Poisson arrivals
  int32_t input_len = 128;
  int32_t output_len = 128;
  std::string prompt_format = "text";  // text | tokens (a list of ids, where the server takes it)
  int32_t vocab_size = 32000;          // range of token-id prompts
  double timeout_s = 600;              // the whole run
  bool allow_remote = false;
  bool ignore_eos = true;
  uint64_t seed = 0;
  std::string api_key;                 // sent as a Bearer token when set
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  // Multi-turn chat (turns > 1): num_prompts conversations, each `turns`
  // requests in sequence; turn t's prompt is turn t-1's prompt, its reply
  // and turn_input_len new tokens, sent think_time_s after the reply, so
  // later turns repeat a growing prefix (the prefix cache's workload).
  // max_concurrency counts conversations.
  int32_t turns = 1;
  int32_t turn_input_len = 32;
  double think_time_s = 0;
  void validate() const;               // bounds, and loopback unless allow_remote
};

struct ServeResult {
  std::string model;
  std::vector<RequestRecord> records;  // in prompt order (multi-turn: conversation by conversation)
  double duration_s = 0;
  ServeMetrics metrics;
};

// Multi-turn runs: time to first token of first turns against later ones
// (whose prefix a cache may hold), each summarized over the successful requests.
struct TurnTtft {
  Summary first, later;
};
TurnTtft turn_ttft(const std::vector<RequestRecord>& records);

// The request body of prompt `index` (exposed for tests).
nlohmann::json completion_body(const ServeOptions& opts, const std::string& model, int32_t index,
                               const Tokenizer* tokenizer);

// When each request is due, in seconds from the start: all at 0 for an
// infinite rate, else Poisson arrivals (exponential gaps of mean
// 1/request_rate) drawn from `seed`. run_serve sends request i no earlier
// than arrival_schedule(opts)[i] (exposed for tests).
std::vector<double> arrival_schedule(const ServeOptions& opts);

// Runs the benchmark. `tokenizer` (optional) makes text prompts exactly
// input_len tokens long. Throws Error for bad options or when the model name
// cannot be found; failed requests are recorded, not thrown.
ServeResult run_serve(const ServeOptions& opts, const Tokenizer* tokenizer = nullptr, const Log& log = {});
nlohmann::json serve_json(const ServeResult& r, const ServeOptions& opts);

}  // namespace pagellm::bench
