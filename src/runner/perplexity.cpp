#include "runner/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runner/model_runner.h"
#include "scheduler/sequence.h"
#include "scheduler/step_plan.h"

namespace pagellm {
namespace {

// -log softmax(row)[target], in double precision.
double token_nll(const float* row, int32_t n_vocab, int32_t target) {
  float max = row[0];
  for (int32_t i = 1; i < n_vocab; ++i) max = std::max(max, row[i]);
  double sum = 0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
  return std::log(sum) - (static_cast<double>(row[target]) - max);
}

// One forward pass over tokens [start, start + len) of `tokens` as sequence
// kSeq, with logits at every position. The piece's first token is the
// sequence's last; the rest ride as "drafts", for which the runner returns
// logits at every position. sinks >= 0: the sequence's KV may have an
// evicted gap (streaming).
constexpr SeqId kSeq = 1;
void forward_piece(KVCacheManager& kv, ModelRunner& runner, Sequence& seq, std::span<const int32_t> tokens,
                   int32_t start, int32_t len, int32_t sinks, ModelRunner::Output& out) {
  auto alloc = kv.allocate_slots(kSeq, start, len);
  PAGELLM_CHECK(alloc.has_value(), "perplexity: the KV cache cannot hold {} tokens", start + len);
  seq.token_ids.assign(tokens.begin(), tokens.begin() + start + 1);
  seq.num_computed_tokens = start;
  ScheduledSeq e;
  e.seq = &seq;
  e.seq_id = kSeq;
  e.start_pos = start;
  e.num_new_tokens = len;
  e.block_table = kv.block_table(kSeq);
  e.sample = true;
  e.draft_tokens.assign(tokens.begin() + start + 1, tokens.begin() + start + len);
  if (const int32_t evicted = kv.evicted_end(kSeq); sinks >= 0 && evicted > 0) {
    e.kv_sinks = sinks;
    e.kv_evicted_to = evicted * kv.block_size();
  }
  StepPlan plan;
  plan.block_size = kv.block_size();
  plan.seqs.assign(1, std::move(e));
  plan.num_batched_tokens = len;
  plan.num_draft_tokens = len - 1;
  runner.execute(plan, out);
}

// Runs `window` through the model, piece by piece, and adds the NLL of
// predicting window[j + 1] for every j in [score_from, window.size() - 1).
void score_window(Model& model, KVCacheManager& kv, ModelRunner& runner, std::span<const int32_t> window,
                  int32_t score_from, int32_t batch, PerplexityResult& r) {
  const int32_t n = static_cast<int32_t>(window.size());
  const int32_t n_vocab = model.config().n_vocab;
  Sequence seq;
  seq.id = kSeq;
  seq.num_prompt_tokens = n;
  ModelRunner::Output out;
  for (int32_t start = 0; start < n - 1; start += batch) {
    const int32_t len = std::min(batch, n - 1 - start);  // positions whose next token is known
    forward_piece(kv, runner, seq, window, start, len, -1, out);
    for (int32_t j = 0; j < len; ++j) {
      const int32_t pos = start + j;
      if (pos < score_from) continue;
      const double nll = token_nll(out.row(0, j, n_vocab), n_vocab, window[static_cast<size_t>(pos) + 1]);
      r.nll_sum += nll;
      r.sum_sq += nll * nll;
      ++r.tokens_scored;
    }
  }
  kv.free(kSeq);
}

// Streaming: the whole text as one sequence through a sliding window of
// `o.ctx` tokens of KV (the first o.sinks kept), evicting as it goes.
void score_stream(Model& model, KVCacheManager& kv, ModelRunner& runner, std::span<const int32_t> tokens,
                  const PerplexityOptions& o, PerplexityResult& r,
                  const std::function<void(size_t, size_t, double)>& progress) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t n_vocab = model.config().n_vocab;
  const int32_t window = sliding_window_tokens(o.sinks, o.ctx, kv.block_size());
  PAGELLM_CHECK(window >= 2 * kv.block_size(), "perplexity: --ctx {} leaves fewer than 2 blocks besides {} sinks",
                o.ctx, o.sinks);
  const int32_t piece = std::max(1, std::min(o.batch, window / 2));
  Sequence seq;
  seq.id = kSeq;
  seq.num_prompt_tokens = n;
  ModelRunner::Output out;
  const size_t segments = static_cast<size_t>((n - 1 + o.ctx - 1) / o.ctx);
  const size_t todo = o.max_chunks > 0 ? std::min<size_t>(segments, o.max_chunks) : segments;
  const int32_t end = static_cast<int32_t>(std::min<int64_t>(n - 1, static_cast<int64_t>(todo) * o.ctx));
  double seg_nll = 0;
  int64_t seg_count = 0;
  for (int32_t start = 0; start < end; start += piece) {
    const int32_t len = std::min(piece, end - start);
    kv.slide_window(kSeq, o.sinks, o.ctx, start + len);
    forward_piece(kv, runner, seq, tokens, start, len, o.sinks, out);
    for (int32_t j = 0; j < len; ++j) {
      const int32_t pos = start + j;
      const double nll = token_nll(out.row(0, j, n_vocab), n_vocab, tokens[static_cast<size_t>(pos) + 1]);
      r.nll_sum += nll;
      r.sum_sq += nll * nll;
      ++r.tokens_scored;
      seg_nll += nll;
      ++seg_count;
      if ((pos + 1) % o.ctx == 0 || pos + 1 == end) {
        r.segment_ppl.push_back(std::exp(seg_nll / static_cast<double>(seg_count)));
        r.running_ppl.push_back(r.ppl());
        seg_nll = 0;
        seg_count = 0;
        if (progress) progress(r.segment_ppl.size(), todo, r.segment_ppl.back());
      }
    }
  }
  kv.free(kSeq);
}

}  // namespace

