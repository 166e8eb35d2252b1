#include "engine/prefix_tier.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/util.h"
#include "engine/kv_fingerprint.h"
#include "engine/lora_registry.h"

namespace pagellm {
namespace {

// A pinned prefix whose sequence is not admitted within this many of its
// scheduler's steps goes back to the pool's LRU (it stays findable there).
constexpr int32_t kMaxPinSteps = 32;
// Sequences this close to the head of a scheduler's waiting queue have
// blocks the pool lacks loaded from the tier.
constexpr int32_t kPrefetchDepth = 4;
// A waiting sequence's loaded blocks that find no room in the pool are kept
// (not read again) and offered to the pool at each of this many steps; then
// dropped, and the sequence is not prefetched again for as many steps. Under
// pressure the same blocks were otherwise read from disk at every step.
constexpr int32_t kPrefetchRetrySteps = 16;

// Fresh blocks an import may take now: only free or evictable ones, less a
// reserve of two per running sequence (their next blocks: under overload an
// import must not preempt what runs), and pins hold at most half the pool.
int32_t import_room(const Scheduler& s) {
  const KVCacheManager& kv = s.kv();
  return std::min(kv.num_available_blocks() - 2 * s.num_running(), kv.num_usable_blocks() / 2 - kv.num_pinned_blocks());
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::unique_ptr<PrefixTier> PrefixTier::create(const EngineConfig& c, Model& model, const KVCacheConfig& kv,
                                               const SchedulerConfig& sched, ModelRunner& runner, bool parallel,
                                               const LoraRegistry* lora) {
  if (c.kv_offload_host_bytes <= 0 && c.kv_offload_dir.empty()) return nullptr;
  const auto off = [](const std::string& why) {
    spdlog::warn("KV offload tier is off: {}", why);
    return nullptr;
  };
  if (model.has_linear_layers())
    return off(fmt::format("{}'s linear-attention states are not cached by prefix", arch_name(model.config().arch)));
  if (model.config().non_causal) return off("an encoder's blocks are never taken from the prefix cache");
  if (!kv.enable_prefix_caching) return off("prefix caching is off");
  if (parallel) return off("not under tensor or pipeline parallelism yet");
  if (c.speculative.method == SpecMethod::DraftModel) return off("a draft model's own KV cache is not stored in it");
  if (sched.kv_eviction != KvEviction::None) return off("with --kv-eviction sliding a block sees only a window");
  Backend& backend = model.backend();
  if (!runner.has_kv_block_io())
    return off(fmt::format("the {} backend cannot copy KV blocks to host memory", backend.name()));
  const KVCacheSpec& spec = backend.kv_cache_spec();
  KvOffloadConfig oc;
  oc.host_bytes = c.kv_offload_host_bytes;
  oc.disk_dir = c.kv_offload_dir;
  oc.disk_bytes = c.kv_offload_disk_bytes;
  oc.block_size = spec.block_size;
  oc.block_bytes = spec.bytes_per_block();
  try {
    // The backend's bytes per block must be the spec's (block 0 is the padding block).
    std::vector<uint8_t> probe(oc.block_bytes);
    const BlockId null_block = kNullBlock;
    runner.read_kv_blocks({&null_block, 1}, 0, probe.data());
  } catch (const Error& e) {
    return off(e.what());
  }
  oc.fingerprint = engine_kv_fingerprint(c, spec, kv.groups, sched.max_model_len, backend.name());
  auto offload = std::make_unique<KvOffload>(oc);
  if (!offload->enabled()) return off("no tier could be opened");
  spdlog::info("KV offload tier: {}; {} per block{}", offload->describe(), format_bytes(static_cast<int64_t>(oc.block_bytes)),
               kv.groups.size() > 1 ? fmt::format(", each of the {} KV-cache groups' blocks stored apart", kv.groups.size())
                                    : std::string());
  return std::unique_ptr<PrefixTier>(new PrefixTier(std::move(offload), runner, lora, spec.block_size));
}

PrefixTier::PrefixTier(std::unique_ptr<KvOffload> offload, ModelRunner& runner, const LoraRegistry* lora,
                       int32_t block_size)
    : offload_(std::move(offload)), runner_(runner), lora_(lora), block_size_(block_size) {}

uint64_t PrefixTier::adapter_fingerprint(int32_t lora_id) {
  if (lora_id == 0) return 0;
  auto it = adapter_fps_.find(lora_id);
  if (it != adapter_fps_.end()) return it->second;
  // An adapter is its file(s); an unknown one (cannot happen) gets its id mixed
  // with a per-process value, so its blocks are never found by another run.
  const std::string path = lora_ ? lora_->path_of(lora_id) : std::string();
  uint64_t fp = path.empty() ? 0 : path_fingerprint(path);
  if (fp == 0) fp = mix64(static_cast<uint64_t>(lora_id) ^ reinterpret_cast<uintptr_t>(this)) | 1;
  adapter_fps_.emplace(lora_id, fp);
  return fp;
}

void PrefixTier::extend_chain(const Sequence& seq, int32_t n, std::vector<TierKey>& chain) {
  if (chain.empty() && n > 0) {
    const TierKey root = tier_root(fingerprint(), adapter_fingerprint(seq.lora_id));
    chain.push_back(tier_next(root, std::span(seq.token_ids).subspan(0, static_cast<size_t>(block_size_))));
  }
  for (auto i = static_cast<int32_t>(chain.size()); i < n; ++i)
    chain.push_back(tier_next(chain.back(), std::span(seq.token_ids)
                                                .subspan(static_cast<size_t>(i) * block_size_, block_size_)));
}

std::vector<TierKey> PrefixTier::chain_keys(const Sequence& seq, int32_t n) {
  std::vector<TierKey> chain;
  extend_chain(seq, n, chain);
  return chain;
}

void PrefixTier::store_committed(Scheduler& scheduler, int32_t block_shift, const SeqOwners& owners) {
  const std::vector<CommittedBlock> committed = scheduler.take_committed_blocks();
  if (committed.empty()) return;
  const auto t = std::chrono::steady_clock::now();
  const size_t bytes = offload_->config().block_bytes;
  SeqId current = 0;
  const Sequence* seq = nullptr;
  std::vector<TierKey> chain;
  std::vector<TierBlock> out;
  std::vector<BlockId> ids;
  for (const CommittedBlock& c : committed) {
    if (!seq || c.seq != current) {
      current = c.seq;
      chain.clear();
      const auto it = owners.find(c.seq);
      seq = it == owners.end() ? nullptr : it->second.first->samples[static_cast<size_t>(it->second.second)].seq.get();
    }
    if (!seq || int64_t{c.index + 1} * block_size_ > seq->num_tokens()) continue;
    extend_chain(*seq, c.index + 1, chain);
    TierBlock b;
    b.key = tier_group_key(chain[static_cast<size_t>(c.index)], c.group);
    if (offload_->contains(b.key)) continue;
    b.group = c.group;
    const auto* first = seq->token_ids.data() + static_cast<size_t>(c.index) * block_size_;
    b.tokens.assign(first, first + block_size_);
    out.push_back(std::move(b));
    ids.push_back(c.block);
  }
  if (!out.empty()) {
    // One backend call for the step's blocks (a device backend: one transfer).
    std::vector<uint8_t> all(ids.size() * bytes);
    runner_.read_kv_blocks(ids, block_shift, all.data());
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].payload.assign(all.begin() + static_cast<std::ptrdiff_t>(i * bytes),
                            all.begin() + static_cast<std::ptrdiff_t>((i + 1) * bytes));
      offload_->store(std::move(out[i]));
    }
  }
  st_.copy_out_seconds += seconds_since(t);
}

bool PrefixTier::begin_load(Sequence& seq, const Scheduler& scheduler, int32_t ve) {
  return start_load(seq, scheduler.kv(), ve, false);
}

bool PrefixTier::waits(const Sequence& seq) {
  return seq.status == SeqStatus::Waiting || seq.status == SeqStatus::Preempted;
}

void PrefixTier::prefetch_waiting(const Scheduler& scheduler, int32_t ve) {
  int32_t looked = 0;
  for (Sequence* seq : scheduler.waiting()) {
    if (++looked > kPrefetchDepth) break;
    if (!waits(*seq) || pins_.count(seq->id) || backoff_.count(seq->id) ||
        std::any_of(loads_.begin(), loads_.end(), [&](const Load& l) { return l.seq == seq; }))
      continue;
    start_load(*seq, scheduler.kv(), ve, true);
  }
}

bool PrefixTier::start_load(Sequence& seq, const KVCacheManager& kv, int32_t ve, bool resident) {
  if (seq.needs_every_prompt_position() || !kv.prefix_caching()) return false;
  const int32_t bs = block_size_;
  const int32_t limit = (seq.num_tokens() - 1) / bs;  // the last token is always computed
  if (limit <= 0) return false;
  const int32_t pooled = kv.match_prefix(seq.token_ids, static_cast<uint64_t>(seq.lora_id)).num_tokens / bs;
  const std::vector<TierKey> chain = chain_keys(seq, limit);
  int32_t n = pooled;
  while (n < limit && offload_->contains(chain[static_cast<size_t>(n)])) ++n;
  // A sliding group needs the blocks its window sees from the prefix's end.
  auto windows_held = [&](int32_t m) {
    for (int g = 1; g < kv.num_groups(); ++g)
      for (int32_t i = kv.first_visible_block(g, m * bs); i < m; ++i)
        if (!offload_->contains(tier_group_key(chain[static_cast<size_t>(i)], g))) return false;
    return true;
  };
  while (n > pooled && !windows_held(n)) --n;
  if (n <= pooled) return false;
  Load load;
  load.seq = &seq;
  load.ve = ve;
  load.max_blocks = n;
  load.resident = resident;
  std::vector<TierBlock> want;
  auto ask = [&](int g, int32_t i) {
    TierBlock b;
    b.key = tier_group_key(chain[static_cast<size_t>(i)], g);
    b.group = g;
    const auto* first = seq.token_ids.data() + static_cast<size_t>(i) * bs;
    b.tokens.assign(first, first + bs);
    want.push_back(std::move(b));
    load.index.push_back(i);
  };
  for (int32_t i = pooled; i < n; ++i) ask(0, i);
  for (int g = 1; g < kv.num_groups(); ++g)
    for (int32_t i = kv.first_visible_block(g, n * bs); i < n; ++i) ask(g, i);
  load.job = offload_->load(std::move(want));
  loads_.push_back(std::move(load));
  return true;
}

std::vector<Sequence*> PrefixTier::take_ready(std::span<const std::unique_ptr<Scheduler>> schedulers,
                                              std::span<const int32_t> block_shifts) {
  std::vector<Sequence*> ready;
  std::vector<Load> still;
  for (Load& l : loads_) {
    if (!l.job->done) {
      still.push_back(std::move(l));
      continue;
    }
    // A sequence admitted before its load was done computed the blocks itself.
    if (l.resident && !waits(*l.seq)) continue;
    Scheduler& s = *schedulers[static_cast<size_t>(l.ve)];
    std::map<std::pair<int, int32_t>, const TierBlock*> got;
    for (size_t k = 0; k < l.job->blocks.size(); ++k)
      if (!l.job->blocks[k].payload.empty()) got[{l.job->blocks[k].group, l.index[k]}] = &l.job->blocks[k];
    // The prefix the loaded blocks continue without a gap.
    int32_t reachable = l.index.empty() ? 0 : l.index.front();
    while (reachable < l.max_blocks && got.count({0, reachable})) ++reachable;
    const auto t = std::chrono::steady_clock::now();
    const PrefixImport imp = s.import_prefix(
        l.seq->token_ids, static_cast<uint64_t>(l.seq->lora_id), l.max_blocks,
        [&](int g, int32_t i) { return got.count({g, i}) > 0; }, std::max(0, import_room(s)));
    if (!imp.fills.empty()) {
      const size_t bytes = offload_->config().block_bytes;
      std::vector<BlockId> ids;
      std::vector<uint8_t> all(imp.fills.size() * bytes);
      for (const PrefixImport::Fill& f : imp.fills) {
        const std::vector<uint8_t>& p = got.at({f.group, f.index})->payload;
        std::copy(p.begin(), p.end(), all.begin() + static_cast<std::ptrdiff_t>(ids.size() * bytes));
        ids.push_back(f.block);
        if (f.group == 0) st_.hit_tokens += block_size_;
      }
      runner_.write_kv_blocks(ids, block_shifts[static_cast<size_t>(l.ve)], all.data());
    }
    st_.imported_blocks += static_cast<int64_t>(imp.fills.size());
    st_.copy_in_seconds += seconds_since(t);
    if (imp.pin >= 0) {
      if (auto old = pins_.find(l.seq->id); old != pins_.end()) s.unpin_prefix(old->second.pin);
      pins_[l.seq->id] = Pin{l.seq, l.ve, imp.pin, 0};
    }
    if (!l.resident) {
      ready.push_back(l.seq);  // it waits in its scheduler from now on
      l.resident = true;
    }
    if (imp.num_blocks >= reachable) continue;
    // No room for all of them yet: keep the bytes for the next steps (a few
    // sequences' worth: the others are loaded again near the queue's head).
    const auto kept = std::count_if(still.begin(), still.end(), [](const Load& k) { return k.job->done.load(); });
    if (++l.retries <= kPrefetchRetrySteps && kept < kPrefetchDepth) still.push_back(std::move(l));
    else backoff_[l.seq->id] = {l.ve, kPrefetchRetrySteps};
  }
  loads_ = std::move(still);
  return ready;
}

void PrefixTier::wait_for_load(int milliseconds) const {
  const uint64_t seen = offload_->loads_done();
  for (const Load& l : loads_)
    if (l.job->done) return;
  offload_->wait_for_loads(seen, milliseconds);
}

void PrefixTier::after_schedule(Scheduler& scheduler, int32_t ve) {
  for (auto it = backoff_.begin(); it != backoff_.end();) {
    if (it->second.first != ve) {
      ++it;
      continue;
    }
    const bool waiting = std::any_of(scheduler.waiting().begin(), scheduler.waiting().end(),
                                     [&](const Sequence* s) { return s->id == it->first; });
    it = !waiting || --it->second.second <= 0 ? backoff_.erase(it) : std::next(it);
  }
  for (auto it = pins_.begin(); it != pins_.end();) {
    Pin& p = it->second;
    if (p.ve == ve && (!waits(*p.seq) || ++p.steps > kMaxPinSteps)) {
      scheduler.unpin_prefix(p.pin);
      it = pins_.erase(it);
    } else {
      ++it;
    }
  }
}

void PrefixTier::forget(SeqId seq, std::span<const std::unique_ptr<Scheduler>> schedulers) {
  std::erase_if(loads_, [&](const Load& l) { return l.seq->id == seq; });
  backoff_.erase(seq);
  const auto it = pins_.find(seq);
  if (it == pins_.end()) return;
  schedulers[static_cast<size_t>(it->second.ve)]->unpin_prefix(it->second.pin);
  pins_.erase(it);
}

KvTierReport PrefixTier::stats() const {
  KvTierReport s = st_;
  s.enabled = true;
  s.offload = offload_->stats();
  return s;
}

}  // namespace pagellm
