// `pagellm bench latency | throughput | serve | memory`: benchmarks modelled
// on vLLM's benchmark scripts. Each prints a human summary to stderr and a
// JSON record to stdout (or --output-json FILE). Logic lives in src/bench/.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/kv_report.h"
#include "bench/memory_probe.h"
#include "bench/offline.h"
#include "bench/serve_client.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "core/util.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/parallel.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::cli {
namespace {

void log_line(const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); }

void write_json(const nlohmann::json& j, const std::string& path) {
  const std::string text = j.dump(2) + "\n";
  if (path.empty()) {
    std::cout << text;
    std::cout.flush();
    return;
  }
  std::ofstream out(path);
  if (!out) fail("cannot write '{}'", path);
  out << text;
  if (!out) fail("error writing '{}'", path);
  spdlog::info("wrote {}", path);
}

std::vector<int32_t> parse_int_list(const std::string& text, const char* flag) {
  std::vector<int32_t> v;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    try {
      size_t used = 0;
      const int value = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      v.push_back(value);
    } catch (const std::exception&) {
      fail("{} takes comma-separated integers, got '{}'", flag, text);
    }
    start = comma + 1;
  }
  return v;
}

// Engine flags the user did not give get values that suit a benchmark of
// fixed-size requests: a step budget that fits the whole prompt batch (so
// prefill is one step, like llama-bench), and a context of exactly what the
// requests use (so the default KV budget stays small).
EngineConfig bench_engine_config(const EngineFlags& flags, const CLI::App* app, int32_t max_tokens_per_step,
                                 int32_t max_seq_len, int32_t max_seqs) {
  EngineConfig c = flags.to_config();
  if (app->count("--max-num-batched-tokens") == 0)
    c.scheduler.max_num_batched_tokens = std::max(c.scheduler.max_num_batched_tokens, max_tokens_per_step);
  if (app->count("--max-model-len") == 0) c.scheduler.max_model_len = max_seq_len;
  if (max_seqs > 0 && app->count("--max-num-seqs") == 0) c.scheduler.max_num_seqs = max_seqs;
  return c;
}

