// `pagellm serve`: the OpenAI-compatible HTTP server (src/server) over an
// AsyncEngine. Life cycle: load the model, bind, serve; on SIGINT / SIGTERM
// stop taking requests (503), give in-flight ones --shutdown-timeout seconds,
// abort the rest, close, exit 0. A second signal exits at once.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "api/limits.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "core/util.h"
#include "engine/async_engine.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "server/shutdown_signals.h"
#include "tokenizer/chat_template.h"

namespace pagellm::cli {
namespace {

struct ServeFlags {
  std::string model_positional;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string chat_template;
  RequestLimits limits;  // defaults there; the admission ones are flags
  double shutdown_timeout = 30;
  std::string max_request_bytes = "16MiB";
  int http_threads = 0;
  bool disable_log_requests = false;
};

// The default --served-model-name: the model file's name without .gguf, or
// the folder's name.
std::string default_served_name(const EngineConfig& c) {
  if (c.load_format == "dummy") return "dummy-" + c.dummy_shape;
  std::filesystem::path p(c.model);
  while (!p.empty() && !p.has_filename()) p = p.parent_path();  // "folder/"
  std::string name = p.filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? c.model : name;
}

std::shared_ptr<const ChatTemplate> load_chat_template(const std::string& flag, const Engine& engine) {
  std::string source;
  if (!flag.empty()) {
    if (std::filesystem::is_regular_file(flag)) {
      std::ifstream in(flag, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      source = ss.str();
    } else if (flag.find("{{") != std::string::npos || flag.find("{%") != std::string::npos) {
      source = flag;  // an inline template, as vLLM allows
    } else {
      fail("--chat-template: no such file '{}'", flag);
    }
    try {
      return std::make_shared<ChatTemplate>(source);
    } catch (const Error& e) {
      fail("--chat-template '{}' does not parse: {}", flag, e.what());
    }
  }
  source = engine.tokenizer().chat_template();
  const char* origin = "the model's";
  if (source.empty()) {
    const char* builtin = builtin_chat_template(arch_name(engine.model_config().arch));
    if (!builtin) {
      spdlog::warn("the model has no chat template: /v1/chat/completions answers 400 (use --chat-template FILE)");
      return nullptr;
    }
    source = builtin;
    origin = "the built-in";
  }
  try {
    auto t = std::make_shared<ChatTemplate>(source);
    spdlog::info("chat template: {} ({} bytes)", origin, source.size());
    return t;
  } catch (const Error& e) {
    spdlog::warn("{} chat template does not parse ({}): chat completions disabled", origin, e.what());
    return nullptr;
  }
}

int run_serve(const EngineFlags& engine_flags, const ServeFlags& f) {
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client must not kill the server
  std::atomic<bool> serving{false};
  server::ShutdownSignals signals([&serving](int sig, int count) {
    if (!serving || count > 1) {
      spdlog::warn("{}: exiting now", strsignal(sig));
      std::fflush(nullptr);
      std::_Exit(count > 1 ? 1 : 0);
    }
  });

  EngineFlags ef = engine_flags;
  if (!f.model_positional.empty()) {
    if (!ef.model.empty() && ef.model != f.model_positional)
      fail("two models given: '{}' (positional) and --model '{}'", f.model_positional, ef.model);
    ef.model = f.model_positional;
  }
  const EngineConfig config = ef.to_config();
  const size_t max_request_bytes = static_cast<size_t>(parse_byte_size(f.max_request_bytes));
  PAGELLM_CHECK(max_request_bytes > 0, "--max-request-bytes must be positive");

  auto engine = std::make_unique<Engine>(config, load_progress_reporter());
  spdlog::info("{}", engine->describe());
  server::ServedModel served;
  served.name = f.served_model_name.empty() ? default_served_name(config) : f.served_model_name;
  if (!config.model.empty() && config.model != served.name) served.aliases.push_back(config.model);
  served.chat_template = load_chat_template(f.chat_template, *engine);

  served.limits = f.limits;
  AsyncEngineOptions async_options;
  async_options.max_waiting_requests = f.limits.max_waiting_requests;
  async_options.max_waiting_sequences = f.limits.max_waiting_sequences;
  async_options.max_sequences_per_request = f.limits.max_sequences_per_request;
  if (f.limits.max_sequences_per_request > f.limits.max_waiting_sequences)
    spdlog::warn("--max-sequences-per-request {} is above --max-waiting-sequences {}: requests get at most {}",
                 f.limits.max_sequences_per_request, f.limits.max_waiting_sequences, f.limits.max_waiting_sequences);
  AsyncEngine async(std::move(engine), async_options);
  served.tokenizer = &async.tokenizer();
  served.vocab_size = async.model_config().n_vocab;
  served.max_model_len = async.max_model_len();

  server::OpenAIServerOptions api_options;
  api_options.api_key = f.api_key;
  api_options.log_requests = !f.disable_log_requests;
  server::OpenAIServer api(async, served, api_options);

  server::HttpServerOptions http_options;
  http_options.host = f.host;
  http_options.port = f.port;
  http_options.max_request_bytes = max_request_bytes;
  http_options.threads = f.http_threads > 0 ? f.http_threads : std::max(128, config.scheduler.max_num_seqs + 64);
  server::HttpServer http(http_options, &api.http_counters());
  api.register_routes(http);
  http.bind();

  std::thread listener([&] {
    http.run();
    signals.request_stop();
  });
  serving = true;
  spdlog::info("serving '{}' on http://{}:{} ({} HTTP threads{})", served.name, f.host, http.port(),
               http_options.threads, f.api_key.empty() ? "" : ", API key required");

  const int sig = signals.wait();
  api.begin_draining();
  spdlog::info("{}: shutting down; in-flight requests get up to {} s to finish", sig ? strsignal(sig) : "stop",
               f.shutdown_timeout);
  async.shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_timeout * 1000)));
  if (!api.wait_idle(std::chrono::seconds(10))) spdlog::warn("some responses are still being written; closing");
  http.stop();
  listener.join();
  if (sig == 0) {
    spdlog::error("the HTTP listener stopped unexpectedly");
    return 1;
  }
  spdlog::info("shutdown complete");
  return 0;
}

}  // namespace