double PerplexityResult::ppl() const { return tokens_scored ? std::exp(nll_sum / tokens_scored) : 0.0; }

double PerplexityResult::ppl_stderr() const {
  if (tokens_scored < 2) return 0.0;
  const double n = static_cast<double>(tokens_scored);
  const double mean = nll_sum / n;
  const double var = std::max(0.0, sum_sq / n - mean * mean);
  return ppl() * std::sqrt(var / (n - 1));  // d exp(m) = exp(m) dm
}

PerplexityResult compute_perplexity(Model& model, const KVCacheConfig& kv_config, std::span<const int32_t> tokens,
                                    const PerplexityOptions& o,
                                    const std::function<void(size_t, size_t, double)>& progress,
                                    dist::Communicator* comm, int micro_batches) {
  PAGELLM_CHECK(o.ctx >= 2, "perplexity: --ctx must be at least 2, got {}", o.ctx);
  PAGELLM_CHECK(o.stride >= 0 && o.stride <= o.ctx, "perplexity: --stride must be in [0, ctx], got {}", o.stride);
  PAGELLM_CHECK(o.batch >= 1, "perplexity: the batch must be at least 1 token");
  const int32_t n_vocab = model.config().n_vocab;
  for (int32_t t : tokens) PAGELLM_CHECK(t >= 0 && t < n_vocab, "perplexity: token id {} is outside the vocabulary", t);
  KVCacheConfig kc = kv_config;
  kc.enable_prefix_caching = false;
  KVCacheManager kv(kc);
  ModelRunner runner(model, comm, micro_batches);
  PerplexityResult r;
  const size_t n = tokens.size();
  if (o.sinks >= 0) {
    PAGELLM_CHECK(n >= 2, "perplexity: the text has fewer than 2 tokens");
    score_stream(model, kv, runner, tokens, o, r, progress);
    return r;
  }
  if (o.stride == 0) {
    const size_t chunks = n / static_cast<size_t>(o.ctx);
    PAGELLM_CHECK(chunks >= 1, "perplexity: the text has {} tokens, fewer than one chunk of --ctx {}", n, o.ctx);
    const size_t todo = o.max_chunks > 0 ? std::min<size_t>(chunks, o.max_chunks) : chunks;
    std::vector<int32_t> window(static_cast<size_t>(o.ctx));
    for (size_t c = 0; c < todo; ++c) {
      std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(c * o.ctx), o.ctx, window.begin());
      if (o.bos_id >= 0) window[0] = o.bos_id;
      score_window(model, kv, runner, window, o.ctx / 2, o.batch, r);
      r.running_ppl.push_back(r.ppl());
      if (progress) progress(c + 1, todo, r.ppl());
    }
    return r;
  }
  PAGELLM_CHECK(n >= 2, "perplexity: the text has fewer than 2 tokens");
  // Hugging Face's recipe: windows every `stride` tokens; each scores what is new.
  size_t scored_to = 0;  // targets [1, scored_to] are scored
  const size_t windows = n <= static_cast<size_t>(o.ctx) ? 1 : (n - o.ctx + o.stride - 1) / o.stride + 1;
  const size_t todo = o.max_chunks > 0 ? std::min<size_t>(windows, o.max_chunks) : windows;
  for (size_t w = 0; w < todo; ++w) {
    const size_t begin = std::min(w * static_cast<size_t>(o.stride), n > static_cast<size_t>(o.ctx) ? n - o.ctx : 0);
    const size_t end = std::min(begin + o.ctx, n);
    const std::span<const int32_t> window = tokens.subspan(begin, end - begin);
    // Position p of the window predicts target begin + p + 1; score the new ones.
    const int32_t from = static_cast<int32_t>(scored_to > begin ? scored_to - begin : 0);
    score_window(model, kv, runner, window, from, o.batch, r);
    scored_to = end - 1;
    r.running_ppl.push_back(r.ppl());
    if (progress) progress(w + 1, todo, r.ppl());
    if (end == n) break;
  }
  return r;
}

}  // namespace pagellm
