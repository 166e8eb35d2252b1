// The step loop: plan -> forward -> sample -> process outputs, with requests
// added, aborted and admitted once their grammar is compiled. The parts are
// built by engine_builder.h; tokens are drawn by step_sampler.h, drafts
// planned by draft_planner.h, and what follows a token (stop checks,
// detokenizing, outputs) is output_processor.h's. Reports: engine_stats.cpp.
#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "dist/communicator.h"
#include "engine/draft_planner.h"
#include "engine/engine_builder.h"
#include "engine/output_processor.h"
#include "engine/prefix_tier.h"
#include "engine/prompt_logprobs.h"
#include "engine/request_state.h"
#include "engine/step_sampler.h"
#include "format/gguf.h"
#include "runner/model_runner.h"
#include "sampling/sampler_rng.h"

namespace pagellm {

namespace {

// Whether the model states its pooling (sentence-transformers' modules.json
// beside an HF folder's config, or the GGUF's <arch>.pooling_type).
bool pooling_stated(const std::string& model_path, const GGUFFile* gguf) {
  if (gguf) return gguf->find(gguf->get_string("general.architecture") + ".pooling_type") != nullptr;
  return std::filesystem::exists(std::filesystem::path(model_path) / "modules.json");
}

}  // namespace

Engine::Engine(const EngineConfig& config, const LoadProgress& progress) : config_(config) { load(progress); }

Engine::~Engine() {
  if (runner_) runner_->stop_workers();
}

void Engine::release_step_buffers() {
  if (has_unfinished()) return;
  runner_->release_buffers();
  runner_output_ = ModelRunner::Output{};
}

void Engine::load(const LoadProgress& progress) {
  EngineParts p = build_engine_parts(config_, progress);
  comm_ = p.comm;
  backend_ = std::move(p.backend);
  tp_group_ = std::move(p.tp_group);
  dummy_source_ = std::move(p.dummy_source);
  model_ = std::move(p.model);
  tokenizer_ = std::move(p.tokenizer);
  sched_config_ = p.sched_config;
  kv_config_ = p.kv_config;
  schedulers_ = std::move(p.schedulers);
  block_shift_ = std::move(p.block_shift);
  runner_ = std::move(p.runner);
  grammars_ = std::move(p.grammars);
  proposer_ = std::move(p.proposer);
  outputs_ = std::make_unique<OutputProcessor>(*tokenizer_, metrics_);
  step_sampler_ =
      std::make_unique<StepSampler>(config_, *tokenizer_, model_->config().n_vocab, *grammars_, *outputs_, metrics_);
  if (proposer_) {
    drafts_ = std::make_unique<DraftPlanner>(config_.speculative, sched_config_, *proposer_, seq_owner_);
    metrics_.spec_decode_accepted_per_pos.assign(static_cast<size_t>(config_.speculative.num_speculative_tokens), 0);
  }
  try {
    pooling_ = model_pooling(config_.model, model_->gguf());
    if (!pooling_.dense.empty())
      PAGELLM_CHECK(pooling_.dense.front().in == model_->config().n_embd,
                    "the model's first dense projection takes {} values, its hidden size is {}",
                    pooling_.dense.front().in, model_->config().n_embd);
    // An encoder that does not say pools its first ([CLS]) row, as vLLM pools
    // BertModel; the last row is a decoder's default.
    if (model_->config().non_causal && !pooling_stated(config_.model, model_->gguf())) pooling_.type = PoolingType::Cls;
  } catch (const Error& e) {
    pooling_error_ = e.what();
  }
  if (config_.pooling) pooling_.type = *config_.pooling;
  if (config_.pooling_normalize) pooling_.normalize = *config_.pooling_normalize;
  load_score_model();
  if (config_.lora.enabled) lora_ = std::make_unique<LoraRegistry>(*model_, config_.lora);
  prefix_tier_ = PrefixTier::create(config_, *model_, kv_config_, sched_config_, *runner_, comm_ != nullptr, lora_.get());
  for (const auto& s : schedulers_) s->set_record_commits(prefix_tier_ != nullptr);
  if (config_.kv_events) {
    if (!kv_config_.enable_prefix_caching)
      spdlog::warn("--kv-events: prefix caching is off, so no block is ever stored (only AllBlocksCleared)");
    kv_events_ = std::make_shared<KvEventLog>(std::max<size_t>(1, config_.kv_events_buffer));
    for (const auto& s : schedulers_) s->set_record_kv_events(true);
    publish_kv_events();
  }
  task_ = config_.task;
  if (task_ == ServeTask::Pooling) task_ = score_model_ ? ServeTask::Score : ServeTask::Embed;
  update_gauges();
}

// The score head, built on the host from the model's own tensors (those of
// the dummy source for dummy weights). A bad --hf-overrides, or a head the
// model has and the engine cannot build, is remembered like a pooling it
// cannot serve: score requests get the reason.
void Engine::load_score_model() {
  nlohmann::json overrides = nlohmann::json::object();
  try {
    if (!config_.hf_overrides.empty()) {
      try {
        overrides = nlohmann::json::parse(config_.hf_overrides);
      } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("--hf-overrides is not valid JSON: {}", e.what()));
      }
    }
    const TensorSource* tensors = dummy_source_ ? dummy_source_.get() : model_->tensors();
    PAGELLM_CHECK(tensors, "the model's tensors are not at hand for a score head");
    score_model_ = find_score_model(config_.model, model_->gguf(), *tensors, *tokenizer_, overrides,
                                    config_.score_template, score_error_);
    if (score_model_)
      PAGELLM_CHECK(score_model_->head.input_size() == model_->config().n_embd,
                    "the score head takes {} values; the model's hidden size is {}",
                    score_model_->head.input_size(), model_->config().n_embd);
  } catch (const Error& e) {
    score_model_.reset();
    score_error_ = e.what();
  }
}