Command register_serve(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API (like `vllm serve`)");
  auto engine = add_engine_flags(sub);
  auto f = std::make_shared<ServeFlags>();
  sub->add_option("model_path", f->model_positional, "The model, as with --model (`pagellm serve MODEL`)");
  sub->add_option("--served-model-name", f->served_model_name,
                  "The name requests use in `model` (default: the model file's name without .gguf)");
  sub->add_option("--host", f->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", f->port, "Port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize")
      ->envname("PAGELLM_API_KEY");
  sub->add_option("--chat-template", f->chat_template,
                  "Jinja chat template file (or inline template) replacing the model's");
  // Admission: "waiting" is admitted but without a first token yet. A full queue answers 503 + Retry-After.
  sub->add_option("--max-waiting-requests", f->limits.max_waiting_requests,
                  "Requests (each with all its prompts) allowed to wait for their first token; more get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-waiting-sequences", f->limits.max_waiting_sequences,
                  "Sequences (prompts x n, over all requests) allowed to wait for their first token; more get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-sequences-per-request", f->limits.max_sequences_per_request,
                  "Sequences (prompts x n) one request may ask for; more get 400, so that no request fills the queue")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--shutdown-timeout", f->shutdown_timeout,
                  "Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are aborted")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-request-bytes", f->max_request_bytes, "Largest request body (e.g. 16MiB); larger get 413")
      ->capture_default_str();
  sub->add_option("--http-threads", f->http_threads,
                  "Connections served at once (default: max(128, max-num-seqs + 64))")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--disable-log-requests", f->disable_log_requests, "No log line per request");
  return {sub, [engine, f]() { return run_serve(*engine, *f); }};
}

}  // namespace pagellm::cli
