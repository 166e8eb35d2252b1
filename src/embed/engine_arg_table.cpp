#include "embed/engine_arg_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/request_limits.h"
#include "core/util.h"
#include "spec/spec_config.h"

namespace pagellm::embed {
namespace {

using nlohmann::json;

int32_t to_i32(const json& v) { return static_cast<int32_t>(v.get<int64_t>()); }

template <typename E, size_t N>
E to_enum(const EnumName<E> (&names)[N], const json& v) {
  return enum_from_name(names, v.get<std::string>(), "");  // the row's choices checked it already
}

// "12,10" -> {12, 10}.
std::vector<int> layer_counts(const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', start), text.size());
    int n = 0;
    const auto [end, ec] = std::from_chars(text.data() + start, text.data() + comma, n);
    if (comma == start || ec != std::errc() || end != text.data() + comma || n < 1)
      throw ArgValueError(fmt::format("expected 'balanced' or positive layer counts separated by commas (\"12,10\"), "
                                      "got '{}'",
                                      text));
    counts.push_back(n);
    if (comma == text.size()) return counts;
    start = comma + 1;
  }
}

// --kv-events-config: vLLM's KVEventsConfig JSON. Our publisher is the HTTP
// endpoint; ZMQ's settings (endpoint, topic, ...) do not apply.
void apply_kv_events_config(EngineArgs& a, const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ArgValueError(fmt::format("expected a JSON object: {}", e.what()));
  }
  if (!j.is_object()) throw ArgValueError("expected a JSON object, e.g. {\"enable_kv_cache_events\": true}");
  const json on = j.value("enable_kv_cache_events", json(false));
  if (!on.is_boolean()) throw ArgValueError("'enable_kv_cache_events' must be true or false");
  const json publisher = j.value("publisher", json("http"));
  if (!publisher.is_string() || (publisher != "http" && publisher != "sse" && publisher != "null"))
    throw ArgValueError(fmt::format("publisher {} is not supported: use \"http\" (Server-Sent Events on GET "
                                    "/v1/kv_events)",
                                    publisher.dump()));
  a.config.kv_events = on.get<bool>() && publisher != "null";
  if (j.contains("max_queue_size")) {
    const json& n = j["max_queue_size"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > (int64_t{1} << 30))
      throw ArgValueError("'max_queue_size' must be an integer from 1 to 2^30");
    a.config.kv_events_buffer = static_cast<size_t>(n.get<int64_t>());
  }
}

// --lora-modules: "name=path", or vLLM's JSON form {"name", "path", "base_model_name"}.
LoraModule parse_lora_module(const std::string& text) {
  LoraModule m;
  if (!text.empty() && text.front() == '{') {
    try {
      const json j = json::parse(text);
      m.name = j.at("name").get<std::string>();
      m.path = j.at("path").get<std::string>();
    } catch (const json::exception& e) {
      throw ArgValueError(fmt::format("expected name=path or {{\"name\": ..., \"path\": ...}}: {}", e.what()));
    }
  } else {
    const size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
      throw ArgValueError(fmt::format("expected name=path, got '{}'", text));
    m.name = text.substr(0, eq);
    m.path = text.substr(eq + 1);
  }
  if (m.name.empty() || m.path.empty()) throw ArgValueError(fmt::format("expected name=path, got '{}'", text));
  return m;
}

// What each --scheduling-preset sets (docs/performance.md measures them):
// latency: small steps bound each decode's wait behind prefill work;
// throughput: big steps, whole prompts, every sequence admitted at once.
struct SchedulingPreset {
  const char* name;
  PresetValues values;
};
const std::vector<SchedulingPreset>& scheduling_presets() {
  static const std::vector<SchedulingPreset> presets = {
      {"latency",
       {{"max-num-batched-tokens", "512"},
        {"max-num-seqs", "32"},
        {"long-prefill-token-threshold", "128"},
        {"preemption-policy", "conservative"}}},
      {"balanced",
       {{"max-num-batched-tokens", "2048"},
        {"max-num-seqs", "128"},
        {"long-prefill-token-threshold", "512"},
        {"preemption-policy", "conservative"}}},
      {"throughput",
       {{"max-num-batched-tokens", "8192"},
        {"max-num-seqs", "256"},
        {"long-prefill-token-threshold", "0"},
        {"preemption-policy", "aggressive"}}},
  };
  return presets;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const SchedulingPreset& p : scheduling_presets()) names.emplace_back(p.name);
  return names;
}