Scheduler& Engine::scheduler_of(const Request& r) { return *schedulers_[static_cast<size_t>(r.ve)]; }

Engine::InFlight* Engine::in_flight_step(int32_t ve) {
  for (InFlight& f : in_flight_)
    if (f.ve == ve) return &f;
  return nullptr;
}

void Engine::validate(const EngineRequest& req) const {
  if (requests_.count(req.id)) throw InvalidRequest(fmt::format("duplicate request id '{}'", req.id));
  validate_params(req);
}

void Engine::validate_params(const EngineRequest& req) const {
  if (req.id.empty()) throw InvalidRequest("request id must not be empty");
  const int32_t vocab = model_->config().n_vocab;
  const bool pooled = req.embed || req.score;
  if (req.embed && !pooling_error_.empty()) throw InvalidRequest(pooling_error_, "model");
  if (req.score && !score_model_) throw InvalidRequest(score_error_, "model");
  if (pooled && req.params.n != 1) throw InvalidRequest("an embedding or score request has one sample", "n");
  const bool encoder = model_->config().non_causal;
  if (encoder && !pooled)
    throw InvalidRequest("this model is an encoder (bidirectional attention): it computes embeddings or scores, not "
                         "text; serve it with --task embed and use /v1/embeddings", "model");
  req.params.validate(vocab);
  structured::validate(req.params.structured, config_.grammar.limits, req.params.structured.field.c_str());
  if (req.prompt_ids.empty()) throw InvalidRequest("the prompt is empty", "prompt");
  for (int32_t t : req.prompt_ids)
    if (t < 0 || t >= vocab) throw InvalidRequest(fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab - 1), "prompt");
  const int64_t prompt = static_cast<int64_t>(req.prompt_ids.size());
  if (prompt >= sched_config_.max_model_len)
    throw InvalidRequest(fmt::format("the prompt has {} tokens; this model's maximum context length is {} tokens",
                                     prompt, sched_config_.max_model_len), "prompt");
  // An encoder's prompt is one step, whole (its tokens attend to each other).
  if (encoder && prompt > sched_config_.max_num_batched_tokens)
    throw InvalidRequest(fmt::format("the input has {} tokens; this encoder computes an input in one step of at most "
                                     "{} tokens (--max-num-batched-tokens)", prompt,
                                     sched_config_.max_num_batched_tokens), "input");
  // (With sliding KV eviction a sequence outgrows max_model_len by design.)
  if (!pooled && sched_config_.kv_eviction == KvEviction::None && prompt + req.params.max_tokens > sched_config_.max_model_len)
    throw InvalidRequest(fmt::format("this model's maximum context length is {} tokens; the prompt has {} tokens and "
                                     "max_tokens is {} ({} in total); reduce the prompt or max_tokens",
                                     sched_config_.max_model_len, prompt, req.params.max_tokens,
                                     prompt + req.params.max_tokens), "max_tokens");
}

