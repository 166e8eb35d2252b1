#include "cli/engine_options.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/trace.h"
#include "core/util.h"
#include "cli/yaml_config.h"
#include "embed/engine_args.h"

namespace pagellm::cli {

std::shared_ptr<EngineFlags> add_engine_flags(CLI::App* app) {
  auto f = std::make_shared<EngineFlags>();
  app->add_option("-m,--model", f->model, "GGUF file or Hugging Face folder (default: Gemma 3 270M Q4_K_M)");
  app->add_option("--tokenizer", f->tokenizer, "Tokenizer from another GGUF file or HF folder");
  app->add_option("--load-format", f->load_format, "auto, or dummy (random weights of --dummy-shape)")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->capture_default_str();
  app->add_option("--dummy-shape", f->dummy_shape, "Shape of a dummy model (tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, gemma3-270m, tiny-*)")
      ->capture_default_str();
  app->add_option("--dummy-type", f->dummy_type, "Weight type of a dummy model (f16, bf16, q8_0, q4_0, q4_k, ...)")
      ->capture_default_str();
  app->add_option("--device", f->device, "Device to run on: cpu, or opencl[:N] (a plugin backend)")
      ->capture_default_str();
  app->add_option("--backend-plugin", f->backend_plugins,
                  "Load a backend plugin library (repeatable); plugins are also found in the plugin folder");
  app->add_option("--backend-option", f->backend_options,
                  "KEY=VALUE for the device's backend (repeatable), e.g. threads=4, platform=1");
  app->add_option("-t,--threads", f->threads, "CPU backend: worker threads (default: all cores); "
                  "the same as --backend-option threads=N")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--gpu-memory-utilization", f->gpu_memory_utilization,
                  "Fraction of the device's memory for weights, activations and KV cache (default 0.9 on devices "
                  "with their own memory)")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--block-size", f->block_size, "KV cache block size in tokens")
      ->check(CLI::IsMember({8, 16, 32, 64}))
      ->capture_default_str();
  app->add_option("--kv-cache-memory", f->kv_cache_memory,
                  "KV cache budget, e.g. 2GiB (default: a quarter of available memory, at most what max-num-seqs "
                  "full-length sequences need)");
  app->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                  "KV cache element type: auto (fp16), fp16, f32, or int8 (one float scale per token and KV head; "
                  "half the memory of fp16)")
      ->check(CLI::IsMember(enum_names(kKvCacheDtypeNames)))
      ->capture_default_str();
  app->add_option("--max-model-len", f->max_model_len, "Longest sequence (prompt + output); default: the model's")
      ->check(CLI::NonNegativeNumber);
  f->max_num_seqs_opt = app->add_option("--max-num-seqs", f->max_num_seqs, "Sequences running at once")
                            ->check(CLI::PositiveNumber)
                            ->capture_default_str();
  f->max_num_batched_tokens_opt =
      app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "Token budget of one engine step")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  f->long_prefill_opt =
      app->add_option("--long-prefill-token-threshold", f->long_prefill_token_threshold,
                      "At most this many tokens of one prompt per step (chunked prefill), so decodes keep "
                      "their pace; 0: off")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
  app->add_option("--scheduling-preset", f->scheduling_preset,
                  "latency (small steps: 512 tokens, 32 sequences, prompts in 128-token chunks, conservative "
                  "admission), balanced (2048, 128, 512, conservative) or throughput (8192, 256, whole prompts, "
                  "aggressive); flags given explicitly win")
      ->check(CLI::IsMember({"latency", "balanced", "throughput"}));
  f->preemption_policy_opt =
      app->add_option("--preemption-policy", f->preemption_policy,
                      "Admission: aggressive (whenever blocks can be allocated) or conservative (keep free blocks "
                      "for running sequences to grow into, so admitting never forces a preemption at once)")
          ->check(CLI::IsMember(enum_names(kAdmissionPolicyNames)))
          ->capture_default_str();
  app->add_option("--priority-aging-steps", f->priority_aging_steps,
                  "With --scheduling-policy priority: a request moves up one rank among the distinct priority "
                  "values present per this many engine steps, so with D values present it runs before anything "
                  "that arrives D x this many steps after it, whatever the values (0: no aging; low priority "
                  "may then starve)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_flag("--enable-prefix-caching,!--no-prefix-caching", f->enable_prefix_caching,
                "Reuse KV blocks of identical prompt prefixes (default on)");
  app->add_flag("--enable-chunked-prefill,!--no-chunked-prefill", f->enable_chunked_prefill,
                "Split long prompts across steps, mixed with decodes (default on)");
  app->add_option("--block-allocation", f->block_allocation, "Physical block placement")
      ->check(CLI::IsMember(enum_names(kAllocationPolicyNames)))
      ->capture_default_str();
  app->add_option("--preemption-mode", f->preemption_mode,
                  "How a preempted sequence gets its KV back: recompute, or swap (to a host pool of --swap-space; "
                  "backends with their own memory)")
      ->check(CLI::IsMember(enum_names(kPreemptionModeNames)))
      ->capture_default_str();
  app->add_option("--swap-space", f->swap_space_gib, "Host memory for swapped-out KV blocks, GiB (with --preemption-mode swap)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--scheduling-policy", f->scheduling_policy, "fcfs, or priority (requests' priority field)")
      ->check(CLI::IsMember(enum_names(kSchedulingPolicyNames)))
      ->capture_default_str();
  app->add_option("--kv-eviction", f->kv_eviction,
                  "none (a sequence stops at --max-model-len), or sliding (StreamingLLM: it keeps its first "
                  "--attention-sinks tokens and its most recent ones, max-model-len tokens of KV in all, and goes on)")
      ->check(CLI::IsMember(enum_names(kKvEvictionNames)))
      ->capture_default_str();
  app->add_option("--attention-sinks", f->attention_sinks, "With --kv-eviction sliding: tokens kept from the start")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--step-composition", f->step_composition,
                  "Which prefills a full step takes: fcfs (queue order), or length-aware (shortest first; a long "
                  "prefill's chunk leaves room for shorter waiting prompts; bounded wait for long ones)")
      ->check(CLI::IsMember(enum_names(kStepCompositionNames)))
      ->capture_default_str();
  app->add_option("--speculative-config", f->speculative_config,
                  "Speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                  "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' or '{\"model\": \"draft.gguf\", "
                  "\"num_speculative_tokens\": 4}' (a draft with the same vocabulary)");
  app->add_flag("--exact-matmul", f->exact_matmul,
                "CPU backend: float activations in matrix products (slower; no 8-bit activation rounding); "
                "the same as --backend-option exact_matmul=true");
  app->add_flag("--deterministic", f->deterministic,
                "Bit-identical outputs across runs, thread counts and batch compositions (fixed reduction order "
                "in every kernel); requests without a seed sample with --seed (0 by default)");
  app->add_option("--seed", f->seed,
                  "Sampling seed of requests that give none (reproducible output); bench latency and throughput: "
                  "also of the random prompts")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--profile", f->profile, "Print a time breakdown per step phase and per op kind");
  app->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "Split attention heads, FFN units and the vocabulary over this many ranks (launch with "
                  "mpirun -np N; rank 0 serves, the others run their shard of every step)")
      ->check(CLI::Range(1, 64));
  app->add_option("--pipeline-parallel-size", f->pipeline_parallel_size,
                  "Split the layers over this many pipeline stages (ranks of mpirun)")
      ->check(CLI::Range(1, 64));
  app->add_option("--pipeline-layer-partition", f->pipeline_layer_partition,
                  "Layers of each pipeline stage, comma-separated (\"12,10\"; vLLM's VLLM_PP_LAYER_PARTITION), "
                  "or 'balanced': stages balanced by the bytes of weights each reads per token, the last one's "
                  "output matrix included (faster decode, slower prefill when that matrix is large); by "
                  "default equal layer counts");
  app->add_option("--pipeline-micro-batches", f->pipeline_micro_batches,
                  "Micro-batches per step under pipeline parallelism (0: twice the stages)")
      ->check(CLI::Range(0, 1024));
  app->add_option("--grammar-max-bytes", f->grammar_max_bytes,
                  "Structured outputs: largest schema, regex, grammar or choice list (text); larger get 400")
      ->capture_default_str();
  app->add_option("--grammar-max-depth", f->grammar_max_depth,
                  "Structured outputs: deepest nesting of a schema (JSON levels), regex (groups) or grammar "
                  "(parentheses); deeper get 400 (at most 128: building a grammar grows faster than linearly "
                  "with depth)")
      ->check(CLI::Range(1, kMaxGrammarDepth))
      ->capture_default_str();
  app->add_option("--grammar-max-nodes", f->grammar_max_nodes,
                  "Structured outputs: most JSON values in a schema, atoms in a regex or grammar (bounded repetitions "
                  "counted in full), or choices; more get 400")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app->add_option("--grammar-compile-workers", f->grammar_compile_workers,
                  "Grammars compiled at once, each in its own worker process")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_option("--grammar-compile-timeout", f->grammar_compile_timeout,
                  "Seconds one grammar may take to compile; its worker is then killed and the request gets 400")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  app->add_option("--grammar-compile-memory", f->grammar_compile_memory,
                  "Memory one grammar compile may take (e.g. 1GiB); its worker is then killed and the request gets 400")
      ->capture_default_str();
  app->add_option("--grammar-cache-memory", f->grammar_cache_memory,
                  "Memory of the compiled-grammar cache (at most 64 grammars; one is a few MiB for a large "
                  "vocabulary); the least recently used go first")
      ->capture_default_str();
  app->add_option("--trace", f->trace, "Write a Chrome-trace JSON timeline of steps and ops to this file");
  app->add_option("--config", f->config_file,
                  "YAML file of flags, as vLLM's --config: `max-num-seqs: 64` per line (underscores or dashes); "
                  "flags on the command line override it");
  f->app = app;
  return f;
}

