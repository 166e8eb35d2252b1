#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <span>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "core/util.h"
#include "dist/communicator.h"
#include "engine/engine_builder.h"
#include "engine/stop_checker.h"
#include "runner/model_runner.h"
#include "sampling/sampler.h"
#include "sampling/sampler_rng.h"
#include "spec/adaptive.h"

namespace pagellm {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    default: return "";
  }
}

struct Engine::Sample {
  std::unique_ptr<Sequence> seq;
  SamplerRng rng;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopChecker> stop;
  std::unique_ptr<structured::GrammarMatcher> matcher;  // structured outputs only
  bool grammar_dead_end = false;  // its grammar allowed no next token: it stops, the request fails
  // Speculative decoding: when to propose, the draft model's random stream,
  // and q of this step's drafts (empty: point-mass proposals).
  AdaptiveSpeculation spec;
  SamplerRng draft_rng;
  std::vector<float> draft_probs;
  bool in_scheduler = false;
  bool finished = false;
  FinishReason pending_finish = FinishReason::None;  // decided this step, applied after on_step_done
  CompletionDelta delta;  // news since the last output
  bool has_news = false;
  Clock::time_point last_token_time;
};

struct Engine::Request {
  std::string id;
  SamplingParams params;
  int32_t priority = 0;
  std::vector<int32_t> prompt;
  std::vector<Sample> samples;
  std::shared_ptr<structured::PendingGrammar> grammar;  // with a structured output, until it starts
  std::string grammar_error;  // a sample's grammar allowed no token: the request ends with this (400)
  bool forked = false;
  int32_t num_cached_tokens = 0;
  int32_t ve = 0;  // its virtual engine (scheduler)
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled, first_token;
  int32_t finished_samples = 0;
  bool has_news = false;
};

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
  sampler_ = std::move(p.sampler);
  grammars_ = std::move(p.grammars);
  proposer_ = std::move(p.proposer);
  bitmask_.assign(static_cast<size_t>(structured::bitmask_words(grammars_->vocab_size())), 0);
  if (proposer_)
    metrics_.spec_decode_accepted_per_pos.assign(static_cast<size_t>(config_.speculative.num_speculative_tokens), 0);
  update_gauges();
}

Scheduler& Engine::scheduler_of(const Request& r) { return *schedulers_[static_cast<size_t>(r.ve)]; }

Engine::InFlight* Engine::in_flight_step(int32_t ve) {
  for (InFlight& f : in_flight_)
    if (f.ve == ve) return &f;
  return nullptr;
}

void Engine::check_invariants() const {
  for (const auto& s : schedulers_) s->check_invariants();
}

std::vector<std::pair<int32_t, int32_t>> Engine::kv_available_runs() const {
  std::map<int32_t, int32_t> runs;
  for (const auto& s : schedulers_)
    for (const auto& [length, n] : s->kv().pool().available_runs()) runs[length] += n;
  return {runs.begin(), runs.end()};
}

std::string Engine::describe() const {
  const int64_t per_block = static_cast<int64_t>(backend_->kv_cache_spec().bytes_per_block());
  return fmt::format("{}; weights {}; KV cache {} blocks x {} tokens ({} {}, {} tokens); max_model_len {}; {}",
                     model_config().describe(), format_bytes(static_cast<int64_t>(model_->weight_bytes())),
                     kv_config_.num_blocks - 1, kv_config_.block_size,
                     format_bytes(per_block * kv_config_.num_blocks), dtype_name(config_.kv_cache_dtype),
                     static_cast<int64_t>(kv_config_.num_blocks - 1) * kv_config_.block_size,
                     sched_config_.max_model_len, backend_->describe()) +
         (proposer_ ? fmt::format("; {}: {}", config_.speculative.describe(), proposer_->describe()) : "") +
         (comm_ ? fmt::format("; tensor parallel {} x pipeline parallel {} over {}", config_.tensor_parallel_size,
                              config_.pipeline_parallel_size, comm_->describe())
                : "") +
         (config_.pipeline_parallel_size > 1
              ? fmt::format(" (layers per stage {})", fmt::join(model_->geometry().stage_layers, ","))
              : "") +
         (schedulers_.size() > 1 ? fmt::format("; {} steps in flight (virtual engines)", schedulers_.size()) : "");
}

