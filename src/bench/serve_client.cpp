#include "bench/serve_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <thread>

#include "bench/prompts.h"
#include "bench/sse.h"
#include "core/error.h"

namespace pagellm::bench {

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

constexpr int32_t kMaxPrompts = 100000;
constexpr int32_t kMaxConcurrency = 1024;  // one thread each
constexpr double kConnectTimeoutS = 5;
constexpr size_t kMaxErrorBody = 1000;

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace

BaseUrl parse_base_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0) fail("base URL '{}': https is not supported (plain http only)", url);
  PAGELLM_CHECK(url.rfind(scheme, 0) == 0, "base URL '{}' must start with http://", url);
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  BaseUrl b;
  if (slash != std::string::npos) b.prefix = rest.substr(slash);
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  std::string port;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    PAGELLM_CHECK(close != std::string::npos, "base URL '{}': unclosed '[' in the host", url);
    b.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      PAGELLM_CHECK(after[0] == ':', "base URL '{}': unexpected '{}' after the host", url, after);
      port = after.substr(1);
      PAGELLM_CHECK(!port.empty(), "base URL '{}': empty port", url);
    }
  } else {
    const size_t colon = authority.rfind(':');
    b.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      PAGELLM_CHECK(!port.empty(), "base URL '{}': empty port", url);
    }
  }
  PAGELLM_CHECK(!b.host.empty(), "base URL '{}' has no host", url);
  if (!port.empty()) {
    PAGELLM_CHECK(all_digits(port) && port.size() <= 5 && std::stoi(port) >= 1 && std::stoi(port) <= 65535,
                  "base URL '{}': bad port '{}'", url, port);
    b.port = std::stoi(port);
  }
  return b;
}

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
  if (h == "localhost" || h == "::1" || h == "0:0:0:0:0:0:0:1") return true;
  // 127.a.b.c, each part 0..255.
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = h.find('.', start)) != std::string::npos; start = dot + 1) parts.push_back(h.substr(start, dot - start));
  parts.push_back(h.substr(start));
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (const std::string& p : parts)
    if (!all_digits(p) || p.size() > 3 || std::stoi(p) > 255) return false;
  return true;
}

void ServeOptions::validate() const {
  PAGELLM_CHECK(num_prompts > 0 && num_prompts <= kMaxPrompts, "--num-prompts must be in 1..{}, got {}", kMaxPrompts,
                num_prompts);
  PAGELLM_CHECK(max_concurrency >= 0 && max_concurrency <= kMaxConcurrency,
                "--max-concurrency must be in 0..{} (0: unbounded), got {}", kMaxConcurrency, max_concurrency);
  PAGELLM_CHECK(request_rate > 0, "--request-rate must be positive (or inf), got {}", request_rate);
  PAGELLM_CHECK(input_len > 0, "--input-len must be positive, got {}", input_len);
  PAGELLM_CHECK(output_len > 0, "--output-len must be positive, got {}", output_len);
  PAGELLM_CHECK(prompt_format == "text" || prompt_format == "tokens", "--prompt-format must be text or tokens, got '{}'",
                prompt_format);
  PAGELLM_CHECK(vocab_size > 1, "--vocab-size must be above 1, got {}", vocab_size);
  PAGELLM_CHECK(timeout_s > 0, "--timeout must be positive, got {}", timeout_s);
  PAGELLM_CHECK(extra_body.is_object(), "--extra-body must be a JSON object");
  PAGELLM_CHECK(!endpoint.empty() && endpoint[0] == '/', "--endpoint must start with '/', got '{}'", endpoint);
  PAGELLM_CHECK(turns >= 1 && turns <= 1000, "--multi-turn must be in 1..1000, got {}", turns);
  PAGELLM_CHECK(turn_input_len > 0, "--turn-input-len must be positive, got {}", turn_input_len);
  PAGELLM_CHECK(think_time_s >= 0 && std::isfinite(think_time_s), "--think-time must be a number of seconds >= 0, got {}",
                think_time_s);
  PAGELLM_CHECK(turns == 1 || prompt_format == "text", "--multi-turn needs --prompt-format text (a reply is text)");
  const BaseUrl url = parse_base_url(base_url);
  PAGELLM_CHECK(allow_remote || is_loopback_host(url.host),
                "refusing to benchmark '{}', which is not a loopback address: pass --allow-remote to load a remote "
                "server on purpose",
                url.host);
}

