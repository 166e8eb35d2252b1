// Engine: many requests share one model and one pool of KV blocks; every
// step() runs ONE forward pass over all tokens the scheduler picked, samples,
// detokenizes and applies stop conditions. Synchronous and single-threaded;
// AsyncEngine runs it on its own thread.
//
//   add_request -> Scheduler::schedule -> ModelRunner::execute -> Sampler
//               -> append, on_step_done, fork (n > 1), stop checks -> outputs
//
// engine.cpp holds that loop; engine_builder.h builds the parts it runs on,
// step_sampler.h draws the tokens, draft_planner.h plans speculative drafts
// and output_processor.h does what follows a token (stop checks,
// detokenizing, the outputs).
//
// Under pipeline parallelism over S stages the engine keeps S steps in
// flight, one per virtual engine (vLLM's name): S schedulers, each with its
// share of the requests and of the KV blocks. A virtual engine plans its next
// step as soon as its last one has come back, so while the later stages work
// on one virtual engine's step the first stage starts another's.
#pragma once

#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "core/enum_names.h"
#include "engine/metrics.h"
#include "engine/lora_registry.h"
#include "engine/pooling.h"
#include "engine/score_head.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_events.h"
#include "kv/kv_offload.h"
#include "model/model.h"
#include "model/tensor_source.h"
#include "runner/model_runner.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"
#include "scheduler/scheduler.h"
#include "spec/proposer.h"
#include "spec/spec_config.h"
#include "spec/step_cost.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

// The step loop's parts (src/engine, internal).
struct RequestState;
struct SampleState;
class OutputProcessor;
class StepSampler;
class DraftPlanner;
class PrefixTier;

struct EngineConfig {
  std::string model;               // GGUF file or Hugging Face folder
  std::string load_format = "auto";  // auto | dummy
  std::string dummy_shape = "tinyllama-1.1b";
  DType dummy_type = DType::Q4_0;
  std::string tokenizer;           // override: a GGUF (vocab) file or HF folder
  std::string device = "cpu";      // cpu | opencl[:N] (backend/registry.h)
  BackendOptions backend_options;  // for that backend alone: threads, exact_matmul, ...
  std::vector<std::string> backend_plugins;  // plugin libraries to load first
  int block_size = 16;
  int64_t kv_cache_memory = 0;     // bytes; 0: auto (see engine.cpp)
  // Fraction of the device's memory for weights + activations + KV cache
  // (vLLM's --gpu-memory-utilization). 0: 0.9 on devices with their own
  // memory; on host memory the KV cache takes a quarter of what is free.
  double gpu_memory_utilization = 0;
  // Host pool for swap preemption (scheduler.preemption_mode == Swap), bytes.
  int64_t swap_space_bytes = int64_t{4} << 30;
  DType kv_cache_dtype = DType::F16;
  bool enable_prefix_caching = true;
  // The KV offload tier (engine/prefix_tier.h): full blocks kept in host
  // memory and / or files under a folder, LRU within these bytes, and loaded
  // back for a prompt whose prefix they hold. 0 / empty: that tier is off.
  int64_t kv_offload_host_bytes = 0;
  std::string kv_offload_dir;
  int64_t kv_offload_disk_bytes = int64_t{10} << 30;
  // KV events (kv/kv_events.h) for cache-aware routing: recorded only when
  // on, published after each step into a window of this many blocks.
  bool kv_events = false;
  size_t kv_events_buffer = 65536;
  // KV-cache groups (core/kv_layout.h) where the model has sliding-window
  // layers besides full ones and the backend supports them.
  bool kv_cache_groups = true;
  AllocationPolicy block_allocation = AllocationPolicy::Any;
  SchedulerConfig scheduler;       // max_model_len 0: the model's context length
  SpeculativeConfig speculative;   // --speculative-config (off by default)
  // Structured outputs: the limits on a spec, and the compile workers, budget
  // and cache (structured/grammar.h; --grammar-* flags).
  structured::GrammarCompilerOptions grammar;
  bool profile = false;            // per-op timing breakdown
  // Ranks the model is split over (engine/parallel.h; launched with mpirun):
  // attention heads, FFN units and vocabulary across tensor_parallel_size
  // ranks, or layers across pipeline_parallel_size stages, each step cut
  // into pipeline_micro_batches micro-batches (0: twice the stages).
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int pipeline_micro_batches = 0;
  // Layers of each stage (vLLM's VLLM_PP_LAYER_PARTITION); empty: equal
  // counts, or with pipeline_balance_stages, stages balanced by the bytes of
  // weights each one reads per token (model/shard.h).
  std::vector<int> pipeline_layer_partition;
  bool pipeline_balance_stages = false;
  // Steps in flight at once, each of its own scheduler ("virtual engine")
  // with its share of the requests and KV blocks; 0: one per pipeline stage.
  // On one rank more than one changes only the order of work (tests use it).
  int virtual_engines = 0;
  // Bit-identical outputs across runs, thread counts and batch compositions
  // (Feature::Deterministic); requests without a seed sample with `seed`
  // (0 when deterministic and not given).
  bool deterministic = false;
  std::optional<uint64_t> seed;
  // Sees every row of logits a sample draws from, before sampling: which
  // request, which sample (0..n-1), how many tokens it had output. For
  // determinism checks and debugging; called on the step thread.
  std::function<void(const std::string& request_id, int32_t sample, int32_t num_output_tokens,
                     std::span<const float> logits)>
      logits_observer;
  // Plain samples are drawn by the backend's sample op where it has one
  // (the logits stay on the device); false: rows always go to the host.
  bool device_sampling = true;
  // Pooling (embedding requests): overrides of the model's own pooling and
  // normalisation (engine/pooling.h's model_pooling).
  std::optional<PoolingType> pooling;
  std::optional<bool> pooling_normalize;
  // What a server exposes: generate (completions, chat, ...), embed
  // (/v1/embeddings) or score (/v1/rerank, /v1/score); pooling: embed or
  // score as the model is (vLLM's --runner pooling), which the engine
  // decides at load (task()). The engine itself runs every kind of request.
  ServeTask task = ServeTask::Generate;
  // Score heads (engine/score_head.h): vLLM's --hf-overrides (a JSON object
  // as text; empty: none) and how query / document pairs are formatted.
  std::string hf_overrides;
  std::string score_template = "auto";
  // LoRA adapters (--enable-lora, --lora-modules, --max-loras, ...).
  LoraConfig lora;
};

