// KV cache events for cache-aware routing, in vLLM's shape
// (vllm/distributed/kv_events.py): which full blocks the prefix cache can
// serve, named by their chain hash. A router that follows a replica's events
// knows which prompt prefixes that replica would find cached.
//
//   BlockStored       full blocks just registered (findable by a prefix
//                     lookup): a chain of hashes, the first one's parent
//                     (none for a sequence's first block), their token ids;
//   BlockRemoved      registered blocks whose contents are gone (evicted for
//                     new contents);
//   AllBlocksCleared  forget everything stored before.
//
// The pool records plain structs (off unless asked for: no cost then); the
// engine drains them after each step into a KvEventLog, which subscribers
// (GET /v1/kv_events) read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_types.h"

namespace pagellm {

enum class KvEventType : uint8_t { BlockStored, BlockRemoved, AllBlocksCleared };
const char* kv_event_type_name(KvEventType type);

struct KvEvent {
  KvEventType type = KvEventType::BlockStored;
  std::vector<BlockHash> block_hashes;         // Stored: a chain, parent first
  std::optional<BlockHash> parent_block_hash;  // Stored: the first block's parent
  std::vector<TokenId> token_ids;              // Stored: block_size per hash
  int32_t block_size = 0;                      // Stored
  uint64_t lora_id = 0;                        // Stored: 0 is the base model (vLLM: null)
  std::string medium;                          // where the blocks live: "GPU", "CPU", "DISK"
};

inline KvEvent kv_event(KvEventType type) {
  KvEvent e;
  e.type = type;
  return e;
}

// Events of one engine step, or a snapshot for a subscriber that (re)starts.
struct KvEventBatch {
  uint64_t seq = 0;  // 1, 2, ... per published batch; a snapshot has the seq it is current at
  double ts = 0;     // seconds since the epoch
  std::vector<KvEvent> events;
};

// What /metrics shows of a KvEventLog (EngineStats::kv_events).
struct KvEventCounts {
  bool enabled = false;  // --kv-events
  uint64_t published = 0, dropped = 0, resyncs = 0;
  size_t stored_blocks = 0;
  int64_t subscribers = 0;
};

// The engine's published events: a bounded window of recent batches and the
// set of blocks stored right now (the state those batches lead to), so that a
// subscriber that starts late, or falls out of the window, resynchronizes
// from a snapshot (AllBlocksCleared, then one BlockStored per stored block)
// instead of holding the engine up. Thread-safe; publish never waits for a
// reader.
class KvEventLog {
 public:
  // capacity: blocks the window holds (a BlockStored of 5 blocks counts 5,
  // any other event 1); the oldest batches go first. At least 1.
  explicit KvEventLog(size_t capacity);

  // The step thread: one batch (no-op when `events` is empty).
  void publish(std::vector<KvEvent> events);

  // Where a reader is: the last batch it has, and how many events it makes.
  struct Cursor {
    bool started = false;  // false: a new reader
    uint64_t seq = 0;
    uint64_t events = 0;
  };
  struct Read {
    std::vector<KvEventBatch> batches;
    Cursor cursor;         // pass it to the next read
    bool resync = false;   // batches[0] is a snapshot
    uint64_t missed = 0;   // events this reader lost to the window's end
  };
  // A reader's batches after `cursor` (the previous Read's; a new reader gets
  // a snapshot first, as does one the window has left behind). Waits up to
  // `timeout` when there is nothing new.
  Read read(Cursor cursor, std::chrono::milliseconds timeout);

  // Counters for /metrics.
  uint64_t published_events() const;
  uint64_t dropped_events() const;  // missed by readers that fell behind
  uint64_t resyncs() const;
  size_t stored_blocks() const;
  // Readers streaming now (the server counts them in and out).
  void add_subscriber(int delta) { subscribers_ += delta; }
  KvEventCounts counts() const;

 private:
  struct Stored {
    std::optional<BlockHash> parent;
    std::vector<TokenId> tokens;
    int32_t block_size = 0;
    uint64_t lora_id = 0;
    std::string medium;
  };
  struct Entry {
    KvEventBatch batch;
    size_t weight = 0;
    uint64_t events_before = 0;  // events published before this batch
  };
  void apply_locked(const KvEvent& e);
  KvEventBatch snapshot_locked() const;

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> window_;
  size_t weight_ = 0;
  uint64_t last_seq_ = 0;
  uint64_t published_ = 0, dropped_ = 0, resyncs_ = 0;
  std::atomic<int64_t> subscribers_{0};
  // (medium, hash) -> block: one map per medium, since a tier can hold the
  // block the pool holds too.
  std::unordered_map<std::string, std::unordered_map<BlockHash, Stored>> stored_;
};

}  // namespace pagellm
