// Host-side token sampling for one sequence's logits row, in vLLM's order:
//   logit_bias -> banned ids (min_tokens) -> repetition penalty (prompt + output)
//   -> presence / frequency penalties (output) -> the grammar's allowed-token
//   bitmask (structured outputs) -> greedy argmax when temperature
//   is ~0, else temperature -> top-k -> top-p -> min-p -> draw.
// (That is vLLM V0's filter order. V1 applies min-p before top-k / top-p; the
// two differ only when top_p and min_p are both set: here top-p measures its
// mass before min-p removes anything.)
// Logprobs come from the raw (unprocessed) logits, like vLLM's default.
//
// Cost is O(vocab) per call plus a sort of a small candidate window: the
// vocabulary is never sorted as a whole.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sampling/sampler_rng.h"
#include "sampling/sampling_params.h"

namespace pagellm {

// Temperatures below this are greedy (as vLLM's _SAMPLING_EPS): 1/T would
// overflow or make exp() meaningless.
inline constexpr float kGreedyTemperature = 1e-5f;

struct SampleResult {
  int32_t token = -1;
  // log p(token) under log_softmax(raw logits); 0 unless params.logprobs >= 0.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens under the raw logits, logprob
  // descending (ties: lower id first). Empty unless params.logprobs > 0.
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// The tokens one draw chooses from, after every filter: ids ascending, each
// with its unnormalized weight exp((logit - max_logit) / T) in [0, 1];
// p(ids[i]) = weights[i] / total, total = sum_weights(weights). Zero weights
// (filtered out or underflowed) may be listed and are never drawn.
struct Candidates {
  std::span<const int32_t> ids;
  std::span<const float> weights;
  double total = 0.0;
};

// log_softmax over logits[vocab]: fills `top` with the k largest (token,
// logprob) pairs, logprob descending (ties: lower id first), and returns the
// log-normalizer log(sum(exp(logits))), so log p(i) = logits[i] - result.
// Non-finite logits count as -inf.
float log_softmax_topk(const float* logits, int32_t vocab, int32_t k,
                       std::vector<std::pair<int32_t, float>>& top);

// Holds the scratch buffers, so calls do not allocate once warm. Not thread
// safe: one Sampler per thread.
class Sampler {
 public:
  // Picks the next token from logits[vocab] (one sequence's row). `logits` is
  // used as scratch and restored before returning (also when it throws).
  // banned_ids: tokens that must not be chosen now (EOS and stop_token_ids
  // while fewer than min_tokens have been generated). prompt_ids and
  // output_ids are read only for the penalties. Non-finite logits (NaN, +-inf)
  // are never chosen. Throws Error when no token is left to choose, or for a
  // token id outside [0, vocab) in logit_bias, banned_ids or (with a penalty
  // set) prompt_ids / output_ids. rng is used only when not greedy, one
  // number per call. allowed_bitmask (may be null): bit (id % 32) of word
  // id / 32 clear means token id is not allowed (a grammar's mask).
  // restore_masked false: tokens the mask excluded may be left at -inf (for a
  // caller that reads the row no more: saving most of a vocabulary each token
  // costs more than the mask itself); every allowed token is restored.
  SampleResult sample(float* logits, int32_t vocab, const SamplingParams& params,
                      std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                      std::span<const int32_t> banned_ids, SamplerRng& rng,
                      const int32_t* allowed_bitmask = nullptr, bool restore_masked = true);

  // Speculative decoding against a draft distribution (rejection sampling):
  // the target distribution p is what sample() would draw from on this row
  // (same processing and filters). The draft token d, drawn by the draft
  // model from its distribution q, is accepted with probability
  // min(1, p(d) / q(d)); otherwise the token is drawn from (p - q)+
  // renormalized, so the result is distributed exactly as p. Greedy
  // (temperature ~0): the argmax, accepted when it is d. draft_probs: q over
  // the vocabulary (dense, [vocab]). `accepted` tells whether the token is d.
  // Uses one random number when accepting, two when not; logprobs as sample().
  SampleResult sample_against_draft(float* logits, int32_t vocab, const SamplingParams& params,
                                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                                    std::span<const int32_t> banned_ids, SamplerRng& rng,
                                    const int32_t* allowed_bitmask, bool restore_masked, int32_t draft_token,
                                    const float* draft_probs, bool& accepted);

  // --- The steps of sample(), public for tests and for callers that want them.