// --kv-cache-dtype (core/enum_names.h).
inline constexpr EnumName<DType> kKvCacheDtypeNames[] = {
    {"auto", DType::F16}, {"fp16", DType::F16}, {"f16", DType::F16},  {"float16", DType::F16}, {"f32", DType::F32},
    {"fp32", DType::F32}, {"float32", DType::F32}, {"int8", DType::I8}, {"i8", DType::I8}};

enum class FinishReason { None, Stop, Length, Abort };
const char* to_string(FinishReason r);

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  int32_t priority = 0;
  // An embedding request: its prompt is computed (prefill only, no token
  // sampled) and pooled as the engine's pooling() says; params are unused.
  bool embed = false;
  // A score request: pooled the same way (the last token unless --pooling
  // says otherwise, unnormalised), then through the model's score head.
  bool score = false;
  // A LoRA adapter's name (Engine::lora()); empty: the base model.
  std::string lora;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely tokens, descending
  int32_t rank = 0;  // 1: the most likely; 0: not computed (sampled tokens)
};

// What one sample of a request produced since the last output.
struct CompletionDelta {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  FinishReason finish_reason = FinishReason::None;
  std::string stop_string;       // the stop string that matched, if any
  int32_t stop_token = -1;       // the stop token id that ended it, if any
  int32_t num_output_tokens = 0;  // total so far
};

// Whose fault a failed request is, for the API's status: the client's (400,
// naming error_param), the server's state (503: stopping, overloaded), or a
// bug (500).
enum class RequestError : uint8_t { Internal, Invalid, Unavailable };

struct RequestOutput {
  std::string request_id;
  std::string error;  // non-empty: the request failed (finished is true)
  RequestError error_kind = RequestError::Internal;
  std::string error_param;  // with Invalid: the request field at fault
  std::vector<CompletionDelta> completions;
  bool finished = false;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens found in the prefix cache
  // With SamplingParams::prompt_logprobs >= 0, in the first output after the
  // prompt is computed: the logprob of each prompt token after the first
  // (entry i: token i + 1), with prompt_logprobs top tokens. Empty otherwise.
  std::vector<TokenLogprob> prompt_logprobs;
  // An embedding request's pooled vector, in its finished output; a score
  // request's probability per label of the score head.
  std::vector<float> embedding;
  float score = 0;  // a score request's: the score label's probability
  double queue_seconds = 0, ttft_seconds = 0, e2e_seconds = 0;
};

