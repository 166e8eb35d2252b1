// Perplexity of a model on a token stream: the quality check of the tuning
// guides after any precision change (KV cache type, weight type, kernels).
//
// Two ways to cut the text:
//  - stride 0 (llama.cpp's llama-perplexity): non-overlapping chunks of ctx
//    tokens, the first of each made BOS when the model wants one; the second
//    half of each chunk is scored (each token with at least ctx/2 of context).
//  - stride s > 0 (the Hugging Face recipe): windows of ctx tokens starting
//    every s tokens; each window scores the tokens no earlier window scored.
//  - sinks >= 0 (StreamingLLM): one stream over the whole text through a
//    sliding KV window, the curve of perplexity by position (flat when the
//    window keeps what the model needs).
// Logits come from the same batched forward pass the engine runs, in pieces
// of at most `batch` tokens per pass (all positions' logits at once would
// need ctx x vocabulary floats).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/model.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

struct PerplexityOptions {
  int32_t ctx = 512;
  int32_t stride = 0;     // 0: llama.cpp's chunks
  int32_t batch = 128;    // tokens per forward pass
  int32_t bos_id = -1;    // >= 0: the first token of each llama.cpp chunk becomes this
  int32_t max_chunks = 0; // 0: all
  // >= 0: streaming (--kv-eviction sliding): the whole text is one sequence,
  // fed `batch` tokens at a time, whose KV keeps its first `sinks` tokens and
  // its most recent ones (ctx tokens of KV in all); every token after the
  // first is scored, and each ctx tokens make one segment of the curve.
  int32_t sinks = -1;
};

struct PerplexityResult {
  double nll_sum = 0;        // natural log
  int64_t tokens_scored = 0;
  double ppl() const;
  double ppl_stderr() const;  // from the spread of the per-token losses (llama.cpp's estimate)
  std::vector<double> running_ppl;  // after each chunk / window
  std::vector<double> segment_ppl;  // streaming: of each ctx tokens
  double sum_sq = 0;  // of per-token NLLs, for the error estimate
};

// `kv` must describe `model`'s KV memory (block ids index it) and hold no
// sequence; it is left empty. Throws Error when the text is shorter than one
// chunk or the KV cache cannot hold ctx tokens. Under tensor / pipeline
// parallelism, rank 0 passes the ranks' communicator (the workers run each
// pass's shard as they do an idle engine's steps) and the micro-batches.
PerplexityResult compute_perplexity(Model& model, const KVCacheConfig& kv, std::span<const int32_t> tokens,
                                    const PerplexityOptions& options,
                                    const std::function<void(size_t done, size_t total, double ppl)>& progress = {},
                                    dist::Communicator* comm = nullptr, int micro_batches = 0);

}  // namespace pagellm