nlohmann::json completion_body(const ServeOptions& opts, const std::string& model, int32_t index,
                               const Tokenizer* tokenizer) {
  const uint64_t seed = opts.seed * 1000003ull + static_cast<uint64_t>(index);
  nlohmann::json body = {{"model", model}, {"max_tokens", opts.output_len}, {"temperature", 0.0}, {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  if (opts.prompt_format == "tokens") body["prompt"] = random_token_ids(opts.input_len, opts.vocab_size, seed);
  else body["prompt"] = random_text(opts.input_len, seed, tokenizer);
  if (opts.ignore_eos) body["ignore_eos"] = true;
  for (const auto& [k, v] : opts.extra_body.items()) body[k] = v;
  return body;
}

namespace {

std::unique_ptr<httplib::Client> make_client(const BaseUrl& url, double timeout_s) {
  auto cli = std::make_unique<httplib::Client>(url.host, url.port);
  const auto usec = [](double s) { return std::chrono::microseconds(static_cast<int64_t>(std::max(s, 0.001) * 1e6)); };
  cli->set_connection_timeout(usec(std::min(timeout_s, kConnectTimeoutS)));
  cli->set_read_timeout(usec(timeout_s));
  cli->set_write_timeout(usec(timeout_s));
  cli->set_keep_alive(false);
  return cli;
}

std::string fetch_model_name(const BaseUrl& url, const ServeOptions& opts) {
  auto cli = make_client(url, std::min(opts.timeout_s, 30.0));
  httplib::Headers headers;
  if (!opts.api_key.empty()) headers.emplace("Authorization", "Bearer " + opts.api_key);
  auto res = cli->Get(url.prefix + "/v1/models", headers);
  if (!res) fail("cannot reach {}: {} (is the server running?)", opts.base_url, httplib::to_string(res.error()));
  if (res->status != 200) fail("GET /v1/models answered HTTP {}: give the model name with --model", res->status);
  try {
    const auto j = nlohmann::json::parse(res->body);
    return j.at("data").at(0).at("id").get<std::string>();
  } catch (const std::exception&) {
    fail("GET /v1/models gave no model id: give the model name with --model");
  }
}

// One streamed request, start to end.
RequestRecord send_one(const BaseUrl& url, const ServeOptions& opts, const std::string& body, int32_t prompt_tokens,
                       Clock::time_point t0, Clock::time_point deadline, std::string* text = nullptr) {
  RequestRecord rec;
  rec.prompt_tokens = prompt_tokens;
  const auto start = Clock::now();
  rec.start_s = secs(start - t0);
  const double remaining = secs(deadline - start);
  if (remaining <= 0) {
    rec.error = fmt::format("not sent: the --timeout of {} s was reached", opts.timeout_s);
    return rec;
  }
  auto cli = make_client(url, remaining);
  httplib::Request req;
  req.method = "POST";
  req.path = url.prefix + opts.endpoint;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!opts.api_key.empty()) req.set_header("Authorization", "Bearer " + opts.api_key);

  int status = 0;
  std::string error_body, stream_error;
  SseParser parser;
  bool timed_out = false, got_first = false;
  int32_t chunks = 0, usage_tokens = -1;
  Clock::time_point last = start;
  auto handle = [&](const std::string& payload, Clock::time_point now) -> bool {
    if (payload == "[DONE]") return true;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(payload);
    } catch (const std::exception&) {
      stream_error = "the stream carried invalid JSON: " + payload.substr(0, 200);
      return false;
    }
    if (!j.is_object()) return true;
    if (j.contains("error")) {
      const auto& e = j["error"];
      stream_error = "error in stream: " + (e.is_object() && e.contains("message") && e["message"].is_string()
                                                ? e["message"].get<std::string>()
                                                : e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return false;
    }
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const auto& c = j["choices"][0];
      if (c.is_object() && c.contains("text") && c["text"].is_string() && !c["text"].get_ref<const std::string&>().empty()) {
        if (text) *text += c["text"].get_ref<const std::string&>();
        if (!got_first) {
          rec.ttft_s = secs(now - start);
          got_first = true;
        } else {
          rec.itl_s.push_back(secs(now - last));
        }
        last = now;
        ++chunks;
      }
    }
    if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
        j["usage"]["completion_tokens"].is_number_integer())
      usage_tokens = j["usage"]["completion_tokens"].get<int32_t>();
    return true;
  };
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const auto now = Clock::now();
    if (now > deadline) {
      timed_out = true;
      return false;
    }
    if (status != 200) {
      error_body.append(data, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return true;
    }
    for (const std::string& payload : parser.feed(data, n))
      if (!handle(payload, now)) return false;
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli->send(req, res, err);
  const auto end = Clock::now();
  if (stream_error.empty() && ok && status == 200)
    for (const std::string& payload : parser.finish()) handle(payload, end);
  rec.latency_s = secs(end - start);
  if (timed_out || (!ok && end >= deadline)) rec.error = fmt::format("timed out (--timeout {} s)", opts.timeout_s);
  else if (!stream_error.empty()) rec.error = stream_error;
  else if (!ok && got_first)
    rec.error = fmt::format("the stream broke off after {} chunks ({}); the server closed or aborted it", chunks,
                            httplib::to_string(err));
  else if (!ok) rec.error = "HTTP request failed: " + httplib::to_string(err);
  else if (status != 200) rec.error = fmt::format("HTTP {}: {}", status, error_body);
  else if (!got_first) rec.error = "the stream ended without any text";
  else rec.success = true;
  rec.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks;
  return rec;
}

}  // namespace