// The KV offload tier's figures (--kv-offload-*; engine/prefix_tier.h).
struct KvTierReport {
  bool enabled = false;
  KvOffloadStats offload;       // per tier: blocks and bytes held, stored, loaded, files rejected
  int64_t hit_tokens = 0;       // prompt tokens brought into the pool from a tier
  int64_t imported_blocks = 0;  // blocks brought in, every KV-cache group's
  double copy_out_seconds = 0, copy_in_seconds = 0;  // pool <-> host copies on the step thread
};

struct EngineStats {
  EngineMetrics metrics;
  KVCacheStats kv;
  int64_t num_unfinished_requests = 0;
  structured::GrammarCompilerStats grammars;
  // LoRA (with --enable-lora): the served adapters, the adapters of running
  // requests and of waiting ones (vLLM's lora_requests_info), --max-loras.
  std::vector<LoraInfo> loras;
  std::vector<std::string> running_loras, waiting_loras;
  int32_t max_loras = 0;
  KvTierReport kv_tier;
  KvEventCounts kv_events;  // --kv-events
};

class Engine {
 public:
  explicit Engine(const EngineConfig& config, const LoadProgress& progress = {});
  ~Engine();

  // Throws InvalidRequest for bad parameters (a structured output that is no
  // valid grammar among them), an empty or too long prompt, a duplicate id.
  // Nothing is queued when it throws. A request with a structured output
  // waits, outside the scheduler, until its grammar is compiled.
  void validate(const EngineRequest& req) const;
  // The checks of validate() that do not look at the request table: safe to
  // call from any thread while another runs step().
  void validate_params(const EngineRequest& req) const;
  void add_request(EngineRequest req);
  // add_request for a request whose validate_params() already passed on the
  // caller's thread (AsyncEngine's submit): only the id is checked here, so
  // the step thread does not convert a request's grammar a second time.
  void add_checked_request(EngineRequest req);
  // Aborts a request: its blocks return to the pool now. Returns the final
  // output (finish reason abort), or nothing for an unknown id.
  std::optional<RequestOutput> abort(const std::string& request_id);

