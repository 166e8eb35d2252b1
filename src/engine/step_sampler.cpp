#include "engine/step_sampler.h"

#include <span>

#include "core/error.h"

namespace pagellm {

StepSampler::StepSampler(const EngineConfig& config, const Tokenizer& tokenizer, int32_t n_vocab,
                         const structured::GrammarCompiler& grammars, OutputProcessor& outputs, EngineMetrics& metrics)
    : config_(config),
      tokenizer_(tokenizer),
      vocab_(n_vocab),
      grammar_vocab_(grammars.vocab_size()),
      outputs_(outputs),
      metrics_(metrics),
      bitmask_(static_cast<size_t>(structured::bitmask_words(grammars.vocab_size())), 0) {}

// The grammar allows nothing more (its language is empty past this point):
// the sample stops with a stop token, unseen, and the request fails with a
// 400 naming the constraint.
SampleResult StepSampler::grammar_dead_end(RequestState& r, SampleState& target) {
  target.grammar_dead_end = true;
  if (r.grammar_error.empty())
    r.grammar_error = fmt::format("structured output: after {} output tokens the constraint allows no further "
                                  "token, so no output can satisfy it",
                                  target.seq->num_output_tokens());
  const std::vector<int32_t>& eog = tokenizer_.eog_ids();
  SampleResult res;
  res.token = eog.empty() ? 0 : eog.front();
  return res;
}

SampleResult StepSampler::draw(RequestState& r, SampleState& target, const float* logits_row, int32_t draft,
                               const float* q, bool* accepted) {
  float* row = const_cast<float*>(logits_row);
  if (config_.logits_observer)
    config_.logits_observer(r.id, static_cast<int32_t>(&target - r.samples.data()), target.seq->num_output_tokens(),
                            std::span<const float>(logits_row, static_cast<size_t>(vocab_)));
  const std::span<const int32_t> eog(tokenizer_.eog_ids());
  banned_.clear();
  const int32_t* allowed = nullptr;
  if (target.matcher) {
    if (target.matcher->fill_next_token_bitmask(bitmask_.data(), grammar_vocab_)) allowed = bitmask_.data();
    if (allowed && !structured::any_allowed(allowed, vocab_)) return grammar_dead_end(r, target);
    // Where the grammar may end, min_tokens must not ban the only way out.
    if (!target.matcher->completed()) min_tokens_banned_ids(r.params, eog, target.seq->num_output_tokens(), banned_);
  } else {
    min_tokens_banned_ids(r.params, eog, target.seq->num_output_tokens(), banned_);
  }
  // The row is read again only for raw logprobs and by the other first
  // tokens of an n > 1 request.
  const bool row_reused = r.params.logprobs >= 0 || (!r.forked && r.params.n > 1);
  const std::span<const int32_t> all(target.seq->token_ids);
  const auto prompt = all.first(target.seq->num_prompt_tokens);
  const auto output = all.subspan(target.seq->num_prompt_tokens);
  if (q) {
    return sampler_.sample_against_draft(row, vocab_, r.params, prompt, output, banned_, target.rng, allowed,
                                         row_reused, draft, q, *accepted);
  }
  SampleResult res;
  try {
    res = sampler_.sample(row, vocab_, r.params, prompt, output, banned_, target.rng, allowed, row_reused);
  } catch (const Error&) {
    if (!allowed) throw;
    return grammar_dead_end(r, target);  // what the grammar allows, the logits rule out
  }
  if (accepted) *accepted = res.token == draft;
  return res;
}

void StepSampler::sample_one(RequestState& r, SampleState& s, const float* row, const Scheduler& scheduler) {
  const SampleResult res = draw(r, s, row);
  outputs_.append(r, s, res.token, res, scheduler);
}

void StepSampler::sample_entry(RequestState& r, SampleState& s, const ScheduledSeq& e,
                               const ModelRunner::Output& out, size_t entry, const Scheduler& scheduler) {
  const int32_t num_drafts = e.num_draft_tokens();
  if (num_drafts == 0) {
    sample_one(r, s, out.row(entry, 0, vocab_), scheduler);
    return;
  }
  // Speculative decoding: row j verifies draft j; each accepted draft is
  // appended (stop checks, grammar, penalties see it) before the next row is
  // sampled, and the first rejection, or the row after the last draft, gives
  // one token of the target's own.
  const bool has_q = !s.draft_probs.empty();
  int32_t accepted = 0;
  for (int32_t j = 0; j <= num_drafts; ++j) {
    const float* row = out.row(entry, j, vocab_);
    bool ok = false;
    const SampleResult res =
        j < num_drafts
            ? draw(r, s, row, e.draft_tokens[j], has_q ? s.draft_probs.data() + static_cast<size_t>(j) * vocab_ : nullptr,
                   &ok)
            : draw(r, s, row);
    outputs_.append(r, s, res.token, res, scheduler);
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

bool StepSampler::plain(const RequestState& r, const SampleState& s, const ScheduledSeq& e) const {
  const SamplingParams& p = r.params;
  return !config_.logits_observer && !s.matcher && p.logprobs < 0 && p.logit_bias.empty() &&
         p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         s.seq->num_output_tokens() >= p.min_tokens && e.num_draft_tokens() == 0 && (r.forked || p.n <= 1);
}

bool StepSampler::device_draws(const StepPlan& plan, const SeqOwners& owners, std::vector<SampleDraw>& draws) {
  draws.clear();
  std::vector<std::pair<RequestState*, SampleState*>> who;
  for (const ScheduledSeq& e : plan.seqs) {
    if (!e.sample) continue;
    const auto it = owners.find(e.seq_id);
    if (it == owners.end()) return false;
    RequestState& r = *it->second.first;
    SampleState& s = r.samples[static_cast<size_t>(it->second.second)];
    if (!plain(r, s, e)) return false;
    who.emplace_back(&r, &s);
  }
  for (const auto& [r, s] : who) {
    SampleDraw d{};
    d.row = static_cast<int32_t>(draws.size());
    d.temperature = r->params.temperature;
    d.top_k = r->params.top_k;
    d.top_p = r->params.top_p;
    d.min_p = r->params.min_p;
    d.u = d.temperature < kGreedyTemperature ? 0.0 : s->rng.next_double();  // the host sampler's one number
    draws.push_back(d);
  }
  return !draws.empty();
}

void StepSampler::accept_device_token(RequestState& r, SampleState& s, int32_t token, const Scheduler& scheduler) {
  if (token < 0 || token >= vocab_)  // as the host sampler's argmax says it
    fail("sampler: no token can be chosen (all {} logits are -inf, NaN or banned)", vocab_);
  SampleResult res;
  res.token = token;
  metrics_.tokens_sampled_on_device++;
  outputs_.append(r, s, token, res, scheduler);
}

}  // namespace pagellm
