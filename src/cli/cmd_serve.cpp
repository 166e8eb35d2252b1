// `pagellm serve`: the OpenAI-compatible HTTP server (src/server) over an
// AsyncEngine. Life cycle: load the model, bind, serve; on SIGINT / SIGTERM
// stop taking requests (503), give in-flight ones --shutdown-timeout seconds,
// abort the rest, close, exit 0. A second signal exits at once.
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"
#include "embed/chat_template_source.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "core/request_limits.h"
#include "core/util.h"
#include "engine/async_engine.h"
#include "engine/parallel.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "server/shutdown_signals.h"
#include "server/web_ui.h"

namespace pagellm::cli {
namespace {

struct ServeFlags {
  std::string model_positional;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string metrics_prefix = "pagellm";
  bool no_webui = false;
  std::string chat_template;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  RequestLimits limits;  // defaults there; the admission ones are flags
  double shutdown_timeout = 30;
  std::string max_request_bytes = "16MiB";
  int http_threads = 0;
  server::ConnectionOptions connections;  // the limits below, straight from their flags
  std::string max_header_bytes = "64KiB";
  double header_timeout = 10, body_timeout = 60, keep_alive_timeout = 5, write_timeout = 10;
  bool disable_log_requests = false;
  size_t responses_store_size = 100;
};

// After --shutdown-timeout: time to write the last responses and close.
constexpr std::chrono::seconds kShutdownGrace{5};

std::chrono::milliseconds to_ms(double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); }

// Each connection is a descriptor: lift the soft limit to what
// --max-connections needs (the hard limit bounds it).
void raise_open_file_limit(size_t connections) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = std::min<rlim_t>(lim.rlim_max, static_cast<rlim_t>(connections) + 256);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = want;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < connections + 64)
    spdlog::warn("the open-file limit ({}) is below --max-connections ({}) + 64", lim.rlim_cur, connections);
}

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