  // In place: logit_bias, bans (-inf), repetition / presence / frequency
  // penalties, then -inf for every token allowed_bitmask (if any) excludes.
  // Remembers the values it overwrote for restore_logits().
  void process_logits(float* logits, int32_t vocab, const SamplingParams& params,
                      std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                      std::span<const int32_t> banned_ids, const int32_t* allowed_bitmask = nullptr);
  // Undoes the last process_logits() on the same row.
  void restore_logits(float* logits);

  // Greedy choice over processed logits: the largest finite logit, lowest id
  // on ties. Throws Error when none is finite.
  static int32_t argmax(const float* logits, int32_t vocab);

  // Temperature, top-k, top-p and min-p over processed logits (temperature
  // must be >= kGreedyTemperature). The spans stay valid until the next call.
  Candidates filter(const float* logits, int32_t vocab, const SamplingParams& params);

  // Draws one candidate with probability weight / total, using one number
  // from rng: the first id whose cumulative weight (ids ascending) exceeds
  // u * total.
  static int32_t draw(const Candidates& candidates, SamplerRng& rng);
  // The same with the number given: u uniform in [0, 1) (rng.next_double()).
  static int32_t draw_at(const Candidates& candidates, double u);

  // A draw from an unprocessed row (no bias, bans, penalties or mask):
  // greedy below kGreedyTemperature, else temperature -> top-k -> top-p ->
  // min-p -> draw_at(u); what sample() picks for such params when its rng
  // yields u. -1 when no logit is finite. A device's sample op (the CPU
  // backend's) runs this, so that only the token ids leave the device.
  int32_t sample_plain(const float* logits, int32_t vocab, float temperature, int32_t top_k, float top_p,
                       float min_p, double u);

 private:
  void apply_penalties(float* logits, int32_t vocab, const SamplingParams& params,
                       std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);
  void apply_bitmask(float* logits, int32_t vocab, const int32_t* allowed);
  float top_k_threshold(const float* logits, int32_t vocab, int32_t k, float max_logit,
                        size_t n_finite);
  size_t keep_nucleus(size_t n, double target);
  size_t keep_if_weight_at_least(size_t n, float min_weight);
  void save(float* logits, int32_t id) { undo_.emplace_back(id, logits[id]); }
  // sample() and sample_against_draft(): draft_probs null for the former.
  SampleResult sample_impl(float* logits, int32_t vocab, const SamplingParams& params,
                           std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                           std::span<const int32_t> banned_ids, SamplerRng& rng, const int32_t* allowed_bitmask,
                           bool restore_masked, int32_t draft_token, const float* draft_probs, bool* accepted);
  // Accepts draft_token with probability min(1, p/q), else draws from (p - q)+.
  int32_t draw_against_draft(const Candidates& c, int32_t draft_token, const float* draft_probs, SamplerRng& rng,
                             bool& accepted);

  struct Ranked {  // a candidate near the top-p cut
    int32_t id;
    float weight;
  };
  std::vector<std::pair<int32_t, float>> undo_;  // (id, original logit), in write order
  // A grammar's mask: the 32-token words it touches are saved whole (a word
  // is usually all allowed or all excluded), at their own offset in
  // row_backup_ [vocab]; masked_words_ lists them.
  std::vector<float> row_backup_;
  std::vector<int32_t> masked_words_;
  int32_t masked_vocab_ = 0;  // the row length of the last mask
  bool save_masked_ = true;
  std::vector<uint8_t> seen_;                    // [vocab] 0 between calls
  std::vector<int32_t> counts_;                  // [vocab] 0 between calls
  std::vector<float> dense_weights_;             // [vocab]
  std::vector<int32_t> all_ids_;                 // [vocab] 0, 1, 2, ...
  std::vector<int32_t> ids_;                     // [vocab] candidates ...
  std::vector<float> weights_;                   // [vocab] ... and their weights
  std::vector<Ranked> window_;                   // top-p: the candidates around the cut
  std::vector<float> values_;                    // top-k selection scratch
  std::vector<double> bucket_mass_;              // top-p histogram
  std::vector<float> residual_;                  // [vocab] (p - q)+ of a rejected draft
};

// The ids sample() must not choose yet: while fewer than params.min_tokens
// tokens have been generated, every token that would end the sequence
// (params.stop_token_ids, and eos_ids unless ignore_eos). Fills `out`.
void min_tokens_banned_ids(const SamplingParams& params, std::span<const int32_t> eos_ids,
                           int32_t num_generated, std::vector<int32_t>& out);

// sample() on a thread_local Sampler.
SampleResult sample(float* logits, int32_t vocab, const SamplingParams& params,
                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                    std::span<const int32_t> banned_ids, SamplerRng& rng);

}  // namespace pagellm
