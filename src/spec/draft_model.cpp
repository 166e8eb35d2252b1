#include "spec/draft_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "core/util.h"

namespace pagellm {

namespace {

// Same ids, same token text: otherwise a proposal would mean another text.
void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& path) {
  auto refuse = [&](const std::string& detail) {
    fail("the draft model '{}' does not share the target model's vocabulary ({}); speculative decoding needs a "
         "draft with the target's tokenizer",
         path, detail);
  };
  if (target.vocab_size() != draft.vocab_size())
    refuse(fmt::format("{} tokens in the draft, {} in the target", draft.vocab_size(), target.vocab_size()));
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    if (target.token_text(id) != draft.token_text(id))
      refuse(fmt::format("token {} is '{}' in the draft, '{}' in the target", id, draft.token_text(id),
                         target.token_text(id)));
  }
}

}  // namespace

DraftModelProposer::DraftModelProposer(const DraftModelOptions& options, const Tokenizer& target_tokenizer,
                                       int32_t target_n_vocab, const LoadProgress& progress)
    : options_(options) {
  PAGELLM_CHECK(options_.num_blocks >= 2, "draft model: a KV pool needs at least 2 blocks, got {}",
                options_.num_blocks);
  std::unique_ptr<Tokenizer> draft_tokenizer;
  try {
    draft_tokenizer = Tokenizer::load(options_.model);
  } catch (const Error& e) {
    fail("speculative draft model '{}': {}", options_.model, e.what());
  }
  check_same_vocabulary(target_tokenizer, *draft_tokenizer, options_.model);
  backend_ = create_backend(options_.device, options_.backend_options);
  backend_->set_profiling(options_.profile);
  if (options_.deterministic) backend_->set_deterministic(true);
  model_ = Model::load(options_.model, *backend_, progress);
  // Its own states would need the target's snapshot-and-restore (KVCacheConfig::state_snapshots).
  PAGELLM_CHECK(!model_->has_linear_layers(), "speculative draft model '{}' has linear-attention layers, which a "
                "draft model cannot roll back yet; use a draft without them or the ngram method",
                options_.model);
  n_vocab_ = model_->config().n_vocab;
  PAGELLM_CHECK(n_vocab_ == target_n_vocab,
                "the draft model '{}' has {} output rows but the target model {}; speculative decoding needs the "
                "same vocabulary",
                options_.model, n_vocab_, target_n_vocab);
  const int32_t ctx = model_->config().n_ctx_train;
  max_len_ = ctx > 0 ? std::min(options_.max_model_len, ctx) : options_.max_model_len;
  model_->set_context_length(max_len_);
  backend_->allocate_kv_cache(model_->kv_cache_spec(options_.block_size, options_.num_blocks, options_.kv_cache_dtype));
  KVCacheConfig kc;
  kc.num_blocks = options_.num_blocks;
  kc.block_size = options_.block_size;
  kc.enable_prefix_caching = options_.enable_prefix_caching;
  kv_ = std::make_unique<KVCacheManager>(kc);
  runner_ = std::make_unique<ModelRunner>(*model_);
}

DraftModelProposer::~DraftModelProposer() = default;

std::string DraftModelProposer::describe() const {
  return fmt::format("draft model {} ({}; KV cache {} blocks x {} tokens; {})", options_.model,
                     model_->config().describe(), options_.num_blocks - 1, options_.block_size, backend_->describe());
}

std::string DraftModelProposer::profile_report() const {
  return fmt::format("draft model: {} passes, {} tokens, {:.1f} ms", passes_, tokens_,
                     static_cast<double>(forward_ns_) / 1e6);
}

void DraftModelProposer::release(SeqId seq) {
  kv_->free(seq);
  states_.erase(seq);
}

bool DraftModelProposer::allocate(SeqId id, int32_t computed, int32_t n, std::span<const DraftRequest> wanted,
                                  SlotAllocation& alloc) {
  if (auto a = kv_->allocate_slots(id, computed, n)) {
    alloc = std::move(*a);
    return true;
  }
  // Short of blocks: drop the caches of sequences that do not speculate now
  // (preempted or paused ones); their full blocks stay in the prefix cache.
  std::unordered_set<SeqId> keep;
  for (const DraftRequest& r : wanted) keep.insert(r.seq->id);
  for (auto it = states_.begin(); it != states_.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    kv_->free(it->first);
    it = states_.erase(it);
  }
  if (auto a = kv_->allocate_slots(id, computed, n)) {
    alloc = std::move(*a);
    return true;
  }
  return false;
}