void Engine::validate(const EngineRequest& req) const {
  if (requests_.count(req.id)) throw InvalidRequest(fmt::format("duplicate request id '{}'", req.id));
  validate_params(req);
}

void Engine::validate_params(const EngineRequest& req) const {
  if (req.id.empty()) throw InvalidRequest("request id must not be empty");
  const int32_t vocab = model_->config().n_vocab;
  req.params.validate(vocab);
  structured::validate(req.params.structured, config_.grammar.limits, req.params.structured.field.c_str());
  if (req.prompt_ids.empty()) throw InvalidRequest("the prompt is empty", "prompt");
  for (int32_t t : req.prompt_ids)
    if (t < 0 || t >= vocab) throw InvalidRequest(fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab - 1), "prompt");
  const int64_t prompt = static_cast<int64_t>(req.prompt_ids.size());
  if (prompt >= sched_config_.max_model_len)
    throw InvalidRequest(fmt::format("the prompt has {} tokens; this model's maximum context length is {} tokens",
                                     prompt, sched_config_.max_model_len), "prompt");
  // (With sliding KV eviction a sequence outgrows max_model_len by design.)
  if (sched_config_.kv_eviction == KvEviction::None && prompt + req.params.max_tokens > sched_config_.max_model_len)
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
  auto r = std::make_unique<Request>();
  r->id = req.id;
  r->params = req.params;
  // A seed for the engine (always, when deterministic): no entropy, so the
  // same request samples the same tokens.
  if (!r->params.seed && (config_.seed || config_.deterministic)) r->params.seed = config_.seed.value_or(0);
  r->priority = req.priority;
  r->prompt = std::move(req.prompt_ids);
  r->arrival = Clock::now();
  r->samples.resize(static_cast<size_t>(r->params.n));
  for (int32_t i = 0; i < r->params.n; ++i) {
    Sample& s = r->samples[i];
    s.rng = SamplerRng::for_request(r->params, static_cast<uint64_t>(i));
    // A stream of its own, apart from the n samples' streams.
    if (proposer_) s.draft_rng = SamplerRng::for_request(r->params, (uint64_t{1} << 32) + static_cast<uint64_t>(i));
    s.detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, r->params.skip_special_tokens);
    s.stop = std::make_unique<StopChecker>(r->params.stop, r->params.include_stop_str_in_output);
    s.delta.index = i;
  }
  metrics_.prompt_tokens += static_cast<int64_t>(r->prompt.size());
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

