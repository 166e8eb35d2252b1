#include "engine/engine_builder.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/util.h"
#include "dist/communicator.h"
#include "engine/parallel.h"
#include "kv/kv_sizing.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "spec/draft_model.h"

namespace pagellm {

namespace {

// A vocabulary-only GGUF with a synthetic SentencePiece vocabulary, for dummy
// models run without --tokenizer.
std::string synthetic_vocab_file(int n_vocab) {
  const std::string path = fmt::format("{}/pagellm-vocab-{}-{}.gguf",
                                       std::filesystem::temp_directory_path().string(), ::getpid(), n_vocab);
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  add_synthetic_vocab(w, n_vocab);
  w.write(path);
  return path;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (std::filesystem::is_directory(path)) return Tokenizer::from_hf_dir(path);
  auto f = GGUFFile::open(path);
  return Tokenizer::from_gguf(*f);
}

// Rank 0's communicator over every rank, or null on one rank.
dist::Communicator* connect_ranks(const EngineConfig& c) {
  dist::Communicator* comm = parallel_communicator(c);
  PAGELLM_CHECK(!comm || comm->rank() == 0, "the engine runs on rank 0; other ranks run the worker");
  if (comm) {
    PAGELLM_CHECK(c.scheduler.preemption_mode != PreemptionMode::Swap,
                  "--preemption-mode swap does not run under tensor or pipeline parallelism yet");
  }
  return comm;
}

std::unique_ptr<Backend> make_backend(const EngineConfig& c) {
  for (const std::string& plugin : c.backend_plugins) load_backend_plugin(plugin);
  std::unique_ptr<Backend> backend = create_backend(c.device, c.backend_options);
  backend->set_profiling(c.profile);
  return backend;
}

// The scheduler's config with max_model_len resolved (0: the model's
// context length), which the model then sizes its positions for.
SchedulerConfig resolve_scheduler_config(const EngineConfig& c, Model& model) {
  const ModelConfig& mc = model.config();
  SchedulerConfig s = c.scheduler;
  if (s.max_model_len <= 0) s.max_model_len = mc.n_ctx_train;
  PAGELLM_CHECK(s.max_model_len <= mc.n_ctx_train || mc.n_ctx_train <= 0,
                "--max-model-len {} exceeds the model's context length {}", s.max_model_len, mc.n_ctx_train);
  model.set_context_length(s.max_model_len);
  if (c.lora.enabled) s.max_loras = c.lora.max_loras;
  // Prompt logprobs: a step's rows of their logits take at most 2^26 floats (256 MiB).
  if (s.max_prompt_logit_rows == 0)
    s.max_prompt_logit_rows =
        static_cast<int32_t>(std::max<int64_t>(16, (int64_t{1} << 26) / std::max(1, mc.n_vocab)));
  return s;
}

// One row per sampling sequence, one more per draft it verifies, and the
// prompt-logprob rows a step may add (max_prompt_logit_rows, the cap under
// chunked prefill; without chunking a prompt's rows come whole and are not
// planned for).
int64_t logits_rows_per_step(const EngineConfig& c, const SchedulerConfig& s) {
  const int64_t per_seq = 1 + (c.speculative.enabled() ? c.speculative.num_speculative_tokens : 0);
  return std::min<int64_t>(s.max_num_batched_tokens,
                           int64_t{s.max_num_seqs} * per_seq + std::max(0, s.max_prompt_logit_rows));
}

int32_t num_virtual_engines(const EngineConfig& c) {
  return c.virtual_engines > 0 ? c.virtual_engines : std::max(1, c.pipeline_parallel_size);
}

bool kv_groups_allowed(const EngineConfig& c, const SchedulerConfig& s) {
  return c.kv_cache_groups && s.kv_eviction == KvEviction::None;
}

// What models with linear-attention (Gated DeltaNet) layers cannot use yet:
// their per-sequence states are not paged, so nothing that moves or drops
// KV blocks alone keeps them right. (Speculative decoding rolls a state
// back through its snapshot slot: KVCacheConfig::state_snapshots.)
void check_linear_attention_options(const EngineConfig& c, const SchedulerConfig& s, const Model& model,
                                    const dist::Communicator* comm) {
  if (!model.has_linear_layers()) return;
  const char* a = arch_name(model.config().arch);
  PAGELLM_CHECK(s.preemption_mode != PreemptionMode::Swap, "--preemption-mode swap is not supported for {} (its "
                "linear-attention states are not swapped); use --preemption-mode recompute", a);
  PAGELLM_CHECK(s.kv_eviction != KvEviction::Sliding, "--kv-eviction sliding is not supported for {} (its "
                "linear-attention states cannot drop tokens)", a);
  // (Tensor-parallel ranks keep their heads' states, pipeline stages their layers'.)
  (void)comm;
}

// Every pipeline stage holds each block for its own layers: the budget is
// per rank, so blocks are sized for the stage with the most layer slots.
static int32_t kv_block_slots(const Model& model, const KvGroupPlan& groups) {
  const std::vector<int>& stages = model.geometry().stage_layers;
  int32_t most = 0;
  int32_t begin = 0;
  const ModelConfig& cfg = model.config();
  for (const int n : stages) {
    // Layers that reuse another's K/V (kv_source) take no slot.
    const int32_t cache_begin = cfg.cache_layers_before(begin), cache_end = cfg.cache_layers_before(begin + n);
    int32_t slots = cache_end - cache_begin;
    if (groups.grouped()) (void)stage_kv_slots(groups, cache_begin, cache_end, slots);
    if (model.has_linear_layers()) {  // linear-attention layers take no slot
      slots = 0;
      for (int32_t l = begin; l < begin + n; ++l) slots += cfg.layer_is_linear(l) ? 0 : 1;
      slots = std::max(slots, 1);
    }
    most = std::max(most, slots);
    begin += n;
  }
  return most;
}

KvBudgetInputs kv_budget_inputs(const EngineConfig& c, const SchedulerConfig& s, const Model& model,
                                const KvGroupPlan& groups, const Backend& backend) {
  KvBudgetInputs in;
  in.layout = model.kv_cache_spec(c.block_size, 2, c.kv_cache_dtype, &groups).layout();
  // Layers of their own shapes (slot sizes) run in one stage: that layout is the block.
  if (in.layout.slot_elems.empty()) in.layout.n_layers = kv_block_slots(model, groups);
  in.blocks_per_seq = kv_blocks_per_seq(groups.groups, c.block_size, s.max_model_len, s.max_num_batched_tokens);
  in.max_model_len = s.max_model_len;
  in.max_num_seqs = s.max_num_seqs;
  in.kv_cache_memory = c.kv_cache_memory;
  in.gpu_memory_utilization = c.gpu_memory_utilization;
  in.memory = backend.memory_info();
  in.weight_bytes = static_cast<int64_t>(model.held_weight_bytes());
  in.activation_bytes = static_cast<int64_t>(model.activation_bytes(s.max_num_batched_tokens, logits_rows_per_step(c, s)));
  in.device = backend.name();
  in.virtual_engines = num_virtual_engines(c);
  // Speculative decoding keeps a snapshot of each state (KVCacheConfig::state_snapshots).
  in.state_bytes = static_cast<int64_t>(model.state_bytes_per_seq()) * s.max_num_seqs *
                   (c.speculative.enabled() ? 2 : 1) * in.virtual_engines;
  return in;
}

// Linear-attention state slots of one virtual engine (its snapshots too),
// and of the backend, which holds every virtual engine's (each one's range
// starts at its KVCacheConfig::state_slot_base).
static int32_t engine_state_slots(const KVCacheConfig& k) { return k.num_state_slots * (k.state_snapshots ? 2 : 1); }
static int32_t backend_state_slots(const EngineConfig& c, const KVCacheConfig& k) {
  return engine_state_slots(k) * num_virtual_engines(c);
}

KVCacheConfig allocate_kv_cache(const EngineConfig& c, const KvBudget& kv, const Model& model,
                                const KvGroupPlan& groups, int32_t max_num_seqs, Backend& backend) {
  KVCacheConfig k;
  k.num_blocks = kv.num_blocks;
  k.block_size = c.block_size;
  k.enable_prefix_caching = c.enable_prefix_caching;
  k.allocation_policy = c.block_allocation;
  // One group of another kind than full (MLA latent) is passed too, for the per-kind metrics.
  if (groups.grouped() || groups.groups[0].kind != KvGroupKind::Full) k.groups = groups.groups;
  if (model.has_linear_layers()) {
    // One state slot per running sequence; prefix caching cannot restore a state.
    k.num_state_slots = max_num_seqs;
    k.state_snapshots = c.speculative.enabled();
    if (k.enable_prefix_caching)
      spdlog::info("prefix caching is off: {}'s linear-attention states are not cached by prefix",
                   arch_name(model.config().arch));
    k.enable_prefix_caching = false;
  }
  backend.allocate_kv_cache(
      model.kv_cache_spec(c.block_size, k.num_blocks, c.kv_cache_dtype, &groups, backend_state_slots(c, k)));
  return k;
}

// The backend abilities the config asks for, switched on.
void enable_backend_modes(const EngineConfig& c, const SchedulerConfig& s, Backend& backend) {
  if (s.kv_eviction == KvEviction::Sliding && !backend.supports(Feature::KvEviction))
    fail("--kv-eviction sliding: the {} backend cannot skip evicted keys in attention", backend.name());
  if (c.deterministic) {
    if (!backend.supports(Feature::Deterministic))
      fail("--deterministic: the {} backend has no deterministic mode", backend.name());
    backend.set_deterministic(true);
  }
}

// vLLM's --swap-space: a host pool of that many bytes of blocks. Returns its blocks.
int32_t allocate_swap_space(const EngineConfig& c, int64_t per_block, Backend& backend) {
  if (!backend.supports(Feature::SwapToHost))
    fail("--preemption-mode swap needs a backend with its own memory that can swap KV blocks to the host; "
         "the {} backend recomputes preempted sequences (use --preemption-mode recompute)",
         backend.name());
  const int64_t swap_blocks = c.swap_space_bytes / per_block;
  PAGELLM_CHECK(swap_blocks >= 1, "--swap-space {} holds no KV block of {}", format_bytes(c.swap_space_bytes),
                format_bytes(per_block));
  const int32_t n = static_cast<int32_t>(std::min<int64_t>(swap_blocks, 1 << 30));
  backend.allocate_swap_space(n);
  return n;
}

void send_worker_init(dist::Communicator& comm, const EngineConfig& c, const KVCacheConfig& kv,
                      const SchedulerConfig& s) {
  WorkerInit init;
  init.num_blocks = kv.num_blocks;
  init.state_slots = backend_state_slots(c, kv);
  init.kv_groups = kv.groups.size() > 1 ? 1 : 0;
  init.max_model_len = s.max_model_len;
  init.deterministic = c.deterministic ? 1 : 0;
  comm.broadcast(&init, sizeof(init), 0);
}

// One scheduler per share. When a share cannot hold one max_model_len
// sequence (the scheduler refuses it), one virtual engine takes the whole
// cache (one step in flight).
void make_schedulers(EngineParts& p, const std::vector<KvShare>& shares) {
  p.schedulers.clear();
  p.block_shift.clear();
  try {
    for (const KvShare& s : shares) {
      KVCacheConfig share = p.kv_config;
      share.num_blocks = s.num_blocks;
      share.state_slot_base = static_cast<int32_t>(p.schedulers.size()) * engine_state_slots(share);
      p.schedulers.push_back(std::make_unique<Scheduler>(p.sched_config, share));
      p.block_shift.push_back(s.block_shift);
    }
  } catch (const Error& e) {
    const size_t count = shares.size();
    if (count == 1) throw;
    spdlog::warn("one pipeline step in flight instead of {}: a 1/{} share of the KV cache is too small ({})", count,
                 count, e.what());
    make_schedulers(p, kv_shares(p.kv_config.num_blocks, 1));
  }
}

std::unique_ptr<Proposer> make_proposer(const EngineConfig& c, const EngineParts& p, const LoadProgress& progress) {
  const SpeculativeConfig& spec = c.speculative;
  if (spec.method == SpecMethod::Ngram)
    return std::make_unique<NgramProposer>(spec.prompt_lookup_min, spec.prompt_lookup_max);
  if (spec.method != SpecMethod::DraftModel) return nullptr;
  DraftModelOptions o;
  o.model = spec.model;
  o.device = c.device;
  o.backend_options = c.backend_options;
  o.block_size = c.block_size;
  o.num_blocks = p.kv_config.num_blocks;  // as many tokens as the target's pool
  o.kv_cache_dtype = c.kv_cache_dtype;
  o.enable_prefix_caching = c.enable_prefix_caching;
  o.max_model_len = p.sched_config.max_model_len;
  o.profile = c.profile;
  o.deterministic = c.deterministic;
  return std::make_unique<DraftModelProposer>(o, *p.tokenizer, p.model->config().n_vocab, progress);
}

}  // namespace

std::vector<KvShare> kv_shares(int32_t num_blocks, int32_t count) {
  std::vector<KvShare> shares;
  const int32_t usable = num_blocks - 1;
  int32_t shift = 0;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t blocks = usable / count + (i < usable % count ? 1 : 0);
    shares.push_back({shift, 1 + blocks});
    shift += blocks;
  }
  return shares;
}

