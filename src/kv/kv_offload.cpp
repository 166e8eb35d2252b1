#include "kv/kv_offload.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/util.h"

namespace pagellm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

KvOffload::KvOffload(const KvOffloadConfig& config) : config_(config) {
  PAGELLM_CHECK(config.block_bytes > 0 && config.block_size > 0, "KV offload: empty blocks");
  PAGELLM_CHECK(config.host_bytes >= 0 && config.disk_bytes >= 0, "KV offload: negative capacity");
  if (config.host_bytes > 0) {
    tiers_.push_back(std::make_unique<HostKvTier>(config.host_bytes));
    host_ = tiers_.back().get();
  }
  if (!config.disk_dir.empty()) {
    PAGELLM_CHECK(config.disk_bytes > 0, "--kv-offload-dir needs --kv-offload-disk-gb > 0");
    try {
      auto disk = std::make_unique<DiskKvTier>(config.disk_dir, config.disk_bytes, config.fingerprint,
                                               config.block_size, config.block_bytes);
      disk_at_start_ = disk->indexed_at_start();
      tiers_.push_back(std::move(disk));
    } catch (const Error& e) {
      spdlog::warn("KV offload: the disk tier is off ({}); serving goes on without it", e.what());
    }
  }
  if (enabled()) thread_ = std::thread([this] { run(); });
}

KvOffload::~KvOffload() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool KvOffload::contains(const TierKey& key) const {
  {
    std::lock_guard lock(mu_);
    if (queued_.count(key)) return true;
  }
  for (const auto& t : tiers_)
    if (t->contains(key)) return true;
  return false;
}

void KvOffload::store(TierBlock block) {
  if (!enabled()) return;
  const auto size = static_cast<int64_t>(block.payload.size());
  {
    std::lock_guard lock(mu_);
    if (pending_bytes_ + size > config_.max_pending_bytes) {
      ++dropped_;
      return;
    }
    pending_bytes_ += size;
    ++queued_[block.key];
    stores_.push_back(std::move(block));
  }
  wake_.notify_one();
}

std::shared_ptr<TierLoad> KvOffload::load(std::vector<TierBlock> blocks) {
  auto job = std::make_shared<TierLoad>();
  job->blocks = std::move(blocks);
  if (!enabled()) {
    job->done = true;
    return job;
  }
  {
    std::lock_guard lock(mu_);
    loads_.push_back(job);
  }
  wake_.notify_one();
  return job;
}

void KvOffload::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return (stores_.empty() && loads_.empty() && !busy_) || !thread_.joinable(); });
}

uint64_t KvOffload::loads_done() const {
  std::lock_guard lock(mu_);
  return loads_done_;
}

void KvOffload::wait_for_loads(uint64_t seen, int milliseconds) const {
  std::unique_lock lock(mu_);
  loaded_.wait_for(lock, std::chrono::milliseconds(milliseconds), [&] { return loads_done_ > seen; });
}

void KvOffload::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !loads_.empty() || !stores_.empty(); });
    // Loads first: a request waits for them. At stop, the queued stores are
    // still written (a restart finds them).
    if (!loads_.empty()) {
      std::shared_ptr<TierLoad> job = std::move(loads_.front());
      loads_.pop_front();
      busy_ = true;
      lock.unlock();
      const auto t = std::chrono::steady_clock::now();
      do_load(*job);
      job->done = true;
      lock.lock();
      load_s_ += seconds_since(t);
      ++loads_done_;
      loaded_.notify_all();
    } else if (!stores_.empty()) {
      TierBlock block = std::move(stores_.front());
      stores_.pop_front();
      busy_ = true;
      lock.unlock();
      const auto t = std::chrono::steady_clock::now();
      do_store(block);
      lock.lock();
      store_s_ += seconds_since(t);
      pending_bytes_ -= static_cast<int64_t>(block.payload.size());
      if (--queued_[block.key] == 0) queued_.erase(block.key);
    } else if (stop_) {
      break;
    }
    busy_ = false;
    if (stores_.empty() && loads_.empty()) idle_.notify_all();
  }
  busy_ = false;
  idle_.notify_all();
}

void KvOffload::do_load(TierLoad& load) {
  for (TierBlock& b : load.blocks) {
    for (const auto& t : tiers_) {
      std::optional<std::vector<uint8_t>> got = t->get(b.key, b.tokens);
      if (!got) continue;
      b.payload = std::move(*got);
      if (host_ && t.get() != host_) host_->put(b);  // the next hit stays in memory
      break;
    }
    if (b.payload.empty()) {
      // Loads go before stores: a block may still wait in the store queue.
      std::lock_guard lock(mu_);
      if (!queued_.count(b.key)) continue;
      for (const TierBlock& q : stores_)
        if (q.key == b.key && q.tokens == b.tokens) {
          b.payload = q.payload;
          break;
        }
    }
  }
}

void KvOffload::do_store(const TierBlock& block) {
  for (const auto& t : tiers_) t->put(block);
}

KvOffloadStats KvOffload::stats() const {
  KvOffloadStats s;
  for (const auto& t : tiers_) s.tiers.emplace_back(t->name(), t->stats());
  std::lock_guard lock(mu_);
  s.dropped_stores = dropped_;
  s.pending_stores = static_cast<int64_t>(stores_.size());
  s.store_seconds = store_s_;
  s.load_seconds = load_s_;
  s.disk_blocks_at_start = disk_at_start_;
  return s;
}

std::string KvOffload::describe() const {
  std::string out;
  for (const auto& t : tiers_) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", t->name(), format_bytes(t->stats().capacity_bytes));
    if (const auto* d = dynamic_cast<const DiskKvTier*>(t.get()))
      out += fmt::format(" in {} ({} blocks found)", d->folder().string(), d->indexed_at_start());
  }
  return out;
}

}  // namespace pagellm