void Engine::start(Request& req) {
  Request* r = &req;
  // Only the first sample runs the prompt; the others fork from it once the
  // prompt is computed and share its KV blocks.
  Sample& first = r->samples[0];
  first.seq = std::make_unique<Sequence>();
  first.seq->id = next_seq_id_++;
  first.seq->request_id = next_request_num_++;
  first.seq->priority = r->priority;
  first.seq->token_ids = r->prompt;
  first.seq->num_prompt_tokens = static_cast<int32_t>(r->prompt.size());
  // The virtual engine with the fewest sequences.
  auto queued = [](const std::unique_ptr<Scheduler>& s) { return s->num_running() + s->num_waiting(); };
  r->ve = static_cast<int32_t>(std::min_element(schedulers_.begin(), schedulers_.end(),
                                                [&](const auto& a, const auto& b) { return queued(a) < queued(b); }) -
                               schedulers_.begin());
  scheduler_of(*r).add(first.seq.get());
  first.in_scheduler = true;
  seq_owner_[first.seq->id] = {r, 0};
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

void Engine::append_token(Request& r, Sample& s, int32_t token, const SampleResult& res) {
  const auto now = Clock::now();
  const SamplingParams& p = r.params;
  s.seq->token_ids.push_back(token);
  const int32_t n_out = s.seq->num_output_tokens();
  metrics_.generation_tokens++;
  if (!r.first_token) {
    r.first_token = now;
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - r.arrival).count());
  } else if (n_out > 1) {
    metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - s.last_token_time).count());
  }
  s.last_token_time = now;
  s.has_news = r.has_news = true;
  s.delta.token_ids.push_back(token);
  s.delta.num_output_tokens = n_out;
  if (p.logprobs >= 0) s.delta.logprobs.push_back({token, res.logprob, res.top_logprobs});
  if (s.grammar_dead_end) {
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (s.matcher) {
    // The mask allowed only tokens the grammar accepts; a stop token it
    // accepted ends the output, even with ignore_eos.
    if (!s.matcher->accept(token)) spdlog::warn("request {}: the grammar refused sampled token {}", r.id, token);
    if (s.matcher->terminated()) {
      s.pending_finish = FinishReason::Stop;
      return;
    }
  }

  const bool may_stop = n_out >= p.min_tokens;
  const bool stop_token = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (may_stop && stop_token) {
    s.delta.stop_token = token;
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (may_stop && !p.ignore_eos && tokenizer_->is_eog(token)) {
    s.pending_finish = FinishReason::Stop;
    return;
  }
  const StopCheckResult sc = s.stop->feed(s.detok->push(token), may_stop);
  s.delta.text += sc.text;
  if (sc.stopped) {
    s.delta.stop_string = s.stop->matched_stop();
    s.pending_finish = FinishReason::Stop;
    return;
  }
  if (n_out >= p.max_tokens || scheduler_of(r).reached_max_model_len(*s.seq)) s.pending_finish = FinishReason::Length;
}

void Engine::finish_sample(Request& r, Sample& s, FinishReason reason) {
  if (s.finished) return;
  // Text held back for a possible stop string (or an unfinished character) is
  // final now, unless a stop string ended the sample.
  if (s.delta.stop_string.empty()) {
    std::string rest = s.detok->flush();
    s.delta.text += s.stop->feed(rest, false).text + s.stop->flush();
  }
  s.finished = true;
  s.delta.finish_reason = reason;
  s.has_news = r.has_news = true;
  r.finished_samples++;
}

void Engine::propose_drafts(const Scheduler& scheduler) {
  draft_requests_.clear();
  const SpeculativeConfig& cfg = config_.speculative;
  const auto& running = scheduler.running();
  if (cfg.disable_by_batch_size > 0 && static_cast<int32_t>(running.size()) > cfg.disable_by_batch_size) return;
  for (Sequence* seq : running) {
    if (seq->num_tokens() - seq->num_computed_tokens != 1) continue;  // a prefill: nothing to verify with
    auto& [req, index] = seq_owner_.at(seq->id);
    Sample& s = req->samples[index];
    // Room for the drafts and the token after them, within max_tokens and the context.
    const int32_t room = std::min(req->params.max_tokens - seq->num_output_tokens(),
                                  sched_config_.max_model_len - seq->num_tokens()) - 1;
    const int32_t k = std::min(cfg.num_speculative_tokens, room);
    if (k <= 0 || s.finished) continue;
    // The first token of an n > 1 request is drawn n times from one row and
    // the samples fork from the prompt: no drafts before that.
    if (req->params.n > 1 && !req->forked) continue;
    if (cfg.adaptive && !s.spec.should_propose()) continue;
    DraftRequest d;
    d.seq = seq;
    d.max_drafts = k;
    d.params = &req->params;
    d.rng = &s.draft_rng;
    d.tokens = &seq->spec_token_ids;
    d.probs = &s.draft_probs;
    draft_requests_.push_back(d);
  }
  if (cfg.adaptive) plan_draft_budget(scheduler);
  std::erase_if(draft_requests_, [](const DraftRequest& d) { return d.max_drafts == 0; });
  if (draft_requests_.empty()) return;
  try {
    proposer_->propose(draft_requests_);
  } catch (const std::exception& e) {
    // Speculation only saves time: a proposer that fails costs this step's drafts, not the requests.
    spdlog::warn("speculative proposer failed, this step runs without drafts: {}", e.what());
    for (DraftRequest& d : draft_requests_) {
      d.tokens->clear();
      d.probs->clear();
    }
  }
}

// How many drafts each sequence asks for: those that raise the step's
// expected tokens per second, decided before anything is proposed. A draft
// at position j of a sequence whose drafts are accepted with probability a
// (once the ones before it are) yields a^j tokens on average and costs one
// more token and row of logits in the pass, plus a share of a draft model's
// pass; with E tokens expected from a step of T seconds, it pays when
// a^j * T > per_draft * E. Drafts are taken best first. Memory-bound steps
// (few rows) keep most; steps the output projection already makes
// compute-bound keep only likely ones. A sequence given none relaxes its
// estimate toward the prior, so that it is tried again later.
void Engine::plan_draft_budget(const Scheduler& scheduler) {
  if (!step_cost_.ready()) return;
  double tokens = 0, rows = 0, expected = 0;
  for (const Sequence* seq : scheduler.running()) {
    const int32_t behind = seq->num_tokens() - seq->num_computed_tokens;
    if (behind == 1) expected += 1, rows += 1;
    tokens += std::max(behind, 0);
  }
  tokens = std::min<double>(tokens, sched_config_.max_num_batched_tokens);
  double time = step_cost_.predict(tokens, rows);
  // A draft model's pass serves every sequence that drafts: its share.
  const double per_draft = step_cost_.per_draft() +
                           proposer_->seconds_per_pass() / static_cast<double>(std::max<size_t>(1, draft_requests_.size()));
  struct Candidate {
    double gain;
    size_t request;
    bool operator<(const Candidate& o) const { return gain < o.gain; }
  };
  std::vector<int32_t> keep(draft_requests_.size(), 0);
  std::vector<double> accept(draft_requests_.size());
  std::priority_queue<Candidate> best;
  for (size_t i = 0; i < draft_requests_.size(); ++i) {
    const DraftRequest& d = draft_requests_[i];
    const auto& [req, index] = seq_owner_.at(d.seq->id);
    accept[i] = req->samples[index].spec.per_draft_acceptance();
    if (config_.speculative.method == SpecMethod::DraftModel && d.params->temperature >= kGreedyTemperature) {
      // A draft model's sampled proposals: how many are verified changes
      // which random numbers the sample uses, and a seeded request must not
      // depend on timing. They all run, and count.
      keep[i] = d.max_drafts;
      for (int32_t j = 1; j <= keep[i]; ++j) expected += std::pow(accept[i], j), time += per_draft;
      continue;
    }
    best.push({accept[i], i});
  }
  while (!best.empty()) {
    const Candidate c = best.top();
    best.pop();
    if (c.gain * time <= per_draft * expected) break;
    expected += c.gain;
    time += per_draft;
    if (++keep[c.request] < draft_requests_[c.request].max_drafts) best.push({c.gain * accept[c.request], c.request});
  }
  for (size_t i = 0; i < draft_requests_.size(); ++i) {
    DraftRequest& d = draft_requests_[i];
    d.max_drafts = keep[i];
    if (keep[i] == 0) {
      const auto& [req, index] = seq_owner_.at(d.seq->id);
      req->samples[index].spec.idle();
    }
  }
}

void Engine::sample_entry(const StepPlan& plan, size_t entry, std::vector<Request*>& touched) {
  const ScheduledSeq& e = plan.seqs[runner_output_.entries[entry]];
  const auto owner = seq_owner_.find(e.seq_id);
  if (owner == seq_owner_.end()) return;  // aborted while the step was in flight
  Sequence* seq = e.seq;
  auto& [req, index] = owner->second;
  Request& r = *req;
  Sample& s = r.samples[index];
  const int32_t vocab = model_->config().n_vocab;
  std::vector<int32_t> banned;
  const std::span<const int32_t> eog(tokenizer_->eog_ids());
  // The grammar allows nothing more (its language is empty past this point):
  // the sample stops with a stop token, unseen, and the request fails with a
  // 400 naming the constraint.
  auto grammar_dead_end = [&](Request& req, Sample& target) {
    target.grammar_dead_end = true;
    if (req.grammar_error.empty())
      req.grammar_error = fmt::format("structured output: after {} output tokens the constraint allows no further "
                                      "token, so no output can satisfy it",
                                      target.seq->num_output_tokens());
    SampleResult res;
    res.token = eog.empty() ? 0 : eog.front();
    return res;
  };
  // One token from `row` for `target` (with a draft distribution q: accept
  // or reject `draft` against it). The sampler restores the row after use,
  // so one row serves every sample.
  auto draw = [&](Sample& target, const float* logits_row, int32_t draft = -1, const float* q = nullptr,
                  bool* accepted = nullptr) {
    float* row = const_cast<float*>(logits_row);
    if (config_.logits_observer)
      config_.logits_observer(r.id, static_cast<int32_t>(&target - r.samples.data()), target.seq->num_output_tokens(),
                              std::span<const float>(logits_row, static_cast<size_t>(vocab)));
    banned.clear();
    const int32_t* allowed = nullptr;
    if (target.matcher) {
      if (target.matcher->fill_next_token_bitmask(bitmask_.data(), grammars_->vocab_size())) allowed = bitmask_.data();
      if (allowed && !structured::any_allowed(allowed, vocab)) return grammar_dead_end(r, target);
      // Where the grammar may end, min_tokens must not ban the only way out.
      if (!target.matcher->completed())
        min_tokens_banned_ids(r.params, eog, target.seq->num_output_tokens(), banned);
    } else {
      min_tokens_banned_ids(r.params, eog, target.seq->num_output_tokens(), banned);
    }
    // The row is read again only for raw logprobs and by the other first
    // tokens of an n > 1 request.
    const bool row_reused = r.params.logprobs >= 0 || (!r.forked && r.params.n > 1);
    const std::span<const int32_t> all(target.seq->token_ids);
    const auto prompt = all.first(target.seq->num_prompt_tokens);
    const auto output = all.subspan(target.seq->num_prompt_tokens);
    if (q) {
      return sampler_->sample_against_draft(row, vocab, r.params, prompt, output, banned, target.rng, allowed,
                                            row_reused, draft, q, *accepted);
    }
    SampleResult res;
    try {
      res = sampler_->sample(row, vocab, r.params, prompt, output, banned, target.rng, allowed, row_reused);
    } catch (const Error&) {
      if (!allowed) throw;
      return grammar_dead_end(r, target);  // what the grammar allows, the logits rule out
    }
    if (accepted) *accepted = res.token == draft;
    return res;
  };
  touched.push_back(&r);
  if (!r.forked && r.params.n > 1 && seq->num_output_tokens() == 0) {
    // Parallel sampling: n first tokens from the prompt's logits.
    for (int32_t k = 1; k < r.params.n; ++k) {
      Sample& child = r.samples[k];
      child.seq = std::make_unique<Sequence>();
      child.seq->id = next_seq_id_++;
      child.seq->request_id = seq->request_id;
      child.seq->priority = r.priority;
      child.seq->token_ids = r.prompt;
      child.seq->num_prompt_tokens = seq->num_prompt_tokens;
      seq_owner_[child.seq->id] = {&r, k};
      // (a child's matcher, made with the request, is at the start like the first sample's)
      const SampleResult res = draw(child, runner_output_.row(entry, 0, vocab));
      append_token(r, child, res.token, res);
    }
  }
  const int32_t num_drafts = e.num_draft_tokens();
  if (num_drafts == 0) {
    const SampleResult res = draw(s, runner_output_.row(entry, 0, vocab));
    append_token(r, s, res.token, res);
    return;
  }
  // Speculative decoding: row j verifies draft j; each accepted draft is
  // appended (stop checks, grammar, penalties see it) before the next row is
  // sampled, and the first rejection, or the row after the last draft, gives
  // one token of the target's own.
  const bool has_q = !s.draft_probs.empty();
  int32_t accepted = 0;
  for (int32_t j = 0; j <= num_drafts; ++j) {
    const float* row = runner_output_.row(entry, j, vocab);
    bool ok = false;
    const SampleResult res = j < num_drafts
                                 ? draw(s, row, e.draft_tokens[j],
                                        has_q ? s.draft_probs.data() + static_cast<size_t>(j) * vocab : nullptr, &ok)
                                 : draw(s, row);
    append_token(r, s, res.token, res);
    if (ok) ++accepted;
    if (!ok || s.pending_finish != FinishReason::None) break;
  }
  metrics_.spec_decode_num_drafts++;
  metrics_.spec_decode_num_draft_tokens += num_drafts;
  metrics_.spec_decode_num_accepted_tokens += accepted;
  for (int32_t j = 0; j < accepted && j < static_cast<int32_t>(metrics_.spec_decode_accepted_per_pos.size()); ++j)
    metrics_.spec_decode_accepted_per_pos[j]++;
  s.spec.record(num_drafts, accepted);
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
  for (size_t ve = 0; ve < schedulers_.size(); ++ve)
    if (!in_flight_step(static_cast<int32_t>(ve))) submit_step(static_cast<int32_t>(ve), outputs);
  if (!in_flight_.empty()) {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    complete_step(f, true, outputs);
  }
  update_gauges();
  return outputs;
}

void Engine::submit_step(int32_t ve, std::vector<RequestOutput>& outputs) {
  Scheduler& scheduler = *schedulers_[static_cast<size_t>(ve)];
  const int64_t t_propose = ThreadPool::now_ns();
  if (proposer_) propose_drafts(scheduler);
  const int64_t t_start = ThreadPool::now_ns();
  InFlight f;
  f.ve = ve;
  f.plan = [&] {
    trace::Scope s("schedule", "engine");
    return scheduler.schedule();
  }();
  StepPlan& plan = f.plan;
  // The plan holds the drafts it runs.
  for (DraftRequest& d : draft_requests_) d.tokens->clear();
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
    runner_->submit(plan, block_shift_[static_cast<size_t>(ve)]);
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
    int64_t decode_tokens = 0;
    for (const ScheduledSeq& e : plan.seqs)
      if (e.num_new_tokens - e.num_draft_tokens() == 1) decode_tokens += e.num_new_tokens;
    const int64_t prefill_tokens = plan.num_batched_tokens - decode_tokens;
    const double forward_s = static_cast<double>(f.submit_ns + t_forward - t_wait) * 1e-9;
    metrics_.step_tokens_decode += decode_tokens;
    metrics_.step_tokens_prefill += prefill_tokens;
    metrics_.forward_seconds_decode += forward_s * static_cast<double>(decode_tokens) / plan.num_batched_tokens;
    metrics_.forward_seconds_prefill += forward_s * static_cast<double>(prefill_tokens) / plan.num_batched_tokens;
    if (proposer_) {
      int64_t rows = 0;
      for (const ScheduledSeq& e : plan.seqs) rows += e.num_logits();
      step_cost_.observe(plan.num_batched_tokens, rows, forward_s);
    }
    trace::Scope s("sample", "engine");
    for (size_t i = 0; i < runner_output_.entries.size(); ++i) sample_entry(plan, i, touched);
  }
  scheduler.on_step_done(plan);
  f.aborted.clear();

  // Children of n > 1 requests join now, sharing the prompt's blocks.
  for (Request* r : touched) {
    if (r->forked || r->params.n <= 1 || !r->samples[1].seq) continue;
    r->forked = true;
    for (int32_t k = 1; k < r->params.n; ++k) {
      scheduler.fork(r->samples[0].seq->id, r->samples[k].seq.get());
      r->samples[k].in_scheduler = true;
    }
  }
  // Stop decisions take effect: blocks go back to the pool.
  for (Request* r : touched)
    for (Sample& s : r->samples)
      if (s.pending_finish != FinishReason::None && !s.finished) {
        scheduler.finish(s.seq->id, s.pending_finish == FinishReason::Stop ? SeqStatus::FinishedStopped
                                                                           : SeqStatus::FinishedLength);
        release_sample(s);
        finish_sample(*r, s, s.pending_finish);
      }
  for (SeqId id : plan.length_capped) {
    auto it = seq_owner_.find(id);
    if (it == seq_owner_.end()) continue;
    Request& r = *it->second.first;
    release_sample(r.samples[it->second.second]);
    finish_sample(r, r.samples[it->second.second], FinishReason::Length);
    touched.push_back(&r);
  }

  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (Request* r : touched)
    if (r->has_news) outputs.push_back(collect(*r));
  phase_ns_[1] += f.submit_ns + t_forward - t_wait;
  phase_ns_[2] += ThreadPool::now_ns() - t_forward;
}