KvGroupPlan kv_group_plan(bool allowed, int32_t max_model_len, const Model& model, const Backend& backend) {
  if (model.config().is_mla()) {
    // Every layer keeps one latent vector per token: one group, named for the metrics.
    KvGroupPlan plan = single_kv_group(static_cast<int32_t>(model.kv_layer_windows().size()));
    plan.groups[0].kind = KvGroupKind::MlaLatent;
    return plan;
  }
  if (!allowed || !backend.supports(Feature::KvGroups))
    return single_kv_group(static_cast<int32_t>(model.kv_layer_windows().size()));
  return plan_kv_groups(model.kv_layer_windows(), max_model_len);
}

KvBudget plan_kv_budget(const KvBudgetInputs& in) {
  KvBudget kv;
  const int64_t per_block = kv_bytes_per_block(in.layout);
  const int64_t blocks_per_seq = in.blocks_per_seq > 0 ? in.blocks_per_seq
                                                       : (in.max_model_len + in.layout.block_size - 1) / in.layout.block_size;
  PAGELLM_CHECK(in.gpu_memory_utilization >= 0 && in.gpu_memory_utilization <= 1,
                "--gpu-memory-utilization must be in (0, 1], got {}", in.gpu_memory_utilization);
  int64_t budget = in.kv_cache_memory;
  if (budget > 0 && in.state_bytes > 0) {
    // The states come out of the memory asked for the cache.
    PAGELLM_CHECK(budget - in.state_bytes >= 2 * per_block, "--kv-cache-memory {} leaves no room for KV blocks after "
                  "the linear-attention states of {} sequences ({})", format_bytes(budget), in.max_num_seqs,
                  format_bytes(in.state_bytes));
    budget -= in.state_bytes;
  }
  if (budget <= 0) {
    const MemoryInfo& mem = in.memory;
    const double util = in.gpu_memory_utilization > 0 ? in.gpu_memory_utilization : 0.9;
    if (!mem.host_memory || in.gpu_memory_utilization > 0) {
      // This instance's share of the device (vLLM's rule): the fraction, less
      // its weights and a full step's activations, and never more than is free.
      const int64_t activations = in.activation_bytes;
      budget = static_cast<int64_t>(static_cast<double>(mem.total_bytes) * util) - in.weight_bytes - activations -
               in.state_bytes;
      budget = std::min(budget, static_cast<int64_t>(mem.free_bytes) - activations - in.state_bytes);
      PAGELLM_CHECK(budget >= 2 * per_block,
                    "--gpu-memory-utilization {} of the {} device's {} leaves no room for the KV cache after "
                    "weights of {} and {} of activations ({} free now); raise it or pass --kv-cache-memory",
                    util, in.device, format_bytes(static_cast<int64_t>(mem.total_bytes)),
                    format_bytes(in.weight_bytes), format_bytes(activations),
                    format_bytes(static_cast<int64_t>(mem.free_bytes)));
    } else {
      const int64_t all_seqs = per_block * blocks_per_seq * std::max(1, in.max_num_seqs);
      budget = std::min(static_cast<int64_t>(mem.free_bytes) / 4 - in.state_bytes, all_seqs);
      budget = std::max(budget, per_block * (blocks_per_seq + 1));
    }
  }
  kv.bytes_per_block = per_block;
  kv.budget_bytes = budget;
  kv.num_blocks = kv_num_blocks_for_budget(in.layout, budget);
  kv.shares = kv_shares(kv.num_blocks, in.virtual_engines);
  return kv;
}