void Engine::add_request(EngineRequest req) {
  validate(req);
  enqueue(std::move(req));
}

void Engine::add_checked_request(EngineRequest req) {
  if (requests_.count(req.id)) throw InvalidRequest(fmt::format("duplicate request id '{}'", req.id));
  enqueue(std::move(req));
}

void Engine::enqueue(EngineRequest req) {
  std::unique_ptr<LoraLease> lora;
  if (!req.lora.empty()) {
    if (!lora_) throw InvalidRequest("LoRA adapters are not enabled on this server (--enable-lora)", "model");
    lora = lora_->acquire(req.lora);
  }
  auto r = std::make_unique<Request>();
  r->id = req.id;
  r->lora = std::move(lora);
  r->params = req.params;
  // A seed for the engine (always, when deterministic): no entropy, so the
  // same request samples the same tokens.
  if (!r->params.seed && (config_.seed || config_.deterministic)) r->params.seed = config_.seed.value_or(0);
  r->priority = req.priority;
  r->embed = req.embed || req.score;
  r->score = req.score;
  r->prompt = std::move(req.prompt_ids);
  r->arrival = Clock::now();
  r->samples.resize(static_cast<size_t>(r->params.n));
  for (int32_t i = 0; i < r->params.n; ++i) {
    Sample& s = r->samples[i];
    s.rng = SamplerRng::for_request(r->params, static_cast<uint64_t>(i));
    // A stream of its own, apart from the n samples' streams.
    if (proposer_) s.draft_rng = SamplerRng::for_request(r->params, (uint64_t{1} << 32) + static_cast<uint64_t>(i));
  }
  outputs_->add(*r);
  Request& req_ref = *r;
  requests_[r->id] = std::move(r);
  if (req_ref.params.structured.active()) {
    req_ref.grammar = grammars_->compile(req_ref.params.structured);
    waiting_for_grammar_.push_back(&req_ref);
    update_gauges();
    return;  // step() starts it once the grammar is ready
  }
  start(req_ref);
}

void Engine::start(Request& r) {
  // Only the first sample runs the prompt; the others fork from it once the
  // prompt is computed and share its KV blocks.
  Sequence& first = new_sequence(r, 0, next_request_num_++);
  if (r.params.prompt_logprobs >= 0) {
    // The first prompt token has no logprob: a one-token prompt is done now.
    r.prompt_logprobs.resize(r.prompt.size() - 1);
    r.prompt_logprobs_done = r.prompt.size() < 2;
    first.needs_prompt_logits = !r.prompt_logprobs_done;
  }
  if (r.embed) {
    // A score reads the row its head wants (a decoder reranker's last
    // token); --pooling overrides it.
    const PoolingType type = r.score ? config_.pooling.value_or(score_model_->pooling) : pooling_.type;
    r.pooler = Pooler(type, model_->config().n_embd);
    first.pool_rows = pool_rows(type);
  }
  first.whole_prompt = model_->config().non_causal;
  // The virtual engine with the fewest sequences.
  auto queued = [](const std::unique_ptr<Scheduler>& s) { return s->num_running() + s->num_waiting(); };
  r.ve = static_cast<int32_t>(std::min_element(schedulers_.begin(), schedulers_.end(),
                                               [&](const auto& a, const auto& b) { return queued(a) < queued(b); }) -
                              schedulers_.begin());
  // Blocks of its prefix in the KV offload tier load first (admit_loaded_prefixes adds it).
  if (prefix_tier_ && prefix_tier_->begin_load(first, scheduler_of(r), r.ve)) return;
  scheduler_of(r).add(&first);
  r.samples[0].in_scheduler = true;
}