std::string Engine::profile_report() const {
  const double total = static_cast<double>(phase_ns_[0] + phase_ns_[1] + phase_ns_[2] + phase_ns_[3]);
  if (total <= 0) return "no steps run";
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string report =
      fmt::format("{} steps: schedule {:.1f} ms, forward {:.1f} ms [{}], sample+stop+detokenize {:.1f} ms",
                  metrics_.num_steps, ms(phase_ns_[0]), ms(phase_ns_[1]), backend_->profile_report(), ms(phase_ns_[2]));
  if (proposer_) {
    report += fmt::format(", propose {:.1f} ms", ms(phase_ns_[3]));
    const std::string p = proposer_->profile_report();
    if (!p.empty()) report += " [" + p + "]";
  }
  return report;
}

RequestOutput Engine::collect(Request& r) {
  RequestOutput out;
  out.request_id = r.id;
  out.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  out.num_cached_tokens = r.num_cached_tokens;
  for (Sample& s : r.samples) {
    if (!s.has_news) continue;
    out.completions.push_back(std::move(s.delta));
    s.delta = CompletionDelta{};
    s.delta.index = out.completions.back().index;
    s.delta.num_output_tokens = out.completions.back().num_output_tokens;
    s.has_news = false;
  }
  r.has_news = false;
  const auto now = Clock::now();
  out.finished = r.finished_samples == r.params.n;
  if (r.first_scheduled) out.queue_seconds = std::chrono::duration<double>(*r.first_scheduled - r.arrival).count();
  if (r.first_token) out.ttft_seconds = std::chrono::duration<double>(*r.first_token - r.arrival).count();
  out.e2e_seconds = std::chrono::duration<double>(now - r.arrival).count();
  if (out.finished && !r.grammar_error.empty()) {
    out.error = r.grammar_error;
    out.error_kind = RequestError::Invalid;
    out.error_param = r.params.structured.field;
  }
  if (out.finished) {
    metrics_.e2e_request_latency.observe(out.e2e_seconds);
    FinishReason reason = FinishReason::Stop;
    for (const auto& c : out.completions)
      if (c.finish_reason != FinishReason::None) reason = c.finish_reason;
    metrics_.request_success[to_string(reason)]++;
    for (Sample& s : r.samples)
      if (s.seq) seq_owner_.erase(s.seq->id);
    requests_.erase(r.id);  // destroys r
  }
  return out;
}