LoadedModel load_model_and_tokenizer(const EngineConfig& c, Backend& backend, const LoadProgress& progress,
                                     const ModelShard& shard) {
  LoadedModel lm;
  if (c.load_format == "dummy") {
    if (!c.tokenizer.empty()) lm.tokenizer = load_tokenizer(c.tokenizer);
    const int n_vocab = lm.tokenizer ? lm.tokenizer->vocab_size() : dummy_vocab_size(c.dummy_shape, nullptr);
    if (!lm.tokenizer) {
      const std::string vocab = synthetic_vocab_file(n_vocab);
      lm.tokenizer = load_tokenizer(vocab);
      std::filesystem::remove(vocab);
    }
    const ModelConfig cfg = dummy_config(c.dummy_shape, n_vocab);
    ThreadPool pool(0);  // host work: random weights, on every core
    DummySpec spec{c.dummy_shape, c.dummy_type, 0};
    lm.dummy_source = make_dummy_source(cfg, spec, pool);
    lm.model = Model::from_source(cfg, *lm.dummy_source, backend, progress, shard);
  } else if (c.load_format == "auto") {
    PAGELLM_CHECK(!c.model.empty(), "no model given");
    lm.model = Model::load(c.model, backend, progress, shard);
    if (!c.tokenizer.empty()) lm.tokenizer = load_tokenizer(c.tokenizer);
    else if (lm.model->gguf()) lm.tokenizer = Tokenizer::from_gguf(*lm.model->gguf());
    else lm.tokenizer = Tokenizer::from_hf_dir(c.model);
  } else {
    fail("unknown load format '{}' (auto or dummy)", c.load_format);
  }
  // An encoder with token types reads a pair's second text as type 1 (every
  // rank's model: their embeddings must agree).
  lm.model->set_segment_separator(lm.tokenizer->segment_separator());
  return lm;
}