// Rank 0's time in collectives over a run (tensor / pipeline parallel runs):
// with pipeline stages it includes waiting for the next stage's output.
class CommProbe {
 public:
  explicit CommProbe(const Engine& e) : start_(Clock::now()), steps_(e.metrics().num_steps) {
    if (e.communicator()) before_ = e.communicator()->stats();
  }
  nlohmann::json report(const Engine& e) const {
    const dist::Communicator::Stats& now = e.communicator()->stats();
    const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
    const double comm = now.seconds - before_.seconds;
    const int64_t steps = std::max<int64_t>(1, e.metrics().num_steps - steps_);
    std::fprintf(stderr, "communication on rank 0: %.3f s of %.3f s (%.1f%%), %llu calls, %.1f MiB, %.3f ms per step\n",
                 comm, wall, 100.0 * comm / wall, static_cast<unsigned long long>(now.calls - before_.calls),
                 static_cast<double>(now.bytes - before_.bytes) / (1 << 20), 1e3 * comm / static_cast<double>(steps));
    return {{"seconds", comm},
            {"wall_seconds", wall},
            {"calls", now.calls - before_.calls},
            {"bytes", now.bytes - before_.bytes},
            {"steps", steps},
            {"ms_per_step", 1e3 * comm / static_cast<double>(steps)},
            {"describe", e.communicator()->describe()}};
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  int64_t steps_;
  dist::Communicator::Stats before_;
};

std::unique_ptr<Engine> load_engine(const EngineConfig& config, const CLI::App* app) {
  run_worker_if_parallel(config);
  try {
    auto engine = std::make_unique<Engine>(config, load_progress_reporter());
    spdlog::info("{}", engine->describe());
    return engine;
  } catch (const Error& e) {
    if (app && app->count("--max-model-len") == 0)
      fail("{} (bench sets --max-model-len to the longest input + output = {} unless given)", e.what(),
           config.scheduler.max_model_len);
    throw;
  }
}

nlohmann::json engine_json(Engine& engine, const EngineFlags& flags) {
  const EngineConfig& c = engine.config();
  return {{"model", c.load_format == "dummy" ? fmt::format("dummy:{}:{}", c.dummy_shape, flags.text("dummy-type")) : c.model},
          {"description", engine.describe()},
          {"weight_bytes", engine.model().weight_bytes()},
          {"decode_weight_bytes", engine.model().decode_weight_bytes()},
          {"device", c.device},
          {"backend", engine.backend().name()},
          {"backend_options", c.backend_options},
          {"threads", backend_option_int(c.backend_options, engine.backend().name(), "threads", 0)},
          {"max_num_batched_tokens", c.scheduler.max_num_batched_tokens},
          {"max_num_seqs", c.scheduler.max_num_seqs},
          {"max_model_len", engine.max_model_len()},
          {"enable_prefix_caching", c.enable_prefix_caching},
          {"exact_matmul", backend_option_bool(c.backend_options, engine.backend().name(), "exact_matmul", false)}};
}

nlohmann::json record(const char* mode, nlohmann::json machine_start) {
  nlohmann::json j = {{"mode", mode}, {"pagellm_version", PAGELLM_VERSION}, {"machine", std::move(machine_start)}};
  return j;
}

void finish_record(nlohmann::json& j) { j["machine"]["loadavg_end"] = bench::machine_info()["loadavg"]; }

struct LatencyFlags {
  int32_t input_len = 128;
  std::string input_lens;
  int32_t output_len = 128, batch_size = 1, num_iters = 5, num_iters_warmup = 1;
  std::string output_json;
};

struct ThroughputFlags {
  std::string dataset;
  int32_t num_prompts = 64, input_len = 128, output_len = 128, num_iters = 1;
  bool no_warmup = false;
  std::string output_json;
};

struct ServeFlags {
  bench::ServeOptions opts;
  std::string request_rate = "inf";
  std::string extra_body;
  std::string tokenizer;
  std::string output_json;
};

struct MemoryFlags {
  std::string size = "1GiB";
  int threads = 0, reps = 5;
  std::string output_json;
  // --kv-report: the KV pool under a mixed workload instead of bandwidth.
  bool kv_report = false;
  std::string model, load_format = "dummy", dummy_shape = "tinyllama-1.1b", dummy_type = "q4_0";
  std::string kv_cache_memory = "256MiB", block_allocation = "any";
  int block_size = 16, max_num_seqs = 64, max_model_len = 1024;
  bench::KvReportOptions kv;
};

int run_latency_cmd(const CLI::App* app, const EngineFlags& ef, const LatencyFlags& f) {
  ef.load_config_file();
  bench::LatencyOptions o;
  o.input_lens = f.input_lens.empty() ? std::vector<int32_t>{f.input_len} : parse_int_list(f.input_lens, "--input-lens");
  o.output_len = f.output_len;
  o.batch_size = f.batch_size;
  o.num_iters = f.num_iters;
  o.num_iters_warmup = f.num_iters_warmup;
  o.seed = ef.to_config().seed.value_or(0);  // the engine's --seed: prompts and sampling
  o.validate();
  const int32_t longest = *std::max_element(o.input_lens.begin(), o.input_lens.end());
  nlohmann::json j = record("latency", bench::machine_info());
  auto engine = load_engine(bench_engine_config(ef, app, o.batch_size * longest, longest + o.output_len, o.batch_size), app);
  const TraceSession trace(ef.text("trace"));  // after loading: the timeline shows the runs only
  const CommProbe comm(*engine);
  const auto cases = bench::run_latency(*engine, o, log_line);
  std::fputs(bench::latency_summary(cases).c_str(), stderr);
  if (engine->communicator()) j["communication"] = comm.report(*engine);
  if (engine->config().profile) std::fprintf(stderr, "profile: %s\n", engine->model().backend().profile_report().c_str());
  const bench::SpecCounts spec = bench::spec_counts(engine->metrics());
  std::fputs(bench::spec_summary(spec).c_str(), stderr);
  j["engine"] = engine_json(*engine, ef);
  j["options"] = {{"input_lens", o.input_lens}, {"output_len", o.output_len},          {"batch_size", o.batch_size},
                  {"num_iters", o.num_iters},   {"num_iters_warmup", o.num_iters_warmup}, {"seed", o.seed}};
  j["results"] = bench::latency_json(cases);
  j["speculative"] = bench::spec_json(spec);
  finish_record(j);
  write_json(j, f.output_json);
  return 0;
}

int run_dataset_cmd(const CLI::App* app, const EngineFlags& ef, const ThroughputFlags& f) {
  bench::DatasetOptions o;
  o.path = f.dataset;
  o.default_max_tokens = f.output_len;
  o.num_iters = f.num_iters;
  o.warmup = !f.no_warmup;
  nlohmann::json j = record("throughput", bench::machine_info());
  // A dataset's lengths vary: the model's own context unless given.
  auto engine = load_engine(ef.to_config(), app);
  const TraceSession trace(ef.text("trace"));
  const auto runs = bench::run_dataset(*engine, o, log_line);
  std::fputs(bench::dataset_summary(runs, o).c_str(), stderr);
  if (engine->config().profile) std::fprintf(stderr, "profile: %s\n", engine->profile_report().c_str());
  j["engine"] = engine_json(*engine, ef);
  j["engine"]["speculative_config"] = engine->config().speculative.describe();
  j["results"] = bench::dataset_json(runs, o);
  finish_record(j);
  write_json(j, f.output_json);
  return 0;
}

int run_throughput_cmd(const CLI::App* app, const EngineFlags& ef, const ThroughputFlags& f) {
  ef.load_config_file();
  if (!f.dataset.empty()) return run_dataset_cmd(app, ef, f);
  bench::ThroughputOptions o;
  o.num_prompts = f.num_prompts;
  o.input_len = f.input_len;
  o.output_len = f.output_len;
  o.num_iters = f.num_iters;
  o.warmup = !f.no_warmup;
  o.seed = ef.to_config().seed.value_or(0);  // the engine's --seed: prompts and sampling
  o.validate();
  nlohmann::json j = record("throughput", bench::machine_info());
  auto engine = load_engine(bench_engine_config(ef, app, 0, o.input_len + o.output_len, 0), app);
  const TraceSession trace(ef.text("trace"));  // after loading: the timeline shows the runs only
  const auto runs = bench::run_throughput(*engine, o, log_line);
  std::fputs(bench::throughput_summary(runs, o).c_str(), stderr);
  if (engine->config().profile) std::fprintf(stderr, "profile: %s\n", engine->model().backend().profile_report().c_str());
  const bench::SpecCounts spec = bench::spec_counts(engine->metrics());
  std::fputs(bench::spec_summary(spec).c_str(), stderr);
  j["engine"] = engine_json(*engine, ef);
  j["results"] = bench::throughput_json(runs, o);
  j["speculative"] = bench::spec_json(spec);
  finish_record(j);
  write_json(j, f.output_json);
  return 0;
}

int run_serve_cmd(ServeFlags& f) {
  bench::ServeOptions& o = f.opts;
  if (f.request_rate == "inf") {
    o.request_rate = std::numeric_limits<double>::infinity();
  } else {
    try {
      size_t used = 0;
      o.request_rate = std::stod(f.request_rate, &used);
      if (used != f.request_rate.size()) throw std::invalid_argument(f.request_rate);
    } catch (const std::exception&) {
      fail("--request-rate takes a number of requests per second or 'inf', got '{}'", f.request_rate);
    }
  }
  if (!f.extra_body.empty()) {
    try {
      o.extra_body = parse_json_bounded(f.extra_body, kRequestJsonLimits, "--extra-body");
    } catch (const std::exception& e) {
      fail("{}", e.what());
    }
  }
  if (o.api_key.empty())
    if (const char* key = std::getenv("OPENAI_API_KEY"); key && *key) o.api_key = key;
  o.validate();
  std::unique_ptr<Tokenizer> tokenizer;
  if (!f.tokenizer.empty()) {
    tokenizer = Tokenizer::load(f.tokenizer);
    o.vocab_size = tokenizer->vocab_size();
  }
  nlohmann::json j = record("serve", bench::machine_info());
  const bench::ServeResult r = bench::run_serve(o, tokenizer.get(), log_line);
  std::fputs(bench::serve_metrics_summary(r.metrics).c_str(), stderr);
  if (o.turns > 1) {
    const bench::TurnTtft t = bench::turn_ttft(r.records);
    std::fprintf(stderr, "TTFT p50: first turns %.1f ms (%zu), later turns %.1f ms (%zu)\n", t.first.median * 1000,
                 t.first.count, t.later.median * 1000, t.later.count);
  }
  j["results"] = bench::serve_json(r, o);
  finish_record(j);
  write_json(j, f.output_json);
  return r.metrics.completed > 0 ? 0 : 1;
}

int run_kv_report_cmd(const MemoryFlags& f) {
  EngineConfig c;
  c.model = f.model;
  c.load_format = f.model.empty() ? f.load_format : "auto";
  c.dummy_shape = f.dummy_shape;
  c.dummy_type = dtype_from_name(f.dummy_type);
  if (f.threads > 0) c.backend_options["threads"] = std::to_string(f.threads);
  c.kv_cache_memory = parse_byte_size(f.kv_cache_memory);
  c.block_size = f.block_size;
  c.block_allocation = f.block_allocation == "contiguous" ? AllocationPolicy::Contiguous : AllocationPolicy::Any;
  c.scheduler.max_num_seqs = f.max_num_seqs;
  c.scheduler.max_model_len = f.max_model_len;
  auto engine = load_engine(c, nullptr);
  nlohmann::json j = record("memory-kv-report", bench::machine_info());
  const bench::KvReport r = bench::run_kv_report(*engine, f.kv, log_line);
  std::fputs(bench::kv_report_summary(r).c_str(), stderr);
  j["engine"] = {{"description", engine->describe()}, {"block_allocation", f.block_allocation}};
  j["results"] = bench::kv_report_json(r);
  finish_record(j);
  write_json(j, f.output_json);
  return 0;
}

int run_memory_cmd(const MemoryFlags& f) {
  if (f.kv_report) return run_kv_report_cmd(f);
  bench::MemoryProbeOptions o;
  o.buffer_bytes = parse_byte_size(f.size);
  o.threads = f.threads;
  o.reps = f.reps;
  nlohmann::json j = record("memory", bench::machine_info());
  const auto r = bench::run_memory_probe(o, log_line);
  std::fputs(bench::memory_probe_summary(r).c_str(), stderr);
  j["results"] = bench::memory_probe_json(r);
  finish_record(j);
  write_json(j, f.output_json);
  return 0;
}

}  // namespace