bool DraftModelProposer::catch_up(const DraftRequest& r, State& st, std::span<const DraftRequest> wanted) {
  const std::vector<TokenId>& target = r.seq->token_ids;
  const int32_t len = r.seq->num_tokens();
  const SeqId id = r.seq->id;
  int32_t computed = 0;
  if (kv_->has_seq(id)) {
    // What the cache holds that the target kept: its tokens up to the first
    // rejected draft (the last target token is always fed again).
    const int32_t held = std::min(st.seq.num_computed_tokens, len - 1);
    computed = static_cast<int32_t>(
        std::mismatch(target.begin(), target.begin() + held, st.seq.token_ids.begin()).first - target.begin());
    kv_->truncate(id, computed);
    kv_->commit_computed(id, target, computed);
  } else {
    const PrefixMatch match = kv_->match_prefix(target);
    if (auto a = kv_->allocate_slots(id, match.num_tokens, 0, &match)) computed = match.num_tokens;
  }
  st.seq.id = id;
  st.seq.token_ids.assign(target.begin(), target.end());
  st.seq.num_prompt_tokens = r.seq->num_prompt_tokens;
  st.seq.num_computed_tokens = computed;
  SlotAllocation alloc;
  return allocate(id, computed, len - computed, wanted, alloc) && alloc.copies.empty();
}

TokenId DraftModelProposer::draw(const DraftRequest& r, const Sequence& seq, float* row, float* probs) {
  const SamplingParams& p = *r.params;
  const std::span<const TokenId> all(seq.token_ids);
  sampler_.process_logits(row, n_vocab_, p, all.first(seq.num_prompt_tokens), all.subspan(seq.num_prompt_tokens), {});
  if (p.temperature < kGreedyTemperature) return Sampler::argmax(row, n_vocab_);
  const Candidates c = sampler_.filter(row, n_vocab_, p);
  std::fill(probs, probs + n_vocab_, 0.0f);
  for (size_t i = 0; i < c.ids.size(); ++i) probs[c.ids[i]] = static_cast<float>(double(c.weights[i]) / c.total);
  return Sampler::draw(c, *r.rng);
}

void DraftModelProposer::propose(std::span<DraftRequest> requests) {
  trace::Scope scope("draft model", "engine");
  // Each request's draft budget, clamped to the positions the draft may use.
  std::vector<int32_t> budget(requests.size(), 0);
  std::vector<size_t> active;
  for (size_t i = 0; i < requests.size(); ++i) {
    DraftRequest& r = requests[i];
    r.tokens->clear();
    r.probs->clear();
    budget[i] = std::min(r.max_drafts, max_len_ - r.seq->num_tokens() + 1);
    if (budget[i] <= 0) continue;
    State& st = states_[r.seq->id];
    if (!catch_up(r, st, requests)) {
      release(r.seq->id);  // no room in the draft cache: no drafts this step
      continue;
    }
    active.push_back(i);
  }
  // Pass 1 computes what each sequence's cache misses and proposes its first
  // draft; pass j > 1 feeds draft j - 1 and proposes draft j.
  StepPlan plan;
  plan.block_size = options_.block_size;
  for (int32_t pass = 0; !active.empty(); ++pass) {
    plan.seqs.clear();
    for (size_t i : active) {
      State& st = states_.at(requests[i].seq->id);
      ScheduledSeq e;
      e.seq = &st.seq;
      e.seq_id = st.seq.id;
      e.start_pos = st.seq.num_computed_tokens;
      e.num_new_tokens = st.seq.num_tokens() - e.start_pos;
      e.block_table = kv_->block_table(st.seq.id);
      e.sample = true;
      plan.seqs.push_back(std::move(e));
    }
    const int64_t t0 = ThreadPool::now_ns();
    runner_->execute(plan, out_);
    const int64_t ns = ThreadPool::now_ns() - t0;
    forward_ns_ += ns;
    ++passes_;
    if (pass > 0) pass_seconds_ = pass_seconds_ > 0 ? 0.8 * pass_seconds_ + 0.2 * ns * 1e-9 : ns * 1e-9;
    std::vector<size_t> next;
    for (size_t k = 0; k < active.size(); ++k) {
      DraftRequest& r = requests[active[k]];
      State& st = states_.at(r.seq->id);
      tokens_ += plan.seqs[k].num_new_tokens;
      st.seq.num_computed_tokens = st.seq.num_tokens();
      const bool sampled = r.params->temperature >= kGreedyTemperature;
      if (sampled) r.probs->resize(r.probs->size() + static_cast<size_t>(n_vocab_));
      float* probs = sampled ? r.probs->data() + r.tokens->size() * static_cast<size_t>(n_vocab_) : nullptr;
      const TokenId d = draw(r, st.seq, const_cast<float*>(out_.row(k, 0, n_vocab_)), probs);
      st.seq.token_ids.push_back(d);
      r.tokens->push_back(d);
      if (static_cast<int32_t>(r.tokens->size()) >= budget[active[k]]) continue;
      SlotAllocation alloc;
      if (allocate(st.seq.id, st.seq.num_computed_tokens, 1, requests, alloc) && alloc.copies.empty())
        next.push_back(active[k]);
    }
    active.swap(next);
  }
}

}  // namespace pagellm