std::vector<double> arrival_schedule(const ServeOptions& opts) {
  std::vector<double> arrival_s;
  PromptRng arrivals(opts.seed ^ 0xA5A5A5A5ull);
  double t = 0;
  for (int32_t i = 0; i < opts.num_prompts; ++i) {
    arrival_s.push_back(t);
    if (std::isfinite(opts.request_rate)) t += -std::log(arrivals.unit()) / opts.request_rate;
  }
  return arrival_s;
}

namespace {

// A request body as JSON text; text that is not valid UTF-8 (a random
// model's reply, a prompt cut inside a character) has it replaced, as a
// client library would, instead of throwing.
std::string body_text(const nlohmann::json& body) {
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Conversation c's turns, in sequence: each prompt extends the last one by
// its reply and new user text.
void run_conversation(const BaseUrl& url, const ServeOptions& opts, const std::string& model, int32_t c,
                      const Tokenizer* tokenizer, Clock::time_point t0, Clock::time_point deadline,
                      std::span<RequestRecord> records) {
  nlohmann::json body = completion_body(opts, model, c, tokenizer);
  std::string prompt = body["prompt"].get<std::string>();
  for (int32_t t = 0; t < opts.turns; ++t) {
    if (t > 0) {
      const auto wake = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.think_time_s));
      std::this_thread::sleep_until(std::min(wake, deadline));
      const uint64_t seed = (opts.seed * 1000003ull + static_cast<uint64_t>(c)) * 7919ull + static_cast<uint64_t>(t);
      prompt += " " + random_text(opts.turn_input_len, seed, tokenizer);
    }
    body["prompt"] = prompt;
    std::string reply;
    const int32_t approx_tokens = opts.input_len + t * (opts.turn_input_len + opts.output_len);
    records[static_cast<size_t>(t)] = send_one(url, opts, body_text(body), approx_tokens, t0, deadline, &reply);
    records[static_cast<size_t>(t)].turn = t;
    if (!records[static_cast<size_t>(t)].success) return;  // the rest keep their "not sent" error
    prompt += reply;
  }
}

// Runs job(i) for i in 0..n-1, each on a thread of its own started no
// earlier than due(i), at most `limit` at once; none starts after `deadline`.
void run_bounded(int32_t n, int32_t limit, Clock::time_point deadline,
                 const std::function<Clock::time_point(int32_t)>& due, const std::function<void(int32_t)>& job) {
  std::mutex mu;
  std::condition_variable cv;
  int32_t in_flight = 0;
  std::vector<std::thread> threads;
  for (int32_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(std::min(due(i), deadline));
    std::unique_lock lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return in_flight < limit; })) break;
    ++in_flight;
    lock.unlock();
    threads.emplace_back([&, i] {
      job(i);
      std::lock_guard g(mu);
      --in_flight;
      cv.notify_all();
    });
  }
  for (std::thread& th : threads) th.join();
}

}  // namespace

TurnTtft turn_ttft(const std::vector<RequestRecord>& records) {
  std::vector<double> first, later;
  for (const RequestRecord& r : records)
    if (r.success) (r.turn == 0 ? first : later).push_back(r.ttft_s);
  return {summarize(first), summarize(later)};
}