Command register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "Benchmarks: latency, throughput, serve, memory, ops");
  sub->require_subcommand(1);

  auto* lat = sub->add_subcommand("latency", "Prompt processing and decode tokens/s of one batch (like llama-bench)");
  auto lat_engine = add_engine_flags(lat);
  auto lf = std::make_shared<LatencyFlags>();
  lat->add_option("--input-len", lf->input_len, "Prompt tokens per request")->capture_default_str();
  lat->add_option("--input-lens", lf->input_lens, "Several prompt lengths, e.g. 128,512 (reports each)");
  lat->add_option("--output-len", lf->output_len, "Generated tokens per request")->capture_default_str();
  lat->add_option("--batch-size", lf->batch_size, "Requests per batch")->capture_default_str();
  lat->add_option("--num-iters", lf->num_iters, "Measured iterations")->capture_default_str();
  lat->add_option("--num-iters-warmup", lf->num_iters_warmup, "Unmeasured iterations first (at most 16 output tokens each)")->capture_default_str();
  lat->add_option("--output-json", lf->output_json, "Write the JSON record here instead of stdout");

  auto* thr = sub->add_subcommand("throughput", "Offline throughput: every request submitted at once");
  auto thr_engine = add_engine_flags(thr);
  auto tf = std::make_shared<ThroughputFlags>();
  thr->add_option("--dataset", tf->dataset,
                  "JSONL prompt file ({\"prompt\": TEXT, \"max_tokens\": N} per line) instead of random token ids: "
                  "greedy, stopping at end-of-sequence; --output-len is the default max_tokens");
  thr->add_option("--num-prompts", tf->num_prompts, "Requests")->capture_default_str();
  thr->add_option("--input-len", tf->input_len, "Prompt tokens per request")->capture_default_str();
  thr->add_option("--output-len", tf->output_len, "Generated tokens per request")->capture_default_str();
  thr->add_option("--num-iters", tf->num_iters, "Measured runs")->capture_default_str();
  thr->add_flag("--no-warmup", tf->no_warmup, "Skip the short warm-up request");
  thr->add_option("--output-json", tf->output_json, "Write the JSON record here instead of stdout");

  auto* srv = sub->add_subcommand("serve", "Streaming load on an OpenAI-compatible server (/v1/completions)");
  auto sf = std::make_shared<ServeFlags>();
  srv->add_option("--base-url", sf->opts.base_url, "Server address (http only)")->capture_default_str();
  srv->add_option("--endpoint", sf->opts.endpoint, "Completions path")->capture_default_str();
  srv->add_option("--model", sf->opts.model, "Model name to request (default: the first of /v1/models)");
  srv->add_option("--num-prompts", sf->opts.num_prompts, "Requests in all")->capture_default_str();
  srv->add_option("--max-concurrency", sf->opts.max_concurrency, "Requests in flight at most (0: no limit)")
      ->capture_default_str();
  srv->add_option("--request-rate", sf->request_rate, "Poisson arrival rate per second, or inf (all at once)")
      ->capture_default_str();
  srv->add_option("--input-len", sf->opts.input_len, "Prompt tokens per request (text: approximately)")
      ->capture_default_str();
  srv->add_option("--output-len", sf->opts.output_len, "max_tokens of each request")->capture_default_str();
  srv->add_option("--prompt-format", sf->opts.prompt_format,
                  "text (random common words), or tokens (a list of ids; not every server takes it)")
      ->capture_default_str();
  srv->add_option("--tokenizer", sf->tokenizer, "GGUF or HF folder whose tokenizer makes text prompts exact in length");
  srv->add_option("--vocab-size", sf->opts.vocab_size, "Range of random token ids (tokens format)")->capture_default_str();
  srv->add_option("--timeout", sf->opts.timeout_s, "Seconds for the whole run; unfinished requests fail")
      ->capture_default_str();
  srv->add_flag("--allow-remote", sf->opts.allow_remote, "Allow a non-loopback server");
  srv->add_flag("!--no-ignore-eos", sf->opts.ignore_eos, "Do not send ignore_eos (let requests stop early)");
  srv->add_option("--extra-body", sf->extra_body, "JSON object merged into every request, e.g. '{\"min_tokens\":128}'");
  srv->add_option("--api-key", sf->opts.api_key, "Bearer token (default: $OPENAI_API_KEY)");
  srv->add_option("--seed", sf->opts.seed, "Seed of prompts and arrivals")->capture_default_str();
  srv->add_option("--multi-turn", sf->opts.turns,
                  "Turns per conversation: --num-prompts conversations, each turn's prompt the last one's prompt, "
                  "reply and --turn-input-len new tokens (a prefix cache's workload)")
      ->capture_default_str();
  srv->add_option("--turn-input-len", sf->opts.turn_input_len, "New user tokens per later turn (text: approximately)")
      ->capture_default_str();
  srv->add_option("--think-time", sf->opts.think_time_s, "Seconds between a reply and the next turn")
      ->capture_default_str();
  srv->add_option("--output-json", sf->output_json, "Write the JSON record here instead of stdout");

  auto* mem = sub->add_subcommand("memory", "Memory read bandwidth (the decode roofline)");
  auto mf = std::make_shared<MemoryFlags>();
  mem->add_option("--size", mf->size, "Buffer size (e.g. 1GiB; 4MiB for cache)")->capture_default_str();
  mem->add_option("-t,--threads", mf->threads, "Reading threads (default: all cores)")->capture_default_str();
  mem->add_option("--reps", mf->reps, "Measured repetitions")->capture_default_str();
  mem->add_option("--output-json", mf->output_json, "Write the JSON record here instead of stdout");
  mem->add_flag("--kv-report", mf->kv_report,
                "Instead: run mixed requests through an engine and report the KV pool at its fullest (block usage, "
                "fragmentation, runs of available blocks, contiguous-placement hit rate)");
  mem->add_option("-m,--model", mf->model, "--kv-report: model file (default: random weights of --dummy-shape)");
  mem->add_option("--dummy-shape", mf->dummy_shape, "--kv-report: shape of the random-weight model")->capture_default_str();
  mem->add_option("--dummy-type", mf->dummy_type, "--kv-report: weight type of the random-weight model")
      ->capture_default_str();
  mem->add_option("--kv-cache-memory", mf->kv_cache_memory, "--kv-report: KV cache budget")->capture_default_str();
  mem->add_option("--block-size", mf->block_size, "--kv-report: tokens per block")
      ->check(CLI::IsMember({8, 16, 32, 64}))
      ->capture_default_str();
  mem->add_option("--block-allocation", mf->block_allocation, "--kv-report: any or contiguous")
      ->check(CLI::IsMember({"any", "contiguous"}))
      ->capture_default_str();
  mem->add_option("--max-num-seqs", mf->max_num_seqs, "--kv-report: sequences at once")->capture_default_str();
  mem->add_option("--max-model-len", mf->max_model_len, "--kv-report: context length")->capture_default_str();
  mem->add_option("--num-prompts", mf->kv.num_prompts, "--kv-report: requests")->capture_default_str();
  mem->add_option("--seed", mf->kv.seed, "--kv-report: seed of the request lengths")->capture_default_str();

  auto run_ops = std::make_shared<std::function<int()>>();
  auto* ops = add_bench_ops(*sub, *run_ops);

  return {sub, [=]() {
            if (ops->parsed()) return (*run_ops)();
            if (lat->parsed()) return run_latency_cmd(lat, *lat_engine, *lf);
            if (thr->parsed()) return run_throughput_cmd(thr, *thr_engine, *tf);
            if (srv->parsed()) return run_serve_cmd(*sf);
            return run_memory_cmd(*mf);
          }};
}

}  // namespace pagellm::cli
