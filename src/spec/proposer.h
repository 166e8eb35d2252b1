// Proposers of speculative tokens. Each engine step, before scheduling, the
// engine asks for drafts for the running sequences that are one token behind
// (decodes); the scheduler runs the drafts with the decode and the engine
// keeps the prefix the target model accepts. Proposers see token ids and
// sampling settings, never the target's tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampler_rng.h"
#include "sampling/sampling_params.h"
#include "scheduler/sequence.h"

namespace pagellm {

// One sequence's request for drafts this step.
struct DraftRequest {
  const Sequence* seq = nullptr;  // running; its last token is not computed yet
  int32_t max_drafts = 0;         // > 0
  const SamplingParams* params = nullptr;
  SamplerRng* rng = nullptr;      // the draft's own random stream (sampled requests)
  // Filled by the proposer: at most max_drafts tokens (none is fine), and for
  // a proposer that draws from a distribution q (a draft model on a sampled
  // request), q of each proposal, dense: [tokens.size(), vocab]. Empty probs:
  // each proposal is a point mass (the verifier accepts it when the target
  // would have drawn it).
  std::vector<TokenId>* tokens = nullptr;
  std::vector<float>* probs = nullptr;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void propose(std::span<DraftRequest> requests) = 0;
  // The sequence is gone (finished or aborted): drop what is kept for it.
  virtual void release(SeqId seq) { (void)seq; }
  virtual std::string describe() const = 0;
  // Time spent proposing, for --profile.
  virtual std::string profile_report() const { return {}; }
  // Seconds one more proposal per sequence costs (a draft model's pass, over
  // every sequence it serves; recent passes weigh most); 0 for lookups.
  virtual double seconds_per_pass() const { return 0.0; }
};

// Prompt lookup over the sequence's own tokens (spec/ngram.h).
class NgramProposer : public Proposer {
 public:
  NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<DraftRequest> requests) override;
  std::string describe() const override;

 private:
  int32_t min_n_, max_n_;
};

}  // namespace pagellm