void Engine::admit_loaded_prefixes() {
  if (!prefix_tier_ || !prefix_tier_->loading()) return;
  // With nothing else to run, wait a little for a load instead of spinning.
  const bool idle = in_flight_.empty() && std::none_of(schedulers_.begin(), schedulers_.end(),
                                                       [](const auto& s) { return s->has_unfinished(); });
  if (idle) prefix_tier_->wait_for_load(5);
  for (Sequence* seq : prefix_tier_->take_ready(schedulers_, block_shift_)) {
    const auto [r, index] = seq_owner_.at(seq->id);
    scheduler_of(*r).add(seq);
    r->samples[static_cast<size_t>(index)].in_scheduler = true;
  }
}

void Engine::flush_kv_offload() {
  if (prefix_tier_) prefix_tier_->flush();
}

// Sample `index` of r gets its sequence: the prompt, no output yet.
Sequence& Engine::new_sequence(Request& r, int32_t index, uint64_t request_num) {
  Sample& s = r.samples[static_cast<size_t>(index)];
  s.seq = std::make_unique<Sequence>();
  s.seq->id = next_seq_id_++;
  s.seq->request_id = request_num;
  s.seq->priority = r.priority;
  s.seq->lora_id = r.lora ? r.lora->id() : 0;
  s.seq->token_ids = r.prompt;
  s.seq->num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  seq_owner_[s.seq->id] = {&r, index};
  return *s.seq;
}

void Engine::admit_compiled_grammars(std::vector<RequestOutput>& outputs) {
  if (waiting_for_grammar_.empty()) return;
  // With nothing else to run, wait a little for a compile instead of spinning.
  const bool idle = waiting_for_grammar_.size() == requests_.size();
  if (idle) waiting_for_grammar_.front()->grammar->wait_for(std::chrono::milliseconds(5));
  std::vector<Request*> still_waiting;
  for (Request* r : waiting_for_grammar_) {
    if (!r->grammar->ready()) {
      still_waiting.push_back(r);
      continue;
    }
    const structured::CompileResult g = r->grammar->get();
    r->grammar.reset();
    if (!g.grammar) {
      using E = structured::CompileResult::Error;
      RequestOutput out;
      out.request_id = r->id;
      out.finished = true;
      out.error = "structured output: " + g.error;
      out.error_kind = g.error_kind == E::Invalid || g.error_kind == E::OverBudget ? RequestError::Invalid
                       : g.error_kind == E::Unavailable                            ? RequestError::Unavailable
                                                                                   : RequestError::Internal;
      out.error_param = r->params.structured.field;
      requests_.erase(r->id);
      outputs.push_back(std::move(out));
      continue;
    }
    for (Sample& s : r->samples) s.matcher = std::make_unique<structured::GrammarMatcher>(g.grammar);
    start(*r);
  }
  waiting_for_grammar_.swap(still_waiting);
}

void Engine::release_sample(Sample& s) {
  if (proposer_ && s.seq) proposer_->release(s.seq->id);
}

// One step: every virtual engine without a step in flight plans and submits
// its next one, then the oldest step in flight is sampled. With one virtual
// engine that is plan, forward, sample, as it reads.
std::vector<RequestOutput> Engine::step() {
  trace::Scope step_scope("engine.step", "engine");
  std::vector<RequestOutput> outputs;
  admit_compiled_grammars(outputs);
  admit_loaded_prefixes();
  for (size_t ve = 0; ve < schedulers_.size(); ++ve)
    if (!in_flight_step(static_cast<int32_t>(ve))) submit_step(static_cast<int32_t>(ve), outputs);
  if (!in_flight_.empty()) {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    complete_step(f, true, outputs);
  }
  if (kv_events_) publish_kv_events();
  update_gauges();
  return outputs;
}

void Engine::publish_kv_events() {
  // The pool's medium in vLLM's words: device memory or the host's.
  const char* medium = config_.device.rfind("cpu", 0) == 0 ? "CPU" : "GPU";
  std::vector<KvEvent> events;
  for (const auto& s : schedulers_) {
    for (KvEvent& e : s->take_kv_events()) {
      e.medium = medium;
      events.push_back(std::move(e));
    }
  }
  kv_events_->publish(std::move(events));
}