std::optional<RequestOutput> Engine::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  Request& r = *it->second;
  std::erase(waiting_for_grammar_, &r);
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
    s.finished = true;
    s.delta.finish_reason = FinishReason::Abort;
    s.has_news = true;
    r.finished_samples++;
  }
  r.has_news = true;
  RequestOutput out = collect(r);  // erases its entry (empty when kept)
  if (keep) in_flight->aborted.push_back(std::move(keep));
  update_gauges();
  return out;
}

// All virtual engines together.
KVCacheStats Engine::kv_stats() const {
  KVCacheStats t;
  double fragmented_slots = 0;
  for (const auto& sch : schedulers_) {
    const KVCacheStats k = sch->kv_stats();
    t.block_size = k.block_size;
    t.total_blocks += k.total_blocks;
    t.used_blocks += k.used_blocks;
    t.cached_blocks += k.cached_blocks;
    t.free_blocks += k.free_blocks;
    t.prefix_query_tokens += k.prefix_query_tokens;
    t.prefix_hit_tokens += k.prefix_hit_tokens;
    t.evictions += k.evictions;
    t.following_allocations += k.following_allocations;
    t.contiguous_allocations += k.contiguous_allocations;
    fragmented_slots += k.fragmentation * k.used_blocks;
  }
  t.fragmentation = t.used_blocks ? fragmented_slots / t.used_blocks : 0.0;
  return t;
}

