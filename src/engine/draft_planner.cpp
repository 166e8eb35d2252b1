#include "engine/draft_planner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <queue>

namespace pagellm {

void DraftPlanner::propose(const Scheduler& scheduler) {
  draft_requests_.clear();
  const SpeculativeConfig& cfg = config_;
  const auto& running = scheduler.running();
  if (cfg.disable_by_batch_size > 0 && static_cast<int32_t>(running.size()) > cfg.disable_by_batch_size) return;
  for (Sequence* seq : running) {
    if (seq->num_tokens() - seq->num_computed_tokens != 1) continue;  // a prefill: nothing to verify with
    auto& [req, index] = owners_.at(seq->id);
    SampleState& s = req->samples[index];
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
    proposer_.propose(draft_requests_);
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
void DraftPlanner::plan_draft_budget(const Scheduler& scheduler) {
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
                           proposer_.seconds_per_pass() / static_cast<double>(std::max<size_t>(1, draft_requests_.size()));
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
    const auto& [req, index] = owners_.at(d.seq->id);
    accept[i] = req->samples[index].spec.per_draft_acceptance();
    if (config_.method == SpecMethod::DraftModel && d.params->temperature >= kGreedyTemperature) {
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
      const auto& [req, index] = owners_.at(d.seq->id);
      req->samples[index].spec.idle();
    }
  }
}

void DraftPlanner::clear_drafts() {
  for (DraftRequest& d : draft_requests_) d.tokens->clear();
}

void DraftPlanner::observe_step(const StepPlan& plan, double forward_s) {
  int64_t rows = 0;
  for (const ScheduledSeq& e : plan.seqs) rows += e.num_logits();
  step_cost_.observe(plan.num_batched_tokens, rows, forward_s);
}

}  // namespace pagellm