  // One iteration. Returns an output for every request that has news.
  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !requests_.empty() || !in_flight_.empty(); }
  // With nothing unfinished: frees the per-step buffers the largest step grew
  // (its logits rows, the model's activations on this rank); the next step
  // allocates what it needs. The KV cache stays.
  void release_step_buffers();
  size_t num_unfinished() const { return requests_.size(); }

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& model_config() const { return model_->config(); }
  const EngineConfig& config() const { return config_; }
  // How embedding requests are pooled: the model's files, then the config's overrides.
  const PoolingSpec& pooling() const { return pooling_; }
  // The published KV events (--kv-events), null when off; safe from any
  // thread, set once at construction.
  KvEventLog* kv_events() const { return kv_events_.get(); }
  // Why this model's embeddings cannot be served (a pooling it has and the
  // engine does not, e.g. a reranker's), or empty. Embedding requests are
  // refused with it; generation is unaffected.
  const std::string& pooling_error() const { return pooling_error_; }
  // The score head and pair format, or null (score_error() says why).
  const ScoreModel* score_model() const { return score_model_ ? &*score_model_ : nullptr; }
  const std::string& score_error() const { return score_error_; }
  // config().task with pooling resolved to embed or score.
  ServeTask task() const { return task_; }
  int32_t max_model_len() const { return sched_config_.max_model_len; }
  Model& model() { return *model_; }
  // The LoRA adapters, or null without --enable-lora. Step thread only.
  LoraRegistry* lora() { return lora_.get(); }
  const LoraRegistry* lora() const { return lora_.get(); }
  Backend& backend() { return *backend_; }
  const EngineMetrics& metrics() const { return metrics_; }
  EngineStats stats() const;
  // The grammar compiler's own figures, current even while the step loop
  // sleeps (compiles run and end on their own threads). Thread-safe.
  structured::GrammarCompilerStats grammar_stats() const { return grammars_->stats(); }
  std::string describe() const;
  // Time per step phase (schedule / forward with the backend's op breakdown /
  // sampling and output), when EngineConfig::profile is on.
  std::string profile_report() const;
  const KVCacheConfig& kv_config() const { return kv_config_; }
  // The ranks of a tensor / pipeline parallel run (their collectives'
  // time and bytes), or null on one rank.
  const dist::Communicator* communicator() const { return comm_; }
  // Runs of available KV blocks now (length -> count); O(blocks), for reports.
  std::vector<std::pair<int32_t, int32_t>> kv_available_runs() const;
  // Test hook: waits until the KV offload tier has stored every block queued so far.
  void flush_kv_offload();
  // Debug/test hook: checks scheduler and KV invariants (throws Error).
  void check_invariants() const;
  // Steps that may be in flight at once (pipeline stages; 1 otherwise).
  int32_t num_virtual_engines() const { return static_cast<int32_t>(schedulers_.size()); }

 private:
  using Request = RequestState;
  using Sample = SampleState;
  using Clock = std::chrono::steady_clock;
  // A step submitted to the runner and not yet sampled.
  struct InFlight {
    StepPlan plan;
    int32_t ve = 0;
    int64_t submit_ns = 0;  // time in submit() (the first stage's share)
    // Requests of this virtual engine aborted meanwhile: their sequences
    // leave the scheduler once the step is back (kept alive until then).
    std::vector<SeqId> deferred_aborts;
    std::vector<std::unique_ptr<Request>> aborted;
  };

  void load(const LoadProgress& progress);
  void load_score_model();
  Scheduler& scheduler_of(const Request& r);
  InFlight* in_flight_step(int32_t ve);  // its step in flight, or null
  void submit_step(int32_t ve, std::vector<RequestOutput>& outputs);
  void complete_step(InFlight& f, bool ran, std::vector<RequestOutput>& outputs);
  void observe_forward(const StepPlan& plan, double forward_s);
  void fork_samples(Scheduler& scheduler, const std::vector<Request*>& touched);
  void apply_finishes(Scheduler& scheduler, const StepPlan& plan, std::vector<Request*>& touched);
  void enqueue(EngineRequest req);
  void start(Request& r);
  Sequence& new_sequence(Request& r, int32_t index, uint64_t request_num);
  void admit_compiled_grammars(std::vector<RequestOutput>& outputs);
  void admit_loaded_prefixes();
  void sample_entry(const StepPlan& plan, size_t entry, const Scheduler& scheduler, std::vector<Request*>& touched);
  void record_prompt_logprobs(const StepPlan& plan, size_t prompt_entry);
  void pool_entry(const StepPlan& plan, size_t hidden_entry, std::vector<Request*>& touched);
  void release_sample(Sample& s);
  RequestOutput collect(Request& r);
  void update_gauges();
  KVCacheStats kv_stats() const;

  EngineConfig config_;
  SchedulerConfig sched_config_;
  KVCacheConfig kv_config_;
  std::unique_ptr<Backend> backend_;
  dist::Communicator* comm_ = nullptr;  // all ranks, under tensor / pipeline parallelism
  std::unique_ptr<dist::Communicator> tp_group_;  // rank 0's stage, with both kinds
  std::unique_ptr<TensorSource> dummy_source_;  // owns dummy weights (the model borrows them)
  std::unique_ptr<Model> model_;
  std::unique_ptr<LoraRegistry> lora_;  // before the requests, whose leases it outlives
  std::unique_ptr<Tokenizer> tokenizer_;
  // One per virtual engine; scheduler i owns cache blocks block_shift_[i] + 1
  // to block_shift_[i] + its pool's size.
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::vector<int32_t> block_shift_;
  std::deque<InFlight> in_flight_;             // oldest first; at most one per virtual engine
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<structured::GrammarCompiler> grammars_;
  std::unique_ptr<Proposer> proposer_;         // speculative decoding, when configured
  std::unique_ptr<OutputProcessor> outputs_;   // what follows a sampled token
  std::unique_ptr<StepSampler> step_sampler_;  // a step's tokens from its logits
  std::unique_ptr<DraftPlanner> drafts_;       // with a proposer
  std::vector<Request*> waiting_for_grammar_;  // added, not yet in the scheduler
  std::unique_ptr<PrefixTier> prefix_tier_;    // the KV offload tier, when on
  std::shared_ptr<KvEventLog> kv_events_;      // --kv-events
  void publish_kv_events();
  ModelRunner::Output runner_output_;  // reused across steps
  std::vector<SampleDraw> draws_;      // a step's draws when the device samples
  int64_t phase_ns_[4] = {};           // schedule, forward, sample + postprocess, propose

  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::unordered_map<SeqId, std::pair<Request*, int32_t>> seq_owner_;  // seq -> (request, sample index)
  SeqId next_seq_id_ = 1;
  uint64_t next_request_num_ = 1;
  EngineMetrics metrics_;
  PoolingSpec pooling_;
  std::string pooling_error_;
  std::optional<ScoreModel> score_model_;
  std::string score_error_;
  ServeTask task_ = ServeTask::Generate;
};

}  // namespace pagellm
