// The engine's state of one request and of each of its n samples, shared by
// the step loop (engine.cpp), the sampling of a step's logits
// (step_sampler.h), the drafts of speculative decoding (draft_planner.h) and
// the output processor (output_processor.h). Internal to src/engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/lora_registry.h"
#include "engine/pooling.h"
#include "engine/stop_checker.h"
#include "sampling/sampler_rng.h"
#include "scheduler/sequence.h"
#include "spec/adaptive.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

using EngineClock = std::chrono::steady_clock;

struct SampleState {
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
  EngineClock::time_point last_token_time;
};

struct RequestState {
  std::string id;
  SamplingParams params;
  int32_t priority = 0;
  std::vector<int32_t> prompt;
  std::vector<SampleState> samples;
  std::shared_ptr<structured::PendingGrammar> grammar;  // with a structured output, until it starts
  std::string grammar_error;  // a sample's grammar allowed no token: the request ends with this (400)
  bool forked = false;
  int32_t num_cached_tokens = 0;
  // prompt_logprobs >= 0: entry i scores prompt token i + 1, filled as the
  // prompt's chunks are computed; handed out once, when done.
  std::vector<TokenLogprob> prompt_logprobs;
  bool prompt_logprobs_done = false, prompt_logprobs_sent = false;
  // An embedding request: its prompt's rows pooled as they come back; the
  // vector once the prompt is computed.
  bool embed = false;
  bool score = false;  // ... then through the score head (embedding: its probabilities)
  Pooler pooler;
  std::vector<float> embedding;
  int32_t ve = 0;  // its virtual engine (scheduler)
  std::unique_ptr<LoraLease> lora;  // its adapter, or null
  EngineClock::time_point arrival;
  std::optional<EngineClock::time_point> first_scheduled, first_token;
  int32_t finished_samples = 0;
  bool has_news = false;
};

// Which request, and which of its samples, a scheduler's sequence is.
using SeqOwners = std::unordered_map<SeqId, std::pair<RequestState*, int32_t>>;

}  // namespace pagellm
