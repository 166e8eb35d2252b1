// KvOffload: the KV offload tiers (kv/kv_tier.h) behind one I/O thread.
// The engine hands it copies of full blocks as they are committed
// (write-through: a block evicted from the pool later needs no copy), and
// asks it to load the blocks a new prompt's prefix has in a tier; both run
// on the I/O thread, loads before stores, so the step loop never waits for
// a disk. Lookups go to the host tier first, then the disk; a block read
// from disk is kept in the host tier too.
//
// Stores are dropped (and counted) when more than max_pending_bytes wait:
// the tier then misses blocks, the output never changes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/kv_tier.h"

namespace pagellm {

struct KvOffloadConfig {
  int64_t host_bytes = 0;  // 0: no host tier
  std::string disk_dir;    // empty: no disk tier
  int64_t disk_bytes = 0;
  TierKey fingerprint;     // the engine's (engine/kv_fingerprint.h)
  int32_t block_size = 16;
  size_t block_bytes = 0;  // one block's payload
  int64_t max_pending_bytes = int64_t{256} << 20;
};

struct KvOffloadStats {
  std::vector<std::pair<std::string, TierStats>> tiers;  // in lookup order
  int64_t dropped_stores = 0;
  int64_t pending_stores = 0;
  double store_seconds = 0, load_seconds = 0;  // I/O thread time
  int64_t disk_blocks_at_start = 0;
};

// A load in flight: the blocks asked for (key, group, tokens); once done,
// each one's payload, empty where no tier had it (or its file was bad).
struct TierLoad {
  std::vector<TierBlock> blocks;
  std::atomic<bool> done{false};
};

class KvOffload {
 public:
  // Opens the tiers. A disk tier that cannot be opened (folder not
  // creatable, not writable) is left out with a warning; throws Error only
  // for bad settings. enabled() says whether any tier is left.
  explicit KvOffload(const KvOffloadConfig& config);
  ~KvOffload();  // finishes the stores queued so far (a restart finds them), then stops

  bool enabled() const { return !tiers_.empty(); }
  const KvOffloadConfig& config() const { return config_; }
  // In a tier (or queued to be stored).
  bool contains(const TierKey& key) const;
  void store(TierBlock block);
  std::shared_ptr<TierLoad> load(std::vector<TierBlock> blocks);
  // Waits until every queued store is done (tests, shutdown).
  void flush();
  // Loads finished so far; wait_for_loads waits (up to the timeout) until
  // more than `seen` have finished.
  uint64_t loads_done() const;
  void wait_for_loads(uint64_t seen, int milliseconds) const;
  KvOffloadStats stats() const;
  // "host 4.0 GiB, disk 20.0 GiB in DIR (123 blocks found)": for the start-up log.
  std::string describe() const;

 private:
  void run();
  void do_load(TierLoad& load);
  void do_store(const TierBlock& block);

  KvOffloadConfig config_;
  std::vector<std::unique_ptr<KvTier>> tiers_;  // host first
  KvTier* host_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  mutable std::condition_variable loaded_;
  uint64_t loads_done_ = 0;
  std::deque<std::shared_ptr<TierLoad>> loads_;
  std::deque<TierBlock> stores_;
  std::unordered_map<TierKey, int, TierKeyHash> queued_;  // keys in stores_
  int64_t pending_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  int64_t dropped_ = 0;
  double store_s_ = 0, load_s_ = 0;
  int64_t disk_at_start_ = 0;
  std::thread thread_;
};

}  // namespace pagellm