const SchedulingPreset* find_scheduling_preset(const std::string& name) {
  // latency: small steps bound each decode's wait behind prefill work;
  // throughput: big steps, whole prompts, every sequence admitted at once.
  static const SchedulingPreset presets[] = {
      {"latency", 512, 32, 128, "conservative"},
      {"balanced", 2048, 128, 512, "conservative"},
      {"throughput", 8192, 256, 0, "aggressive"},
  };
  for (const SchedulingPreset& p : presets)
    if (name == p.name) return &p;
  return nullptr;
}

namespace {

// "12,10" -> {12, 10}; "" -> {} (equal counts).
std::vector<int> parse_layer_partition(const std::string& text) {
  std::vector<int> counts;
  if (text.empty()) return counts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int n = 0;
    size_t used = 0;
    try {
      n = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || n < 1)
      fail("--pipeline-layer-partition '{}': expected 'balanced' or positive layer counts separated by commas "
           "(\"12,10\")",
           text);
    counts.push_back(n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

}  // namespace

void EngineFlags::load_config_file() const {
  if (config_loaded) return;
  config_loaded = true;
  if (!config_file.empty()) apply_config_file(app, config_file);
}

EngineConfig EngineFlags::to_config() const {
  load_config_file();
  EngineConfig c;
  c.load_format = load_format;
  c.model = model;
  if (c.model.empty() && load_format == "auto") c.model = embed::default_model_path();
  c.tokenizer = tokenizer;
  c.dummy_shape = dummy_shape;
  c.dummy_type = dtype_from_name(dummy_type);
  c.device = device;
  c.backend_plugins = backend_plugins;
  for (const std::string& kv : backend_options) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("--backend-option '{}': expected KEY=VALUE", kv);
    c.backend_options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (threads >= 0) c.backend_options["threads"] = std::to_string(threads);
  if (exact_matmul) c.backend_options["exact_matmul"] = "true";
  c.gpu_memory_utilization = gpu_memory_utilization;
  c.block_size = block_size;
  c.kv_cache_memory = kv_cache_memory.empty() ? 0 : parse_byte_size(kv_cache_memory);
  PAGELLM_CHECK(kv_cache_memory.empty() || c.kv_cache_memory > 0, "--kv-cache-memory must be positive");
  c.kv_cache_dtype = enum_from_name(kKvCacheDtypeNames, kv_cache_dtype, "--kv-cache-dtype");
  c.enable_prefix_caching = enable_prefix_caching;
  c.block_allocation = enum_from_name(kAllocationPolicyNames, block_allocation, "--block-allocation");
  c.scheduler.max_model_len = max_model_len;
  c.scheduler.max_num_seqs = max_num_seqs;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.long_prefill_token_threshold = long_prefill_token_threshold;
  std::string admission = preemption_policy;
  if (!scheduling_preset.empty()) {
    const SchedulingPreset* p = find_scheduling_preset(scheduling_preset);
    PAGELLM_CHECK(p != nullptr, "unknown --scheduling-preset '{}'", scheduling_preset);
    const auto unset = [](const CLI::Option* o) { return o == nullptr || o->count() == 0; };
    if (unset(max_num_seqs_opt)) c.scheduler.max_num_seqs = p->max_num_seqs;
    if (unset(max_num_batched_tokens_opt)) c.scheduler.max_num_batched_tokens = p->max_num_batched_tokens;
    if (unset(long_prefill_opt)) c.scheduler.long_prefill_token_threshold = p->long_prefill_token_threshold;
    if (unset(preemption_policy_opt)) admission = p->preemption_policy;
  }
  c.scheduler.admission_policy = enum_from_name(kAdmissionPolicyNames, admission, "--preemption-policy");
  c.scheduler.priority_aging_steps = priority_aging_steps;
  c.scheduler.enable_chunked_prefill = enable_chunked_prefill;
  c.scheduler.policy = enum_from_name(kSchedulingPolicyNames, scheduling_policy, "--scheduling-policy");
  c.scheduler.composition = enum_from_name(kStepCompositionNames, step_composition, "--step-composition");
  c.scheduler.kv_eviction = enum_from_name(kKvEvictionNames, kv_eviction, "--kv-eviction");
  c.scheduler.attention_sinks = attention_sinks;
  c.scheduler.preemption_mode = enum_from_name(kPreemptionModeNames, preemption_mode, "--preemption-mode");
  c.swap_space_bytes = static_cast<int64_t>(swap_space_gib * static_cast<double>(int64_t{1} << 30));
  c.speculative = parse_speculative_config(speculative_config);
  c.profile = profile;
  c.deterministic = deterministic;
  c.tensor_parallel_size = tensor_parallel_size;
  c.pipeline_parallel_size = pipeline_parallel_size;
  c.pipeline_micro_batches = pipeline_micro_batches;
  if (pipeline_layer_partition == "balanced")
    c.pipeline_balance_stages = true;
  else
    c.pipeline_layer_partition = parse_layer_partition(pipeline_layer_partition);
  if (seed >= 0) c.seed = static_cast<uint64_t>(seed);
  structured::GrammarCompilerOptions& g = c.grammar;
  g.limits.max_bytes = static_cast<size_t>(parse_byte_size(grammar_max_bytes));
  PAGELLM_CHECK(g.limits.max_bytes > 0, "--grammar-max-bytes must be positive");
  g.limits.max_depth = grammar_max_depth;
  g.limits.max_nodes = grammar_max_nodes;
  g.workers = grammar_compile_workers;
  g.budget.time = std::chrono::milliseconds(static_cast<int64_t>(grammar_compile_timeout * 1000));
  g.budget.memory_bytes = static_cast<size_t>(parse_byte_size(grammar_compile_memory));
  PAGELLM_CHECK(g.budget.memory_bytes >= (size_t{16} << 20), "--grammar-compile-memory must be at least 16MiB");
  g.cache_bytes = static_cast<size_t>(parse_byte_size(grammar_cache_memory));
  return c;
}

TraceSession::TraceSession(std::string path) : path_(std::move(path)) {
  if (!path_.empty()) trace::enable(true);
}

TraceSession::~TraceSession() {
  if (path_.empty()) return;
  trace::enable(false);
  try {
    trace::write(path_);
    spdlog::info("trace written to {}", path_);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

LoadProgress load_progress_reporter() {
  if (!isatty(fileno(stderr))) return {};
  return [](size_t done, size_t total) {
    constexpr int kWidth = 40;
    const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
    std::fprintf(stderr, "\rloading [%s%s] %zu/%zu tensors", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace pagellm::cli