void Engine::submit_step(int32_t ve, std::vector<RequestOutput>& outputs) {
  Scheduler& scheduler = *schedulers_[static_cast<size_t>(ve)];
  const int64_t t_propose = ThreadPool::now_ns();
  if (drafts_) drafts_->propose(scheduler);
  const int64_t t_start = ThreadPool::now_ns();
  if (prefix_tier_) prefix_tier_->prefetch_waiting(scheduler, ve);
  InFlight f;
  f.ve = ve;
  f.plan = [&] {
    trace::Scope s("schedule", "engine");
    return scheduler.schedule();
  }();
  if (prefix_tier_) prefix_tier_->after_schedule(scheduler, ve);
  StepPlan& plan = f.plan;
  // The plan holds the drafts it runs.
  if (drafts_) drafts_->clear_drafts();
  const int64_t t_scheduled = ThreadPool::now_ns();
  const auto now = Clock::now();
  for (const auto& e : plan.seqs) {
    Request& r = *seq_owner_.at(e.seq_id).first;
    if (!r.first_scheduled) {
      r.first_scheduled = now;
      metrics_.request_queue_time.observe(std::chrono::duration<double>(now - r.arrival).count());
      r.num_cached_tokens = std::max(0, e.seq->num_cached_tokens);
    }
  }
  metrics_.scheduler_seconds.observe(static_cast<double>(t_scheduled - t_start) * 1e-9);
  phase_ns_[0] += t_scheduled - t_start;
  phase_ns_[3] += t_start - t_propose;
  if (plan.empty() && !plan.has_block_moves()) {
    complete_step(f, false, outputs);  // length caps, if any
    return;
  }
  if (!plan.empty()) {
    metrics_.num_steps++;
    metrics_.iteration_tokens.observe(plan.num_batched_tokens);
    metrics_.batch_fill_ratio.observe(static_cast<double>(plan.num_batched_tokens) /
                                      static_cast<double>(sched_config_.max_num_batched_tokens));
  }
  {
    trace::Scope s(plan.empty() ? "block moves" : "forward", "engine");
    // (Prompt logprobs read rows of logits besides the sampling ones.)
    const bool prompt_rows = std::any_of(plan.seqs.begin(), plan.seqs.end(),
                                         [](const ScheduledSeq& e) { return e.num_prompt_logits > 0; });
    const bool on_device = config_.device_sampling && !prompt_rows && runner_->samples_on_device() &&
                           step_sampler_->device_draws(plan, seq_owner_, draws_);
    if (lora_) lora_->assign_slots(plan);
    runner_->submit(plan, block_shift_[static_cast<size_t>(ve)], on_device ? &draws_ : nullptr);
  }
  f.submit_ns = ThreadPool::now_ns() - t_scheduled;
  in_flight_.push_back(std::move(f));
}

// ran: the plan went through the runner (false: nothing to compute).
void Engine::complete_step(InFlight& f, bool ran, std::vector<RequestOutput>& outputs) {
  const StepPlan& plan = f.plan;
  Scheduler& scheduler = *schedulers_[static_cast<size_t>(f.ve)];
  const int64_t t_wait = ThreadPool::now_ns();
  if (ran) {
    trace::Scope s("forward wait", "engine");
    runner_->finish(runner_output_);
  }
  const int64_t t_forward = ThreadPool::now_ns();
  // Aborted while in flight: they leave now, before anything is sampled.
  for (SeqId id : f.deferred_aborts) scheduler.abort(id);
  std::vector<Request*> touched;
  if (!plan.empty()) {
    observe_forward(plan, static_cast<double>(f.submit_ns + t_forward - t_wait) * 1e-9);
    trace::Scope s("sample", "engine");
    for (size_t i = 0; i < runner_output_.prompt_entries.size(); ++i) record_prompt_logprobs(plan, i);
    for (size_t i = 0; i < runner_output_.hidden_entries.size(); ++i) pool_entry(plan, i, touched);
    for (size_t i = 0; i < runner_output_.entries.size(); ++i) sample_entry(plan, i, scheduler, touched);
  }
  scheduler.on_step_done(plan);
  // Write-through: the blocks this step filled go to the KV offload tier.
  if (prefix_tier_) prefix_tier_->store_committed(scheduler, block_shift_[static_cast<size_t>(f.ve)], seq_owner_);
  f.aborted.clear();
  fork_samples(scheduler, touched);
  apply_finishes(scheduler, plan, touched);

  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (Request* r : touched)
    if (r->has_news) outputs.push_back(collect(*r));
  phase_ns_[1] += f.submit_ns + t_forward - t_wait;
  phase_ns_[2] += ThreadPool::now_ns() - t_forward;
}

