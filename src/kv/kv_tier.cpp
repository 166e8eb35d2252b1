#include "kv/kv_tier.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace fs = std::filesystem;

namespace pagellm {
namespace {

constexpr char kMagic[8] = {'P', 'G', 'L', 'K', 'V', 'B', 'L', 'K'};
constexpr size_t kHeaderChecksumAt = 72;
constexpr const char* kSuffix = ".kvb";

template <typename T>
void put_at(std::vector<uint8_t>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <typename T>
T get_at(std::span<const uint8_t> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

bool same_tokens(std::span<const TokenId> a, std::span<const TokenId> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Reads up to n bytes from the start of a file (fewer when it is shorter).
std::vector<uint8_t> read_prefix(const fs::path& p, size_t n) {
  std::vector<uint8_t> out(n);
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

std::optional<TierKey> key_from_name(const std::string& name) {
  if (name.size() != 32 + std::strlen(kSuffix) || !name.ends_with(kSuffix)) return std::nullopt;
  TierKey k;
  for (int i = 0; i < 32; ++i) {
    const char c = name[static_cast<size_t>(i)];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    uint64_t& half = i < 16 ? k.hi : k.lo;
    half = (half << 4) | static_cast<uint64_t>(d);
  }
  return k;
}

}  // namespace

// ---- host

HostKvTier::HostKvTier(int64_t capacity_bytes) : capacity_(capacity_bytes) {
  PAGELLM_CHECK(capacity_bytes > 0, "the host KV offload tier needs a capacity > 0");
  st_.capacity_bytes = capacity_bytes;
}

bool HostKvTier::contains(const TierKey& key) const {
  std::lock_guard lock(mu_);
  return map_.count(key) != 0;
}

void HostKvTier::evict_to(int64_t bytes) {
  while (st_.bytes > bytes && !lru_.empty()) {
    auto it = map_.find(lru_.front());
    st_.bytes -= static_cast<int64_t>(it->second.block.payload.size());
    --st_.blocks;
    ++st_.evicted_blocks;
    map_.erase(it);
    lru_.pop_front();
  }
}

bool HostKvTier::put(const TierBlock& block) {
  const auto size = static_cast<int64_t>(block.payload.size());
  std::lock_guard lock(mu_);
  if (size > capacity_) return false;
  if (map_.count(block.key)) return true;
  evict_to(capacity_ - size);
  lru_.push_back(block.key);
  map_.emplace(block.key, Entry{block, std::prev(lru_.end())});
  st_.bytes += size;
  ++st_.blocks;
  ++st_.stored_blocks;
  st_.stored_bytes += size;
  return true;
}

std::optional<std::vector<uint8_t>> HostKvTier::get(const TierKey& key, std::span<const TokenId> tokens) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end() || !same_tokens(it->second.block.tokens, tokens)) return std::nullopt;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  ++st_.loaded_blocks;
  st_.loaded_bytes += static_cast<int64_t>(it->second.block.payload.size());
  return it->second.block.payload;
}

TierStats HostKvTier::stats() const {
  std::lock_guard lock(mu_);
  return st_;
}

// ---- file format

std::vector<uint8_t> encode_tier_header(const TierKey& fingerprint, const TierBlock& block, uint64_t payload_checksum) {
  const size_t header_bytes = kTierHeaderBytes + block.tokens.size() * sizeof(TokenId);
  std::vector<uint8_t> h(header_bytes, 0);
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  put_at<uint32_t>(h, 8, kTierFormatVersion);
  put_at<uint32_t>(h, 12, static_cast<uint32_t>(header_bytes));
  put_at<uint64_t>(h, 16, fingerprint.hi);
  put_at<uint64_t>(h, 24, fingerprint.lo);
  put_at<uint64_t>(h, 32, block.key.hi);
  put_at<uint64_t>(h, 40, block.key.lo);
  put_at<uint32_t>(h, 48, static_cast<uint32_t>(block.tokens.size()));
  put_at<int32_t>(h, 52, block.group);
  put_at<uint64_t>(h, 56, block.payload.size());
  put_at<uint64_t>(h, 64, payload_checksum);
  std::memcpy(h.data() + kTierHeaderBytes, block.tokens.data(), block.tokens.size() * sizeof(TokenId));
  uint64_t sum = tier_checksum(h.data(), kHeaderChecksumAt);
  sum = tier_checksum(h.data() + kTierHeaderBytes, header_bytes - kTierHeaderBytes, sum);
  put_at<uint64_t>(h, kHeaderChecksumAt, sum);
  return h;
}

std::optional<TierFileHeader> decode_tier_header(std::span<const uint8_t> bytes, std::string& why) {
  if (bytes.size() < kTierHeaderBytes) {
    why = "truncated header";
    return std::nullopt;
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    why = "not a pagellm KV block file (bad magic)";
    return std::nullopt;
  }
  if (const auto v = get_at<uint32_t>(bytes, 8); v != kTierFormatVersion) {
    why = fmt::format("format version {} (this build reads {})", v, kTierFormatVersion);
    return std::nullopt;
  }
  TierFileHeader h;
  h.block_size = static_cast<int32_t>(get_at<uint32_t>(bytes, 48));
  const auto header_bytes = get_at<uint32_t>(bytes, 12);
  if (h.block_size <= 0 || h.block_size > 1024 ||
      header_bytes != kTierHeaderBytes + static_cast<size_t>(h.block_size) * sizeof(TokenId)) {
    why = "bad header size";
    return std::nullopt;
  }
  if (bytes.size() < header_bytes) {
    why = "truncated header";
    return std::nullopt;
  }
  uint64_t sum = tier_checksum(bytes.data(), kHeaderChecksumAt);
  sum = tier_checksum(bytes.data() + kTierHeaderBytes, header_bytes - kTierHeaderBytes, sum);
  if (sum != get_at<uint64_t>(bytes, kHeaderChecksumAt)) {
    why = "header checksum mismatch";
    return std::nullopt;
  }
  h.fingerprint = {get_at<uint64_t>(bytes, 16), get_at<uint64_t>(bytes, 24)};
  h.key = {get_at<uint64_t>(bytes, 32), get_at<uint64_t>(bytes, 40)};
  h.group = get_at<int32_t>(bytes, 52);
  h.payload_bytes = get_at<uint64_t>(bytes, 56);
  h.payload_checksum = get_at<uint64_t>(bytes, 64);
  h.tokens.resize(static_cast<size_t>(h.block_size));
  std::memcpy(h.tokens.data(), bytes.data() + kTierHeaderBytes, h.tokens.size() * sizeof(TokenId));
  return h;
}

// ---- disk

DiskKvTier::DiskKvTier(const fs::path& dir, int64_t capacity_bytes, const TierKey& fingerprint, int32_t block_size,
                       size_t payload_bytes)
    : folder_(dir / fingerprint.hex()),
      capacity_(capacity_bytes),
      fingerprint_(fingerprint),
      block_size_(block_size),
      payload_bytes_(payload_bytes),
      file_bytes_(static_cast<int64_t>(kTierHeaderBytes + static_cast<size_t>(block_size) * sizeof(TokenId) +
                                       payload_bytes)) {
  PAGELLM_CHECK(capacity_bytes > 0, "the disk KV offload tier needs a capacity > 0");
  std::error_code ec;
  fs::create_directories(folder_, ec);
  PAGELLM_CHECK(!ec && fs::is_directory(folder_), "cannot create the KV offload folder {}: {}", folder_.string(),
                ec ? ec.message() : "not a directory");
  PAGELLM_CHECK(::access(folder_.c_str(), W_OK | X_OK) == 0, "the KV offload folder {} is not writable: {}",
                folder_.string(), std::strerror(errno));
  st_.capacity_bytes = capacity_bytes;
  scan();
}

fs::path DiskKvTier::path_of(const TierKey& key) const { return folder_ / (key.hex() + kSuffix); }

void DiskKvTier::scan() {
  struct Found {
    TierKey key;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  const size_t header_bytes = kTierHeaderBytes + static_cast<size_t>(block_size_) * sizeof(TokenId);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".tmp-")) {  // a write that never finished
      fs::remove(e.path(), ec);
      continue;
    }
    const std::optional<TierKey> key = key_from_name(name);
    if (!key || !e.is_regular_file(ec)) {
      spdlog::warn("KV offload: skipping {} (not a block file)", e.path().string());
      continue;
    }
    std::string why;
    const std::vector<uint8_t> head = read_prefix(e.path(), header_bytes);
    const std::optional<TierFileHeader> h = decode_tier_header(head, why);
    if (h && h->fingerprint != fingerprint_) why = "another model or cache layout (fingerprint)";
    else if (h && h->key != *key) why = "its key differs from its name";
    else if (h && (h->block_size != block_size_ || h->payload_bytes != payload_bytes_)) why = "another block size";
    else if (h && static_cast<int64_t>(e.file_size(ec)) != file_bytes_) why = "truncated or padded";
    if (!why.empty()) {
      spdlog::warn("KV offload: ignoring and deleting {}: {}", e.path().string(), why);
      ++st_.rejected_files;
      fs::remove(e.path(), ec);
      continue;
    }
    found.push_back({*key, e.last_write_time(ec)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard lock(mu_);
  for (const Found& f : found) {
    lru_.push_back(f.key);
    map_.emplace(f.key, Entry{file_bytes_, std::prev(lru_.end())});
    st_.bytes += file_bytes_;
    ++st_.blocks;
  }
  evict_to(capacity_);  // a smaller --kv-offload-disk-gb than last time
  indexed_at_start_ = st_.blocks;
}

bool DiskKvTier::contains(const TierKey& key) const {
  std::lock_guard lock(mu_);
  return map_.count(key) != 0;
}

bool DiskKvTier::writable() const {
  std::lock_guard lock(mu_);
  return writable_;
}

void DiskKvTier::evict_to(int64_t bytes) {
  std::error_code ec;
  while (st_.bytes > bytes && !lru_.empty()) {
    const TierKey k = lru_.front();
    lru_.pop_front();
    auto it = map_.find(k);
    st_.bytes -= it->second.bytes;
    --st_.blocks;
    ++st_.evicted_blocks;
    map_.erase(it);
    fs::remove(path_of(k), ec);
  }
}

void DiskKvTier::drop(const TierKey& key, const char* why) {
  spdlog::warn("KV offload: ignoring and deleting {}: {}", path_of(key).string(), why);
  std::error_code ec;
  fs::remove(path_of(key), ec);
  std::lock_guard lock(mu_);
  ++st_.rejected_files;
  auto it = map_.find(key);
  if (it == map_.end()) return;
  st_.bytes -= it->second.bytes;
  --st_.blocks;
  lru_.erase(it->second.lru);
  map_.erase(it);
}

bool DiskKvTier::put(const TierBlock& block) {
  PAGELLM_CHECK(block.payload.size() == payload_bytes_ && static_cast<int32_t>(block.tokens.size()) == block_size_,
                "KV offload: a block of {} bytes and {} tokens for a tier of {} and {}", block.payload.size(),
                block.tokens.size(), payload_bytes_, block_size_);
  {
    std::lock_guard lock(mu_);
    if (!writable_ || file_bytes_ > capacity_) return false;
    if (map_.count(block.key)) return true;
    evict_to(capacity_ - file_bytes_);
  }
  const std::vector<uint8_t> header =
      encode_tier_header(fingerprint_, block, tier_checksum(block.payload.data(), block.payload.size()));
  // Written under a temporary name and renamed: a reader (or the next start)
  // never sees half a file under a block's name.
  const fs::path final_path = path_of(block.key);
  const fs::path tmp = folder_ / fmt::format(".tmp-{}-{}", block.key.hex(), ::getpid());
  bool ok = false;
  if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    ok = std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
         std::fwrite(block.payload.data(), 1, block.payload.size(), f) == block.payload.size();
    ok = std::fclose(f) == 0 && ok;
  }
  const int err = errno;
  std::error_code ec;
  if (ok) {
    fs::rename(tmp, final_path, ec);
    ok = !ec;
  }
  std::lock_guard lock(mu_);
  if (!ok) {
    fs::remove(tmp, ec);
    ++st_.write_errors;
    if (writable_)
      spdlog::warn("KV offload: cannot write {} ({}); the disk tier stops storing blocks, serving goes on",
                   final_path.string(), ec ? ec.message() : std::strerror(err));
    writable_ = false;
    return false;
  }
  lru_.push_back(block.key);
  map_.emplace(block.key, Entry{file_bytes_, std::prev(lru_.end())});
  st_.bytes += file_bytes_;
  ++st_.blocks;
  ++st_.stored_blocks;
  st_.stored_bytes += file_bytes_;
  return true;
}

std::optional<std::vector<uint8_t>> DiskKvTier::get(const TierKey& key, std::span<const TokenId> tokens) {
  if (!contains(key)) return std::nullopt;
  const fs::path p = path_of(key);
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(p, std::ios::binary);
    if (in) {
      bytes.resize(static_cast<size_t>(file_bytes_) + 1);  // one more: a longer file is bad too
      in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      bytes.resize(static_cast<size_t>(in.gcount()));
    }
  }
  if (bytes.empty()) {  // gone (deleted by hand): forget it
    drop(key, "the file is gone or unreadable");
    return std::nullopt;
  }
  std::string why;
  const std::optional<TierFileHeader> h = decode_tier_header(bytes, why);
  const size_t header_bytes = kTierHeaderBytes + static_cast<size_t>(block_size_) * sizeof(TokenId);
  if (h && (h->fingerprint != fingerprint_ || h->key != key)) why = "another model, cache layout or key";
  else if (h && (h->block_size != block_size_ || h->payload_bytes != payload_bytes_)) why = "another block size";
  else if (h && static_cast<int64_t>(bytes.size()) != file_bytes_) why = "truncated or padded";
  else if (h && tier_checksum(bytes.data() + header_bytes, payload_bytes_) != h->payload_checksum)
    why = "payload checksum mismatch";
  if (!why.empty()) {
    drop(key, why.c_str());
    return std::nullopt;
  }
  if (!same_tokens(h->tokens, tokens)) return std::nullopt;  // a key collision: a miss, the file stays
  std::error_code ec;
  fs::last_write_time(p, fs::file_time_type::clock::now(), ec);  // the LRU order a restart reads
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
  ++st_.loaded_blocks;
  st_.loaded_bytes += file_bytes_;
  return std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes), bytes.end());
}

TierStats DiskKvTier::stats() const {
  std::lock_guard lock(mu_);
  return st_;
}

}  // namespace pagellm