ServeResult run_serve(const ServeOptions& opts, const Tokenizer* tokenizer, const Log& log) {
  opts.validate();
  const BaseUrl url = parse_base_url(opts.base_url);
  ServeResult result;
  result.model = opts.model.empty() ? fetch_model_name(url, opts) : opts.model;
  const int32_t limit = opts.max_concurrency == 0 ? opts.num_prompts : opts.max_concurrency;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.timeout_s));
  const std::string not_sent = fmt::format("not sent: the --timeout of {} s was reached", opts.timeout_s);
  Clock::time_point t0;
  if (opts.turns > 1) {
    if (log)
      log(fmt::format("{} conversations of {} turns to {}{} (model '{}'), {} at once, think time {} s", opts.num_prompts,
                      opts.turns, opts.base_url, opts.endpoint, result.model, limit, opts.think_time_s));
    result.records.resize(static_cast<size_t>(opts.num_prompts) * static_cast<size_t>(opts.turns));
    for (RequestRecord& r : result.records) r.error = not_sent;
    t0 = Clock::now();
    run_bounded(opts.num_prompts, limit, t0 + timeout, [&](int32_t) { return t0; }, [&](int32_t c) {
      run_conversation(url, opts, result.model, c, tokenizer, t0, t0 + timeout,
                       std::span(result.records).subspan(static_cast<size_t>(c) * opts.turns, opts.turns));
    });
  } else {
    // Bodies and arrival times first, off the clock.
    std::vector<std::string> bodies;
    for (int32_t i = 0; i < opts.num_prompts; ++i)
      bodies.push_back(body_text(completion_body(opts, result.model, i, tokenizer)));
    const std::vector<double> arrival_s = arrival_schedule(opts);
    if (log)
      log(fmt::format("{} requests to {}{} (model '{}'), concurrency {}, rate {}", opts.num_prompts, opts.base_url,
                      opts.endpoint, result.model,
                      opts.max_concurrency == 0 ? "unbounded" : std::to_string(opts.max_concurrency),
                      std::isfinite(opts.request_rate) ? fmt::format("{}/s", opts.request_rate) : "inf"));
    result.records.resize(static_cast<size_t>(opts.num_prompts));
    for (RequestRecord& r : result.records) {
      r.prompt_tokens = opts.input_len;
      r.error = not_sent;
    }
    std::mutex log_mu;
    int32_t done = 0;
    t0 = Clock::now();
    const auto due = [&](int32_t i) {
      return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival_s[i]));
    };
    run_bounded(opts.num_prompts, limit, t0 + timeout, due, [&](int32_t i) {
      result.records[i] = send_one(url, opts, bodies[i], opts.input_len, t0, t0 + timeout);
      std::lock_guard g(log_mu);
      ++done;
      if (log && (done % std::max(1, opts.num_prompts / 10) == 0 || done == opts.num_prompts))
        log(fmt::format("{}/{} requests done", done, opts.num_prompts));
    });
  }
  result.duration_s = secs(Clock::now() - t0);
  result.metrics = compute_serve_metrics(result.records, result.duration_s);
  return result;
}

nlohmann::json serve_json(const ServeResult& r, const ServeOptions& opts) {
  nlohmann::json requests = nlohmann::json::array();
  for (const RequestRecord& rec : r.records) {
    nlohmann::json j = {{"success", rec.success}, {"start_s", rec.start_s}, {"ttft_s", rec.ttft_s},
                        {"latency_s", rec.latency_s}, {"output_tokens", rec.output_tokens}};
    if (opts.turns > 1) j["turn"] = rec.turn;
    if (!rec.success) j["error"] = rec.error;
    requests.push_back(j);
  }
  nlohmann::json out = {{"base_url", opts.base_url},
          {"endpoint", opts.endpoint},
          {"model", r.model},
          {"num_prompts", opts.num_prompts},
          {"max_concurrency", opts.max_concurrency},
          {"request_rate", std::isfinite(opts.request_rate) ? nlohmann::json(opts.request_rate) : nlohmann::json("inf")},
          {"input_len", opts.input_len},
          {"output_len", opts.output_len},
          {"prompt_format", opts.prompt_format},
          {"metrics", serve_metrics_json(r.metrics)},
          {"requests", requests}};
  if (opts.turns > 1) {
    const TurnTtft t = turn_ttft(r.records);
    out["multi_turn"] = {{"turns", opts.turns},
                         {"turn_input_len", opts.turn_input_len},
                         {"think_time_s", opts.think_time_s},
                         {"ttft_ms_first_turn", to_json(t.first, 1000)},
                         {"ttft_ms_later_turns", to_json(t.later, 1000)}};
  }
  return out;
}

}  // namespace pagellm::bench