void Engine::update_gauges() {
  const KVCacheStats kv = kv_stats();
  metrics_.kv_blocks_total = kv.total_blocks;
  metrics_.kv_blocks_used = kv.used_blocks;
  metrics_.kv_blocks_cached = kv.cached_blocks;
  metrics_.kv_blocks_free = kv.free_blocks;
  metrics_.kv_cache_usage = kv.usage();
  metrics_.kv_fragmentation = kv.fragmentation;
  metrics_.kv_following_allocations = kv.following_allocations;
  metrics_.kv_contiguous_allocations = kv.contiguous_allocations;
  const int64_t block_bytes = static_cast<int64_t>(backend_->kv_cache_spec().bytes_per_block());
  metrics_.num_requests_running = metrics_.num_requests_waiting = metrics_.num_requests_swapped = 0;
  metrics_.prefix_cache_queries = metrics_.prefix_cache_hits = 0;
  metrics_.num_preemptions = metrics_.kv_evicted_blocks = 0;
  metrics_.num_preemptions_recompute = metrics_.num_preemptions_swap = metrics_.num_preemptions_priority = 0;
  metrics_.num_preemptions_fair = 0;
  metrics_.swapped_out_bytes = metrics_.swapped_in_bytes = 0;
  for (const auto& sch : schedulers_) {
    metrics_.num_requests_running += sch->num_running();
    metrics_.num_requests_waiting += sch->num_waiting();
    metrics_.num_requests_swapped += sch->num_swapped();
    metrics_.prefix_cache_queries += sch->prefix_query_tokens();
    metrics_.prefix_cache_hits += sch->prefix_hit_tokens();
    metrics_.num_preemptions += sch->num_preemptions();
    metrics_.kv_evicted_blocks += sch->num_evicted_blocks();
    metrics_.num_preemptions_recompute += sch->num_preemptions_recompute();
    metrics_.num_preemptions_swap += sch->num_preemptions_swap();
    metrics_.num_preemptions_priority += sch->num_preemptions_priority();
    metrics_.num_preemptions_fair += sch->num_preemptions_fair();
    metrics_.swapped_out_bytes += sch->num_blocks_swapped_out() * block_bytes;
    metrics_.swapped_in_bytes += sch->num_blocks_swapped_in() * block_bytes;
  }
  // Requests whose grammar is still compiling wait as well (outside the schedulers).
  metrics_.num_requests_waiting += static_cast<int64_t>(waiting_for_grammar_.size());
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.metrics = metrics_;
  s.kv = kv_stats();
  s.num_unfinished_requests = static_cast<int64_t>(requests_.size());
  s.grammars = grammars_->stats();
  return s;
}

}  // namespace pagellm