EngineParts build_engine_parts(const EngineConfig& c, const LoadProgress& progress) {
  EngineParts p;
  p.comm = connect_ranks(c);
  p.backend = make_backend(c);
  {
    LoadedModel lm = load_model_and_tokenizer(c, *p.backend, progress, parallel_shard(c, 0));
    p.dummy_source = std::move(lm.dummy_source);
    p.model = std::move(lm.model);
    p.tokenizer = std::move(lm.tokenizer);
  }
  p.model->set_tp_communicator(tensor_parallel_communicator(c, p.comm, p.tp_group));
  if (c.lora.enabled) {  // before the KV cache is sized: the adapter slots take memory too
    c.lora.validate();
    p.model->enable_lora(c.lora.max_loras, c.lora.max_lora_rank, c.lora.dtype);
  }
  const ModelConfig& mc = p.model->config();
  PAGELLM_CHECK(p.tokenizer->vocab_size() <= mc.n_vocab, "the tokenizer has {} tokens but the model only {}",
                p.tokenizer->vocab_size(), mc.n_vocab);
  p.sched_config = resolve_scheduler_config(c, *p.model);
  check_linear_attention_options(c, p.sched_config, *p.model, p.comm);

  const KvGroupPlan groups = kv_group_plan(kv_groups_allowed(c, p.sched_config), p.sched_config.max_model_len,
                                           *p.model, *p.backend);
  const KvBudget kv = plan_kv_budget(kv_budget_inputs(c, p.sched_config, *p.model, groups, *p.backend));
  p.kv_config = allocate_kv_cache(c, kv, *p.model, groups, p.sched_config.max_num_seqs, *p.backend);
  enable_backend_modes(c, p.sched_config, *p.backend);
  if (p.sched_config.preemption_mode == PreemptionMode::Swap)
    p.sched_config.num_swap_blocks = allocate_swap_space(c, kv.bytes_per_block, *p.backend);
  if (p.comm) send_worker_init(*p.comm, c, p.kv_config, p.sched_config);

  PAGELLM_CHECK(c.virtual_engines >= 0 && c.virtual_engines <= 64, "virtual_engines must be in [0, 64], got {}",
                c.virtual_engines);
  // (The last stage keeps one logits buffer per stage in flight: the runner's bound.)
  PAGELLM_CHECK(!p.comm || c.virtual_engines == 0, "virtual_engines is one per pipeline stage under "
                "parallelism (it must be 0)");
  make_schedulers(p, kv.shares);
  p.runner = std::make_unique<ModelRunner>(*p.model, p.comm, c.pipeline_micro_batches);
  p.grammars = std::make_unique<structured::GrammarCompiler>(*p.tokenizer, mc.n_vocab, p.tokenizer->eog_ids(), c.grammar);
  p.proposer = make_proposer(c, p, progress);
  return p;
}

}  // namespace pagellm
