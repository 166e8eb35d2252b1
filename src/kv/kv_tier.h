// The KV offload tier's stores: full KV blocks (their bytes, as the backend
// reads them out of the pool) kept outside the pool under their TierKey
// (kv/tier_key.h), so a prefix evicted from the pool, or computed before a
// restart, is loaded back instead of recomputed. Pure storage: no tensors,
// no requests; kv/kv_offload.h runs them on an I/O thread.
//
// Two stores behind one interface, both LRU and bounded in bytes:
//   HostKvTier  in memory (--kv-offload-host-gb);
//   DiskKvTier  one file per block under DIR/<fingerprint>/ (--kv-offload-dir,
//               --kv-offload-disk-gb). Its index is rebuilt at start by
//               reading each file's header, so it survives a restart.
//
// File format (little-endian), version 1:
//   header (kTierHeaderBytes): magic "PGLKVBLK", u32 version, u32 header
//     bytes, 16-byte fingerprint, 16-byte key, u32 block size (tokens), i32
//     group, u64 payload bytes, u64 payload checksum, u64 header checksum
//     (of the header before it and the tokens);
//   the block's token ids (i32 x block size);
//   the payload.
// A file whose magic, version, fingerprint, key (its name), sizes or
// checksums disagree is never loaded: it is deleted with a warning (at the
// scan, or when a load finds it bad). Only the current fingerprint's folder
// is read or written, so two models may share a DIR.
#pragma once

#include <cstdint>
#include <filesystem>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_types.h"
#include "kv/tier_key.h"

namespace pagellm {

inline constexpr uint32_t kTierFormatVersion = 1;
inline constexpr size_t kTierHeaderBytes = 96;

// One full block: its key, KV-cache group and tokens (checked on load) and bytes.
struct TierBlock {
  TierKey key;
  int32_t group = 0;
  std::vector<TokenId> tokens;
  std::vector<uint8_t> payload;
};

struct TierStats {
  int64_t blocks = 0, bytes = 0, capacity_bytes = 0;  // now
  int64_t stored_blocks = 0, stored_bytes = 0;        // put() that kept a block
  int64_t loaded_blocks = 0, loaded_bytes = 0;        // get() that returned one
  int64_t evicted_blocks = 0;
  int64_t rejected_files = 0;  // corrupt, truncated, tampered, foreign (disk)
  int64_t write_errors = 0;
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual const char* name() const = 0;  // "host", "disk": the metrics' tier label
  virtual bool contains(const TierKey& key) const = 0;
  // Keeps the block, evicting least recently used ones to stay within the
  // capacity. False when it cannot (bigger than the capacity; a write error).
  virtual bool put(const TierBlock& block) = 0;
  // The payload of the block stored under `key` whose tokens are `tokens`;
  // nothing when absent or (disk) found bad. A hit becomes the most recently used.
  virtual std::optional<std::vector<uint8_t>> get(const TierKey& key, std::span<const TokenId> tokens) = 0;
  virtual TierStats stats() const = 0;
};

class HostKvTier final : public KvTier {
 public:
  explicit HostKvTier(int64_t capacity_bytes);
  const char* name() const override { return "host"; }
  bool contains(const TierKey& key) const override;
  bool put(const TierBlock& block) override;
  std::optional<std::vector<uint8_t>> get(const TierKey& key, std::span<const TokenId> tokens) override;
  TierStats stats() const override;

 private:
  struct Entry {
    TierBlock block;
    std::list<TierKey>::iterator lru;
  };
  void evict_to(int64_t bytes);  // mu_ held
  mutable std::mutex mu_;
  int64_t capacity_;
  std::unordered_map<TierKey, Entry, TierKeyHash> map_;
  std::list<TierKey> lru_;  // least recently used first
  TierStats st_;
};

// The header and tokens of a block file (encode_tier_file writes them before
// the payload; decode_tier_header checks them).
std::vector<uint8_t> encode_tier_header(const TierKey& fingerprint, const TierBlock& block, uint64_t payload_checksum);
struct TierFileHeader {
  TierKey fingerprint, key;
  int32_t block_size = 0, group = 0;
  uint64_t payload_bytes = 0, payload_checksum = 0;
  std::vector<TokenId> tokens;
};
// Parses header + tokens from the first bytes of a file; nullopt with `why`
// set when they are not a valid version-1 header.
std::optional<TierFileHeader> decode_tier_header(std::span<const uint8_t> bytes, std::string& why);

class DiskKvTier final : public KvTier {
 public:
  // Opens (creating) dir/<fingerprint hex>/ and indexes its files: bad ones
  // are deleted with a warning, leftovers of unfinished writes removed, the
  // LRU order taken from the files' modification times. Throws Error when
  // the folder cannot be created or written.
  DiskKvTier(const std::filesystem::path& dir, int64_t capacity_bytes, const TierKey& fingerprint,
             int32_t block_size, size_t payload_bytes);
  const char* name() const override { return "disk"; }
  bool contains(const TierKey& key) const override;
  bool put(const TierBlock& block) override;
  std::optional<std::vector<uint8_t>> get(const TierKey& key, std::span<const TokenId> tokens) override;
  TierStats stats() const override;
  const std::filesystem::path& folder() const { return folder_; }
  // Blocks found at start (the restart's inheritance).
  int64_t indexed_at_start() const { return indexed_at_start_; }
  // After a write error the tier stops writing (reads go on).
  bool writable() const;

 private:
  struct Entry {
    int64_t bytes = 0;
    std::list<TierKey>::iterator lru;
  };
  std::filesystem::path path_of(const TierKey& key) const;
  void scan();
  void evict_to(int64_t bytes);  // mu_ held
  void drop(const TierKey& key, const char* why);  // bad file: warn, delete, forget

  std::filesystem::path folder_;
  int64_t capacity_;
  TierKey fingerprint_;
  int32_t block_size_;
  size_t payload_bytes_;
  int64_t file_bytes_;
  int64_t indexed_at_start_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<TierKey, Entry, TierKeyHash> map_;
  std::list<TierKey> lru_;
  TierStats st_;
  bool writable_ = true;
};

}  // namespace pagellm