// A step's forward time, shared between its decode tokens (one behind, with
// their drafts) and its prefill tokens in proportion.
void Engine::observe_forward(const StepPlan& plan, double forward_s) {
  int64_t decode_tokens = 0;
  for (const ScheduledSeq& e : plan.seqs)
    if (e.num_new_tokens - e.num_draft_tokens() == 1) decode_tokens += e.num_new_tokens;
  const int64_t prefill_tokens = plan.num_batched_tokens - decode_tokens;
  metrics_.step_tokens_decode += decode_tokens;
  metrics_.step_tokens_prefill += prefill_tokens;
  metrics_.forward_seconds_decode += forward_s * static_cast<double>(decode_tokens) / plan.num_batched_tokens;
  metrics_.forward_seconds_prefill += forward_s * static_cast<double>(prefill_tokens) / plan.num_batched_tokens;
  if (drafts_) drafts_->observe_step(plan, forward_s);
}

// Children of n > 1 requests join now, sharing the prompt's blocks.
void Engine::fork_samples(Scheduler& scheduler, const std::vector<Request*>& touched) {
  for (Request* r : touched) {
    if (r->forked || r->params.n <= 1 || !r->samples[1].seq) continue;
    r->forked = true;
    for (int32_t k = 1; k < r->params.n; ++k) {
      scheduler.fork(r->samples[0].seq->id, r->samples[k].seq.get());
      r->samples[k].in_scheduler = true;
    }
  }
}

// Stop decisions take effect: blocks go back to the pool. Sequences the
// scheduler capped at max_model_len end too (their requests join `touched`).
void Engine::apply_finishes(Scheduler& scheduler, const StepPlan& plan, std::vector<Request*>& touched) {
  for (Request* r : touched)
    for (Sample& s : r->samples)
      if (s.pending_finish != FinishReason::None && !s.finished) {
        scheduler.finish(s.seq->id, s.pending_finish == FinishReason::Stop ? SeqStatus::FinishedStopped
                                                                           : SeqStatus::FinishedLength);
        release_sample(s);
        outputs_->finish(*r, s, s.pending_finish);
      }
  for (SeqId id : plan.length_capped) {
    auto it = seq_owner_.find(id);
    if (it == seq_owner_.end()) continue;
    Request& r = *it->second.first;
    release_sample(r.samples[it->second.second]);
    outputs_->finish(r, r.samples[it->second.second], FinishReason::Length);
    touched.push_back(&r);
  }
}

void Engine::sample_entry(const StepPlan& plan, size_t entry, const Scheduler& scheduler,
                          std::vector<Request*>& touched) {
  const ScheduledSeq& e = plan.seqs[runner_output_.entries[entry]];
  const auto owner = seq_owner_.find(e.seq_id);
  if (owner == seq_owner_.end()) return;  // aborted while the step was in flight
  const auto [r, index] = owner->second;
  touched.push_back(r);
  if (!runner_output_.tokens.empty()) {  // drawn on the device: plain samples only
    step_sampler_->accept_device_token(*r, r->samples[index], runner_output_.tokens[entry], scheduler);
    return;
  }
  if (!r->forked && r->params.n > 1 && e.seq->num_output_tokens() == 0) {
    // Parallel sampling: n first tokens from the prompt's logits.
    const float* row = runner_output_.row(entry, 0, model_->config().n_vocab);
    for (int32_t k = 1; k < r->params.n; ++k) {
      new_sequence(*r, k, e.seq->request_id);
      // (a child's matcher, made with the request, is at the start like the first sample's)
      step_sampler_->sample_one(*r, r->samples[k], row, scheduler);
    }
  }
  step_sampler_->sample_entry(*r, r->samples[index], e, runner_output_, entry, scheduler);
}