int run_serve(const EngineFlags& engine_flags, const ServeFlags& f) {
  engine_flags.load_config_file();  // --config fills the serve flags too
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client must not kill the server
  // glibc gives up to 8 malloc arenas per core to a process with many
  // threads; each HTTP worker touching its own arena makes RSS creep for a
  // long time (+48% over a 1,000-request soak, +2% with two arenas).
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 2);
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
    const std::string flag = ef.text("model");
    if (!flag.empty() && flag != f.model_positional)
      fail("two models given: '{}' (positional) and --model '{}'", f.model_positional, flag);
    ef.set("model", f.model_positional);
  }
  const EngineConfig config = ef.to_config();
  run_worker_if_parallel(config);  // ranks > 0 of mpirun serve rank 0's steps and exit there
  const size_t max_request_bytes = static_cast<size_t>(parse_byte_size(f.max_request_bytes));
  PAGELLM_CHECK(max_request_bytes > 0, "--max-request-bytes must be positive");

  auto engine = std::make_unique<Engine>(config, load_progress_reporter());
  spdlog::info("{}", engine->describe());
  if (engine->task() == ServeTask::Embed && !engine->pooling_error().empty())
    fail("--task embed: {}", engine->pooling_error());
  if (engine->task() == ServeTask::Score && !engine->score_model()) fail("--task score: {}", engine->score_error());
  if (engine->task() == ServeTask::Generate && engine->model_config().non_causal)
    fail("{} is an encoder (bidirectional attention): it computes embeddings or scores, not text; serve it with "
         "--task embed (or --task score)", arch_name(engine->model_config().arch));
  server::ServedModel served;
  served.name = f.served_model_name.empty() ? default_served_name(config) : f.served_model_name;
  if (!config.model.empty() && config.model != served.name) served.aliases.push_back(config.model);
  served.chat_template = embed::load_chat_template(f.chat_template, *engine);
  std::unique_ptr<chat::ToolParser> tool_parser;
  std::unique_ptr<chat::ReasoningParser> reasoning_parser;
  if (!f.tool_call_parser.empty()) tool_parser = chat::make_tool_parser(f.tool_call_parser);
  if (!f.reasoning_parser.empty()) reasoning_parser = chat::make_reasoning_parser(f.reasoning_parser);
  if (f.enable_auto_tool_choice && !tool_parser)
    fail("--enable-auto-tool-choice needs --tool-call-parser (one of: {})", fmt::join(chat::tool_parser_names(), ", "));
  served.enable_auto_tool_choice = f.enable_auto_tool_choice;
  served.tool_parser = tool_parser.get();
  served.reasoning_parser = reasoning_parser.get();

  served.limits = f.limits;
  served.limits.grammar = config.grammar.limits;
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
  served.task = async.task();
  if (const ScoreModel* score = async.score_model()) served.score_format = score->format;

  server::OpenAIServerOptions api_options;
  api_options.api_key = f.api_key;
  api_options.log_requests = !f.disable_log_requests;
  api_options.metrics_prefix = server::metrics_prefix_from_name(f.metrics_prefix);
  api_options.responses_store_size = f.responses_store_size;
  server::OpenAIServer api(async, served, api_options);

  server::HttpServerOptions http_options;
  http_options.host = f.host;
  http_options.port = f.port;
  server::ConnectionOptions& co = http_options.connections;
  co = f.connections;
  co.limits.max_body_bytes = max_request_bytes;
  co.limits.max_header_bytes = static_cast<size_t>(parse_byte_size(f.max_header_bytes));
  PAGELLM_CHECK(co.limits.max_header_bytes >= 1024, "--max-header-bytes must be at least 1KiB");
  co.limits.max_header_line_bytes = std::min(co.limits.max_header_line_bytes, co.limits.max_header_bytes);
  co.header_timeout = to_ms(f.header_timeout);
  co.body_timeout = to_ms(f.body_timeout);
  co.keep_alive_timeout = to_ms(f.keep_alive_timeout);
  co.write_timeout = to_ms(f.write_timeout);
  co.worker_threads = f.http_threads > 0 ? f.http_threads : std::max(128, config.scheduler.max_num_seqs + 64);
  raise_open_file_limit(co.max_connections);
  server::HttpServer http(http_options, &api.http_counters());
  api.register_routes(http);
  if (!f.no_webui) server::register_web_ui(http);
  http.bind();

  std::thread listener([&] {
    http.run();
    signals.request_stop();
  });
  serving = true;
  spdlog::info("serving '{}' on http://{}:{} ({} HTTP threads, up to {} connections{})", served.name, f.host,
               http.port(), co.worker_threads, co.max_connections, f.api_key.empty() ? "" : ", API key required");

  const int sig = signals.wait();
  api.begin_draining();
  if (parallel_ranks(config) > 1) {
    // mpirun signals every rank when one of them exits or is signalled: a
    // rank may be gone, and with it every step, so nothing drains. Open
    // requests end with an error now; the exit status says the job failed.
    const size_t failed = async
                              .fail_open_requests("the tensor / pipeline parallel job is stopping (a rank exited or "
                                                  "mpirun was signalled)")
                              .size();
    spdlog::error("{}: the parallel job is stopping (mpirun ends every rank when one exits); {} open requests "
                  "failed", sig ? strsignal(sig) : "stop", failed);
    api.wait_idle(std::chrono::seconds(5));
    std::fflush(nullptr);
    std::_Exit(1);
  }
  spdlog::info("{}: shutting down; in-flight requests get up to {} s to finish", sig ? strsignal(sig) : "stop",
               f.shutdown_timeout);
  // Whatever is stuck, the process ends kShutdownGrace after the grace
  // period: a watchdog exits it then.
  const auto deadline = std::chrono::steady_clock::now() + to_ms(f.shutdown_timeout) + kShutdownGrace;
  std::thread([deadline] {
    std::this_thread::sleep_until(deadline);
    spdlog::error("shutdown did not finish within --shutdown-timeout + {} s; exiting now",
                  std::chrono::duration_cast<std::chrono::seconds>(kShutdownGrace).count());
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
  async.shutdown(to_ms(f.shutdown_timeout));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (!api.wait_idle(std::max(std::chrono::milliseconds(0), left - std::chrono::seconds(2))))
    spdlog::warn("some responses are still being written; closing");
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
  sub->add_option("--api-key", f->api_key,
                  "Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1/*, /tokenize and /detokenize")
      ->envname("PAGELLM_API_KEY");
  sub->add_option("--chat-template", f->chat_template,
                  "Jinja chat template file (or inline template) replacing the model's");
  sub->add_option("--metrics-prefix", f->metrics_prefix,
                  "Names on /metrics: pagellm (pagellm:...), vllm (vllm:..., for vLLM's dashboards and alerts), "
                  "or both")
      ->check(CLI::IsMember({"pagellm", "vllm", "both"}))
      ->capture_default_str();
  sub->add_flag("--no-webui", f->no_webui,
                "Do not serve the web page (chat playground and live metrics) at /");
  sub->add_flag("--enable-auto-tool-choice", f->enable_auto_tool_choice,
                "Let the model decide to call tools (tool_choice auto); needs --tool-call-parser");
  sub->add_option("--tool-call-parser", f->tool_call_parser,
                  "How tool calls look in the output: hermes, llama3_json, mistral, pythonic");
  sub->add_option("--reasoning-parser", f->reasoning_parser,
                  "Move the thinking section into reasoning_content: deepseek_r1, qwen3");
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
                  "Sequences (prompts x n) one request may ask for; more get 400, so that no request fills the "
                  "queue (the scheduler also shares seats fairly between requests)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--shutdown-timeout", f->shutdown_timeout,
                  "Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are aborted; the "
                  "process ends at most 5 s later whatever is still running")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-request-bytes", f->max_request_bytes, "Largest request body (e.g. 16MiB); larger get 413")
      ->capture_default_str();
  sub->add_option("--http-threads", f->http_threads,
                  "Requests served at once; each stream holds one (default: max(128, max-num-seqs + 64))")
      ->check(CLI::NonNegativeNumber);
  server::ConnectionOptions& co = f->connections;
  sub->add_option("--max-connections", co.max_connections, "Open client connections; more get 503 at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-header-bytes", f->max_header_bytes,
                  "Largest request head (request line + headers); larger get 431 (414 for a long request line)")
      ->capture_default_str();
  sub->add_option("--max-header-count", co.limits.max_header_count, "Most header lines in a request; more get 431")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--header-timeout", f->header_timeout,
                  "Seconds a client gets to send a request's head once it started; then 408")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--body-timeout", f->body_timeout, "Seconds a client gets to send a request's body; then 408")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--timeout-keep-alive", f->keep_alive_timeout, "Seconds an idle keep-alive connection stays open")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--write-timeout", f->write_timeout,
                  "Seconds a response write may wait for a client that does not read; then the request is aborted")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--keep-alive-max-requests", co.keep_alive_max_requests,
                  "Requests on one connection before it closes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_flag("--disable-log-requests", f->disable_log_requests, "No log line per request");
  sub->add_option("--responses-store-size", f->responses_store_size,
                  "/v1/responses kept in memory for previous_response_id (least recently used dropped; 0: none)")
      ->capture_default_str();
  return {sub, [engine, f]() { return run_serve(*engine, *f); }};
}

}  // namespace pagellm::cli
