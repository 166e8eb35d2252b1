// Draws a step's tokens from the runner's logits: for each sample, its
// grammar's mask and the min_tokens bans, then the sampler; with speculative
// decoding, draft by draft against the drafts' rows. Every token goes to the
// OutputProcessor at once, so the next row of the same sample is drawn with
// it appended (penalties, grammar and stop checks see it).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "engine/output_processor.h"
#include "engine/request_state.h"

namespace pagellm {

class StepSampler {
 public:
  StepSampler(const EngineConfig& config, const Tokenizer& tokenizer, int32_t n_vocab,
              const structured::GrammarCompiler& grammars, OutputProcessor& outputs, EngineMetrics& metrics);

  // One token for sample s from `row` (an n > 1 request's first tokens all
  // come from the prompt's row).
  void sample_one(RequestState& r, SampleState& s, const float* row, const Scheduler& scheduler);
  // Sample s's tokens of scheduled entry `entry`: one, or with drafts, the
  // accepted drafts and one token of the target model's own.
  void sample_entry(RequestState& r, SampleState& s, const ScheduledSeq& e, const ModelRunner::Output& out,
                    size_t entry, const Scheduler& scheduler);

  // Sampling on the device (the backend's sample op), so that only token ids
  // leave it. Each sampled entry of a plan must be plain: one token from one
  // row, shaped by nothing but temperature, top-k, top-p and min-p (no
  // grammar, penalties, bias, min_tokens bans, logprobs, drafts, logits
  // observer, nor an n > 1 request's first tokens). Then draws gets one draw
  // per entry, its random number taken now from the sample's own generator,
  // as draw() would take it. False (and nothing drawn) otherwise.
  bool device_draws(const StepPlan& plan, const SeqOwners& owners, std::vector<SampleDraw>& draws);
  // The token the device drew for sample s (-1: its row had no finite logit).
  void accept_device_token(RequestState& r, SampleState& s, int32_t token, const Scheduler& scheduler);

 private:
  // One token from `row` for `target` (with a draft distribution q: accept
  // or reject `draft` against it). The sampler restores the row after use,
  // so one row serves every sample.
  SampleResult draw(RequestState& r, SampleState& target, const float* row, int32_t draft = -1,
                    const float* q = nullptr, bool* accepted = nullptr);
  SampleResult grammar_dead_end(RequestState& r, SampleState& target);
  bool plain(const RequestState& r, const SampleState& s, const ScheduledSeq& e) const;

  const EngineConfig& config_;
  const Tokenizer& tokenizer_;
  const int32_t vocab_;
  const int32_t grammar_vocab_;
  OutputProcessor& outputs_;
  EngineMetrics& metrics_;
  Sampler sampler_;
  std::vector<int32_t> bitmask_;  // one sequence's allowed tokens, reused
  std::vector<int32_t> banned_;
};

}  // namespace pagellm