// A chunk of the prompt came back with a row of logits per position: each
// scores the prompt token after it.
void Engine::record_prompt_logprobs(const StepPlan& plan, size_t prompt_entry) {
  const ScheduledSeq& e = plan.seqs[runner_output_.prompt_entries[prompt_entry]];
  const auto owner = seq_owner_.find(e.seq_id);
  if (owner == seq_owner_.end()) return;  // aborted while the step was in flight
  Request& r = *owner->second.first;
  const int32_t vocab = model_->config().n_vocab;
  for (int32_t j = 0; j < e.num_prompt_logits; ++j) {
    const size_t pos = static_cast<size_t>(e.start_pos + j);
    const float* row = runner_output_.prompt_row(prompt_entry, j, vocab);
    r.prompt_logprobs.at(pos) = token_logprob(row, vocab, r.prompt[pos + 1], r.params.prompt_logprobs);
  }
  if (e.start_pos + e.num_prompt_logits == static_cast<int32_t>(r.prompt.size()) - 1) {
    r.prompt_logprobs_done = true;
    e.seq->needs_prompt_logits = false;  // a recompute after preemption may use the prefix cache
  }
}

// A chunk of an embedding request's prompt came back with its hidden rows;
// the last chunk ends the request (no token is sampled).
void Engine::pool_entry(const StepPlan& plan, size_t hidden_entry, std::vector<Request*>& touched) {
  const ScheduledSeq& e = plan.seqs[runner_output_.hidden_entries[hidden_entry]];
  const auto owner = seq_owner_.find(e.seq_id);
  if (owner == seq_owner_.end()) return;  // aborted while the step was in flight
  Request& r = *owner->second.first;
  const int64_t d = model_->config().n_embd;
  const float* rows = runner_output_.hidden.data() + runner_output_.hidden_first_row[hidden_entry] * d;
  r.pooler.add(rows, e.start_pos + e.hidden_begin, e.num_hidden);
  if (e.end_pos() < e.seq->num_prompt_tokens) return;
  r.embedding = r.pooler.result(e.seq->num_prompt_tokens, false);
  if (r.score) r.embedding = score_model_->head.probabilities(r.embedding);
  else r.embedding = finish_embedding(pooling_, std::move(r.embedding));
  r.samples[0].pending_finish = FinishReason::Stop;
  touched.push_back(&r);
}

RequestOutput Engine::collect(Request& r) {
  RequestOutput out = outputs_->collect(r);
  if (out.finished && r.score && !r.embedding.empty())
    out.score = r.embedding.at(static_cast<size_t>(score_model_->head.score_label));
  if (out.finished) out.embedding = std::move(r.embedding);
  if (out.finished) {
    for (Sample& s : r.samples) {
      if (!s.seq) continue;
      seq_owner_.erase(s.seq->id);
      // A load kept for a sequence that ran anyway must not outlive it.
      if (prefix_tier_) prefix_tier_->forget(s.seq->id, schedulers_);
    }
    requests_.erase(r.id);  // destroys r
  }
  return out;
}

std::optional<RequestOutput> Engine::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  Request& r = *it->second;
  std::erase(waiting_for_grammar_, &r);
  if (prefix_tier_)
    for (Sample& s : r.samples)
      if (s.seq) prefix_tier_->forget(s.seq->id, schedulers_);
  // Its virtual engine has a step in flight: the sequences stay in the
  // scheduler (and alive) until that step is back.
  InFlight* in_flight = in_flight_step(r.ve);
  std::unique_ptr<Request> keep;
  if (in_flight) keep = std::move(it->second);
  for (Sample& s : r.samples) {
    if (s.finished) continue;
    if (s.in_scheduler) {
      if (in_flight) in_flight->deferred_aborts.push_back(s.seq->id);
      else scheduler_of(r).abort(s.seq->id);
    }
    release_sample(s);
  }
  outputs_->abort(r);
  RequestOutput out = collect(r);  // erases its entry (empty when kept)
  if (keep) in_flight->aborted.push_back(std::move(keep));
  update_gauges();
  return out;
}

}  // namespace pagellm