void ignore(EngineArgs&, const json&) {}

using T = ArgType;

const std::vector<EngineArg> kEngineArgs = {
    // The model
    {.name = "model",
     .short_flag = "-m",
     .help = "GGUF file or Hugging Face folder (default: Gemma 3 270M Q4_K_M)",
     .apply = [](EngineArgs& a, const json& v) { a.config.model = v.get<std::string>(); }},
    {.name = "tokenizer",
     .help = "Tokenizer from another GGUF file or HF folder",
     .apply = [](EngineArgs& a, const json& v) { a.config.tokenizer = v.get<std::string>(); }},
    {.name = "load-format",
     .type = T::Choice,
     .default_text = "auto",
     .choices = {"auto", "dummy"},
     .help = "auto, or dummy (random weights of --dummy-shape)",
     .apply = [](EngineArgs& a, const json& v) { a.config.load_format = v.get<std::string>(); }},
    {.name = "dummy-shape",
     .default_text = "tinyllama-1.1b",
     .help = "Shape of a dummy model (tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, gemma3-270m, tiny-*)",
     .apply = [](EngineArgs& a, const json& v) { a.config.dummy_shape = v.get<std::string>(); }},
    {.name = "dummy-type",
     .default_text = "q4_0",
     .help = "Weight type of a dummy model (f16, bf16, q8_0, q4_0, q4_k, ...)",
     .apply = [](EngineArgs& a, const json& v) { a.config.dummy_type = dtype_from_name(v.get<std::string>()); }},
    // Pooling models (engine/pooling.h)
    {.name = "task",
     .type = T::Choice,
     .default_text = "generate",
     .choices = {"generate", "embed", "score"},
     .help = "generate (completions, chat, responses, messages), embed (/v1/embeddings: pooled final hidden "
             "states) or score (/v1/rerank, /v1/score: a reranker's relevance scores)",
     .apply = [](EngineArgs& a, const json& v) { a.config.task = to_enum(kServeTaskNames, v); }},
    {.name = "runner",
     .type = T::Choice,
     .choices = {"auto", "generate", "pooling"},
     .help = "vLLM's spelling of --task: pooling is --task score for a reranker (a GGUF with rank pooling, a "
             "*ForSequenceClassification folder or --hf-overrides naming one) and --task embed otherwise; generate "
             "and auto are --task generate",
     .apply = [](EngineArgs& a, const json& v) {
       // After --convert classify (either order): that stays score.
       if (v.get<std::string>() == "pooling") {
         if (a.config.task != ServeTask::Score) a.config.task = ServeTask::Pooling;
       } else {
         a.config.task = ServeTask::Generate;
       }
     }},
    {.name = "convert",
     .type = T::Choice,
     .choices = {"auto", "embed", "classify"},
     .help = "vLLM's --convert with --runner pooling: embed is --task embed, classify is --task score",
     .apply = [](EngineArgs& a, const json& v) {
       const std::string c = v.get<std::string>();
       if (c == "embed") a.config.task = ServeTask::Embed;
       else if (c == "classify") a.config.task = ServeTask::Score;
     }},
    {.name = "hf-overrides",
     .help = "vLLM's --hf-overrides, a JSON object over a Hugging Face folder's config.json; served keys: "
             "architectures, classifier_from_token, is_original_qwen3_reranker (Qwen3-Reranker: "
             "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", "
             "\"yes\"], \"is_original_qwen3_reranker\": true}')",
     .apply = [](EngineArgs& a, const json& v) { a.config.hf_overrides = v.get<std::string>(); }},
    {.name = "score-template",
     .default_text = "auto",
     .help = "Scores: how a query and a document become one prompt: auto (the GGUF's rerank template, or "
             "Qwen3-Reranker's prompt when --hf-overrides says is_original_qwen3_reranker; else raw), raw (the "
             "query's tokens then the document's, as vLLM: the client formats), qwen3-reranker, or a file whose "
             "text has {query} and {document}",
     .apply = [](EngineArgs& a, const json& v) { a.config.score_template = v.get<std::string>(); }},
    {.name = "pooling",
     .type = T::Choice,
     .choices = {"last", "mean", "cls"},
     .help = "Embeddings: pool the last token, the mean of all tokens, or the first; by default the model's "
             "(sentence-transformers files, the GGUF's pooling_type; else last). Scores: last unless given",
     .apply = [](EngineArgs& a, const json& v) { a.config.pooling = to_enum(kPoolingTypeNames, v); }},
    {.name = "normalize",
     .negation = "no-normalize",
     .type = T::Bool,
     .help = "Embeddings: L2-normalise the pooled vectors (by default as the model says; a GGUF: yes)",
     .apply = [](EngineArgs& a, const json& v) { a.config.pooling_normalize = v.get<bool>(); }},
    // LoRA adapters
    {.name = "enable-lora",
     .type = T::Bool,
     .help = "Serve LoRA adapters on the base model: requests name one as `model`; adapters load at start "
             "(--lora-modules) or at run time (POST /v1/load_lora_adapter)",
     .apply = [](EngineArgs& a, const json& v) { a.config.lora.enabled = v.get<bool>(); }},
    {.name = "lora-modules",
     .aliases = {"lora-module"},
     .type = T::List,
     .help = "Adapters to serve, each name=path (a PEFT folder or a GGUF LoRA file) or vLLM's JSON "
             "'{\"name\": ..., \"path\": ...}' (repeatable; needs --enable-lora)",
     .apply =
         [](EngineArgs& a, const json& v) {
           for (const json& m : v) a.config.lora.modules.push_back(parse_lora_module(m.get<std::string>()));
         }},
    {.name = "max-loras",
     .type = T::Int,
     .default_text = "1",
     .min = 1,
     .max = 256,
     .help = "LoRA adapters one step may mix (the model's adapter slots); requests of more wait",
     .apply = [](EngineArgs& a, const json& v) { a.config.lora.max_loras = to_i32(v); }},
    {.name = "max-lora-rank",
     .type = T::Int,
     .default_text = "16",
     .min = 1,
     .max = 512,
     .help = "The highest adapter rank served (each slot holds this rank)",
     .apply = [](EngineArgs& a, const json& v) { a.config.lora.max_lora_rank = to_i32(v); }},
    {.name = "lora-dtype",
     .type = T::Choice,
     .default_text = "auto",
     .choices = {"auto", "float32", "float16", "bfloat16"},
     .help = "The adapters' precision in their slots: auto (float32 over a float32 model, else float16: half the "
             "bytes a step reads per adapter), float32, float16 or bfloat16",
     .apply =
         [](EngineArgs& a, const json& v) {
           const std::string t = v.get<std::string>();
           if (t == "auto") a.config.lora.dtype.reset();
           else a.config.lora.dtype = t == "float32" ? DType::F32 : t == "float16" ? DType::F16 : DType::BF16;
         }},
    {.name = "max-cpu-loras",
     .type = T::Int,
     .min = 1,
     .max = 4096,
     .help = "Unused LoRA adapters kept in host memory (least recently used dropped first, read again when "
             "asked for); default --max-loras",
     .apply = [](EngineArgs& a, const json& v) { a.config.lora.max_cpu_loras = to_i32(v); }},
    // The device
    {.name = "device",
     .default_text = "cpu",
     .help = "Device to run on: cpu, or opencl[:N] (a plugin backend)",
     .apply = [](EngineArgs& a, const json& v) { a.config.device = v.get<std::string>(); }},
    {.name = "backend-plugin",
     .aliases = {"backend-plugins"},
     .type = T::List,
     .help = "Load a backend plugin library (repeatable); plugins are also found in the plugin folder",
     .apply =
         [](EngineArgs& a, const json& v) {
           for (const json& p : v) a.config.backend_plugins.push_back(p.get<std::string>());
         }},
    {.name = "backend-option",
     .aliases = {"backend-options"},
     .type = T::Map,
     .help = "KEY=VALUE for the device's backend (repeatable), e.g. threads=4, platform=1",
     .apply =
         [](EngineArgs& a, const json& v) {
           for (const auto& item : v.items()) a.config.backend_options[item.key()] = item.value().get<std::string>();
         }},
    {.name = "threads",
     .aliases = {"num-threads"},
     .short_flag = "-t",
     .type = T::Int,
     .min = 0,
     .max = 4096,
     .help = "CPU backend: worker threads (default: all cores); the same as --backend-option threads=N",
     .apply = [](EngineArgs& a, const json& v) { a.config.backend_options["threads"] = v.dump(); }},
    {.name = "exact-matmul",
     .type = T::Bool,
     .default_text = "false",
     .help = "CPU backend: float activations in matrix products (slower; no 8-bit activation rounding); the same "
             "as --backend-option exact_matmul=true",
     .apply =
         [](EngineArgs& a, const json& v) {
           if (v.get<bool>()) a.config.backend_options["exact_matmul"] = "true";
         }},
    {.name = "repack",
     .negation = "no-repack",
     .type = T::Bool,
     .default_text = "true",
     .help = "CPU backend: repack weight matrices at load into the layouts of the SIMD kernels (a second copy, "
             "built on --threads threads; default on). --no-repack multiplies from the file's rows: less memory "
             "and a faster start, slower prompts; the same as --backend-option repack=false",
     .apply =
         [](EngineArgs& a, const json& v) {
           if (!v.get<bool>()) a.config.backend_options["repack"] = "false";
         }},
    {.name = "gpu-memory-utilization",
     .type = T::Float,
     .min_f = 0,
     .max_f = 1,
     .help = "Fraction of the device's memory for weights, activations and KV cache (default 0.9 on devices "
             "with their own memory)",
     .apply = [](EngineArgs& a, const json& v) { a.config.gpu_memory_utilization = v.get<double>(); }},
    // The KV cache
    {.name = "block-size",
     .type = T::Int,
     .default_text = "16",
     .choices = {"8", "16", "32", "64"},
     .help = "KV cache block size in tokens",
     .apply = [](EngineArgs& a, const json& v) { a.config.block_size = to_i32(v); }},
    {.name = "kv-cache-memory",
     .aliases = {"kv-cache-memory-bytes"},
     .type = T::Size,
     .min = 1,
     .help = "KV cache budget, e.g. 2GiB (default: a quarter of available memory, at most what max-num-seqs "
             "full-length sequences need)",
     .apply = [](EngineArgs& a, const json& v) { a.config.kv_cache_memory = v.get<int64_t>(); }},
    {.name = "kv-cache-dtype",
     .type = T::Choice,
     .default_text = "auto",
     .choices = enum_names(kKvCacheDtypeNames),
     .help = "KV cache element type: auto (fp16), fp16, f32, or int8 (one float scale per token and KV head; "
             "half the memory of fp16)",
     .apply = [](EngineArgs& a, const json& v) { a.config.kv_cache_dtype = to_enum(kKvCacheDtypeNames, v); }},
    {.name = "enable-prefix-caching",
     .negation = "no-prefix-caching",
     .type = T::Bool,
     .default_text = "true",
     .help = "Reuse KV blocks of identical prompt prefixes (default on)",
     .apply = [](EngineArgs& a, const json& v) { a.config.enable_prefix_caching = v.get<bool>(); }},
    {.name = "kv-offload-host-gb",
     .type = T::Float,
     .default_text = "0",
     .min_f = 0,
     .max_f = 1 << 20,
     .help = "KV offload tier in host memory, GiB (0: off): full prefix blocks are copied there as they are "
             "computed and loaded back when a prompt's prefix is no longer in the KV cache",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.config.kv_offload_host_bytes = static_cast<int64_t>(v.get<double>() * static_cast<double>(int64_t{1} << 30));
         }},
    {.name = "kv-offload-dir",
     .type = T::Text,
     .help = "KV offload tier on disk: a folder for full prefix blocks (one file each, checksummed), kept across "
             "restarts of the same model and settings",
     .apply = [](EngineArgs& a, const json& v) { a.config.kv_offload_dir = v.get<std::string>(); }},
    {.name = "kv-offload-disk-gb",
     .type = T::Float,
     .default_text = "10",
     .min_f = 0,
     .max_f = 1 << 24,
     .open_min = true,
     .help = "Size bound of the disk tier (--kv-offload-dir), GiB; least recently used blocks are deleted first",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.config.kv_offload_disk_bytes = static_cast<int64_t>(v.get<double>() * static_cast<double>(int64_t{1} << 30));
         }},
    {.name = "kv-events",
     .type = T::Bool,
     .default_text = "false",
     .help = "Publish KV cache events (blocks stored / removed / cleared, by hash; vLLM's shape) on GET "
             "/v1/kv_events for cache-aware routing (tools/kv_router.py)",
     .scope = ArgScope::CommandLine,  // the server publishes them
     .apply = [](EngineArgs& a, const json& v) { a.config.kv_events = v.get<bool>(); }},
    {.name = "kv-events-config",
     .type = T::Text,
     .help = "vLLM's form of --kv-events: JSON {\"enable_kv_cache_events\": true, \"publisher\": \"http\", "
             "\"max_queue_size\": N} (publisher http or sse: GET /v1/kv_events; max_queue_size: the event "
             "window, in blocks)",
     .scope = ArgScope::CommandLine,
     .apply = [](EngineArgs& a, const json& v) { apply_kv_events_config(a, v.get<std::string>()); }},
    {.name = "hybrid-kv-cache-manager",
     .negation = "disable-hybrid-kv-cache-manager",
     .type = T::Bool,
     .default_text = "true",
     .help = "KV-cache groups: sliding-window layers keep only the blocks their window sees, in block tables of "
             "their own (on backends that support it; off under --kv-eviction sliding)",
     .apply = [](EngineArgs& a, const json& v) { a.config.kv_cache_groups = v.get<bool>(); }},
    {.name = "block-allocation",
     .type = T::Choice,
     .default_text = "any",
     .choices = enum_names(kAllocationPolicyNames),
     .help = "Physical block placement",
     .apply = [](EngineArgs& a, const json& v) { a.config.block_allocation = to_enum(kAllocationPolicyNames, v); }},
    {.name = "kv-eviction",
     .type = T::Choice,
     .default_text = "none",
     .choices = enum_names(kKvEvictionNames),
     .help = "none (a sequence stops at --max-model-len), or sliding (StreamingLLM: it keeps its first "
             "--attention-sinks tokens and its most recent ones, max-model-len tokens of KV in all, and goes on)",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.kv_eviction = to_enum(kKvEvictionNames, v); }},
    {.name = "attention-sinks",
     .type = T::Int,
     .default_text = "4",
     .min = 0,
     .max = 1 << 20,
     .help = "With --kv-eviction sliding: tokens kept from the start",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.attention_sinks = to_i32(v); }},
    // The scheduler
    {.name = "max-model-len",
     .type = T::Int,
     .default_text = "0",
     .min = 0,
     .max = INT32_MAX,
     .help = "Longest sequence (prompt + output); default: the model's",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.max_model_len = to_i32(v); }},
    {.name = "max-num-seqs",
     .type = T::Int,
     .default_text = "256",
     .min = 1,
     .max = 1 << 20,
     .help = "Sequences running at once",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.max_num_seqs = to_i32(v); }},
    {.name = "max-num-batched-tokens",
     .type = T::Int,
     .default_text = "2048",
     .min = 1,
     .max = 1 << 24,
     .help = "Token budget of one engine step",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.max_num_batched_tokens = to_i32(v); }},
    {.name = "long-prefill-token-threshold",
     .type = T::Int,
     .default_text = "0",
     .min = 0,
     .max = 1 << 24,
     .help = "At most this many tokens of one prompt per step (chunked prefill), so decodes keep their pace; 0: off",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.long_prefill_token_threshold = to_i32(v); }},
    {.name = "scheduling-preset",
     .type = T::Choice,
     .choices = preset_names(),
     .help = "latency (small steps: 512 tokens, 32 sequences, prompts in 128-token chunks, conservative "
             "admission), balanced (2048, 128, 512, conservative) or throughput (8192, 256, whole prompts, "
             "aggressive); flags given explicitly win",
     .apply = ignore},  // EngineArgsBuilder::finish() applies it
    {.name = "preemption-policy",
     .type = T::Choice,
     .default_text = "aggressive",
     .choices = enum_names(kAdmissionPolicyNames),
     .help = "Admission: aggressive (whenever blocks can be allocated) or conservative (keep free blocks for "
             "running sequences to grow into, so admitting never forces a preemption at once)",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.config.scheduler.admission_policy = to_enum(kAdmissionPolicyNames, v);
         }},
    {.name = "priority-aging-steps",
     .type = T::Int,
     .default_text = "256",
     .min = 0,
     .max = INT32_MAX,
     .help = "With --scheduling-policy priority: a request moves up one rank among the distinct priority values "
             "present per this many engine steps, so with D values present it runs before anything that arrives "
             "D x this many steps after it, whatever the values (0: no aging; low priority may then starve)",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.priority_aging_steps = to_i32(v); }},
    {.name = "enable-chunked-prefill",
     .negation = "no-chunked-prefill",
     .type = T::Bool,
     .default_text = "true",
     .help = "Split long prompts across steps, mixed with decodes (default on)",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.enable_chunked_prefill = v.get<bool>(); }},
    {.name = "scheduling-policy",
     .type = T::Choice,
     .default_text = "fcfs",
     .choices = enum_names(kSchedulingPolicyNames),
     .help = "fcfs, or priority (requests' priority field)",
     .apply = [](EngineArgs& a, const json& v) { a.config.scheduler.policy = to_enum(kSchedulingPolicyNames, v); }},
    {.name = "step-composition",
     .type = T::Choice,
     .default_text = "fcfs",
     .choices = enum_names(kStepCompositionNames),
     .help = "Which prefills a full step takes: fcfs (queue order), or length-aware (shortest first; a long "
             "prefill's chunk leaves room for shorter waiting prompts; bounded wait for long ones)",
     .apply =
         [](EngineArgs& a, const json& v) { a.config.scheduler.composition = to_enum(kStepCompositionNames, v); }},
    {.name = "preemption-mode",
     .type = T::Choice,
     .default_text = "recompute",
     .choices = enum_names(kPreemptionModeNames),
     .help = "How a preempted sequence gets its KV back: recompute, or swap (to a host pool of --swap-space; "
             "backends with their own memory)",
     .apply =
         [](EngineArgs& a, const json& v) { a.config.scheduler.preemption_mode = to_enum(kPreemptionModeNames, v); }},
    {.name = "swap-space",
     .type = T::Float,
     .default_text = "4",
     .min_f = 0,
     .max_f = 1 << 20,
     .open_min = true,
     .help = "Host memory for swapped-out KV blocks, GiB (with --preemption-mode swap)",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.config.swap_space_bytes = static_cast<int64_t>(v.get<double>() * static_cast<double>(int64_t{1} << 30));
         }},
    // Decoding
    {.name = "speculative-config",
     .type = T::Json,
     .help = "Speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
             "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' or '{\"model\": \"draft.gguf\", "
             "\"num_speculative_tokens\": 4}' (a draft with the same vocabulary)",
     .apply =
         [](EngineArgs& a, const json& v) { a.config.speculative = parse_speculative_config(v.get<std::string>()); }},
    {.name = "device-sampling",
     .negation = "no-device-sampling",
     .type = T::Bool,
     .default_text = "true",
     .help = "Steps whose samples need only temperature, top-k, top-p and min-p are drawn by the backend's sample op, "
             "so only token ids leave the device; false: the logits rows always come to the host",
     .apply = [](EngineArgs& a, const json& v) { a.config.device_sampling = v.get<bool>(); }},
    {.name = "deterministic",
     .type = T::Bool,
     .default_text = "false",
     .help = "Bit-identical outputs across runs, thread counts and batch compositions (fixed reduction order in "
             "every kernel); requests without a seed sample with --seed (0 by default)",
     .apply = [](EngineArgs& a, const json& v) { a.config.deterministic = v.get<bool>(); }},
    {.name = "seed",
     .type = T::Int,
     .min = INT64_MIN,
     .max = INT64_MAX,
     .help = "Sampling seed of requests that give none (reproducible output); bench latency and throughput: also "
             "of the random prompts",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.seed = static_cast<uint64_t>(v.get<int64_t>());
           a.config.seed = a.seed;
         }},
    {.name = "profile",
     .type = T::Bool,
     .default_text = "false",
     .help = "Print a time breakdown per step phase and per op kind",
     .apply = [](EngineArgs& a, const json& v) { a.config.profile = v.get<bool>(); }},
    // Parallelism (an embedded engine runs on one rank: engine_args.cpp)
    {.name = "tensor-parallel-size",
     .type = T::Int,
     .default_text = "1",
     .min = 1,
     .max = 64,
     .help = "Split attention heads, FFN units and the vocabulary over this many ranks (launch with mpirun -np N; "
             "rank 0 serves, the others run their shard of every step)",
     .apply = [](EngineArgs& a, const json& v) { a.config.tensor_parallel_size = to_i32(v); }},
    {.name = "pipeline-parallel-size",
     .type = T::Int,
     .default_text = "1",
     .min = 1,
     .max = 64,
     .help = "Split the layers over this many pipeline stages (ranks of mpirun)",
     .apply = [](EngineArgs& a, const json& v) { a.config.pipeline_parallel_size = to_i32(v); }},
    {.name = "pipeline-layer-partition",
     .help = "Layers of each pipeline stage, comma-separated (\"12,10\"; vLLM's VLLM_PP_LAYER_PARTITION), or "
             "'balanced': stages balanced by the bytes of weights each reads per token, the last one's output "
             "matrix included (faster decode, slower prefill when that matrix is large); by default equal "
             "layer counts",
     .apply =
         [](EngineArgs& a, const json& v) {
           const std::string text = v.get<std::string>();
           a.config.pipeline_balance_stages = text == "balanced";
           a.config.pipeline_layer_partition = text == "balanced" || text.empty() ? std::vector<int>{}
                                                                                  : layer_counts(text);
         }},
    {.name = "pipeline-micro-batches",
     .type = T::Int,
     .default_text = "0",
     .min = 0,
     .max = 1024,
     .help = "Micro-batches per step under pipeline parallelism (0: twice the stages)",
     .apply = [](EngineArgs& a, const json& v) { a.config.pipeline_micro_batches = to_i32(v); }},
    // Structured outputs (structured/grammar.h)
    {.name = "grammar-max-bytes",
     .type = T::Size,
     .default_text = "64KiB",
     .min = 1,
     .help = "Structured outputs: largest schema, regex, grammar or choice list (text); larger get 400",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.limits.max_bytes = v.get<size_t>(); }},
    {.name = "grammar-max-depth",
     .type = T::Int,
     .default_text = std::to_string(GrammarLimits{}.max_depth),
     .min = 1,
     .max = kMaxGrammarDepth,
     .help = "Structured outputs: deepest nesting of a schema (JSON levels), regex (groups) or grammar "
             "(parentheses); deeper get 400 (at most 128: building a grammar grows faster than linearly with "
             "depth)",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.limits.max_depth = to_i32(v); }},
    {.name = "grammar-max-nodes",
     .type = T::Int,
     .default_text = std::to_string(GrammarLimits{}.max_nodes),
     .min = 1,
     .max = int64_t{1} << 30,
     .help = "Structured outputs: most JSON values in a schema, atoms in a regex or grammar (bounded repetitions "
             "counted in full), or choices; more get 400",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.limits.max_nodes = v.get<int64_t>(); }},
    {.name = "grammar-compile-workers",
     .type = T::Int,
     .default_text = "4",
     .min = 1,
     .max = 64,
     .help = "Grammars compiled at once, each in its own worker process",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.workers = to_i32(v); }},
    {.name = "grammar-compile-timeout",
     .type = T::Float,
     .default_text = "10",
     .min_f = 0.05,
     .max_f = 3600,
     .help = "Seconds one grammar may take to compile; its worker is then killed and the request gets 400",
     .apply =
         [](EngineArgs& a, const json& v) {
           a.config.grammar.budget.time = std::chrono::milliseconds(static_cast<int64_t>(v.get<double>() * 1000));
         }},
    {.name = "grammar-compile-memory",
     .type = T::Size,
     .default_text = "1GiB",
     .min = int64_t{16} << 20,
     .help = "Memory one grammar compile may take (e.g. 1GiB); its worker is then killed and the request gets 400",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.budget.memory_bytes = v.get<size_t>(); }},
    {.name = "grammar-cache-memory",
     .type = T::Size,
     .default_text = "128MiB",
     .help = "Memory of the compiled-grammar cache (at most 64 grammars; one is a few MiB for a large vocabulary); "
             "the least recently used go first",
     .apply = [](EngineArgs& a, const json& v) { a.config.grammar.cache_bytes = v.get<size_t>(); }},
    // The command line's alone: a file the command writes at exit.
    {.name = "trace",
     .help = "Write a Chrome-trace JSON timeline of steps and ops to this file",
     .scope = ArgScope::CommandLine,
     .apply = [](EngineArgs& a, const json& v) { a.trace = v.get<std::string>(); }},
    // The library's alone: serve and generate take --chat-template as a
    // command flag; the rest is vLLM's, accepted so that its code runs.
    {.name = "chat-template",
     .help = "A Jinja chat template file, or an inline template, replacing the model's",
     .scope = ArgScope::Library,
     .apply = [](EngineArgs& a, const json& v) { a.chat_template = v.get<std::string>(); }},
    {.name = "dtype",
     .default_text = "auto",
     .help = "The weights' compute type: auto (as the model file stores them; activations in float32) or bfloat16 "
             "(CPU: F16 weight matrices rounded to BF16 at load, which run the BF16 kernels: about 1.8x faster "
             "prompts on AVX512-BF16, at BF16's precision; the same as --backend-option dtype=bfloat16)",
     .scope = ArgScope::All,
     .apply =
         [](EngineArgs& a, const json& v) {
           const std::string t = v.get<std::string>();
           if (t == "bfloat16") a.config.backend_options["dtype"] = "bfloat16";
           else if (t != "auto")
             throw ArgValueError("auto (weights as the model file stores them) or bfloat16 (F16 weight matrices "
                                 "rounded to BF16)");
         }},
    {.name = "trust-remote-code", .type = T::Bool, .help = "vLLM's; no effect", .scope = ArgScope::Library,
     .apply = ignore},
    {.name = "enforce-eager", .type = T::Bool, .help = "vLLM's; no effect", .scope = ArgScope::Library,
     .apply = ignore},
    {.name = "disable-log-stats", .type = T::Bool, .help = "vLLM's; no effect", .scope = ArgScope::Library,
     .apply = ignore},
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// 16MiB rather than 16777216 where it is exact.
std::string size_text(int64_t bytes) {
  static const std::pair<int, const char*> kUnits[] = {{30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  for (const auto& [shift, unit] : kUnits)
    if (bytes > 0 && bytes % (int64_t{1} << shift) == 0) return fmt::format("{}{}", bytes >> shift, unit);
  return std::to_string(bytes);  // 0 too
}

}  // namespace

std::string EngineArg::key() const {
  std::string k = name;
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

std::string EngineArg::range_text() const {
  switch (type) {
    case ArgType::Int:
      return choices.empty() ? fmt::format("[{}, {}]", min, max) : "{" + join(choices) + "}";
    case ArgType::Float:
      return fmt::format("{}{}, {}]", open_min ? "(" : "[", min_f, max_f);
    case ArgType::Size:
      return min == 1 ? "positive" : "at least " + size_text(min);
    case ArgType::Choice:
      return "{" + join(choices) + "}";
    default:
      return "";
  }
}

const std::vector<EngineArg>& engine_arg_table() { return kEngineArgs; }

const EngineArg* find_engine_arg(std::string_view name) {
  std::string dashed(name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  for (const EngineArg& arg : engine_arg_table()) {
    if (arg.name == dashed) return &arg;
    if (std::find(arg.aliases.begin(), arg.aliases.end(), dashed) != arg.aliases.end()) return &arg;
  }
  return nullptr;
}

const PresetValues* scheduling_preset(std::string_view name) {
  for (const SchedulingPreset& p : scheduling_presets())
    if (name == p.name) return &p.values;
  return nullptr;
}

}  // namespace pagellm::embed
