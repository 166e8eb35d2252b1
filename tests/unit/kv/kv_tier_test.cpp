// The KV offload tier's stores (kv/kv_tier.h, kv/kv_offload.h): LRU by
// bytes, the disk tier's index surviving a restart, and every kind of bad
// file (corrupt, truncated, tampered, foreign, another version) ignored and
// deleted, never loaded; an unwritable folder turns the disk tier off.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "kv/kv_offload.h"
#include "kv/kv_tier.h"
#include "kv/tier_key.h"

namespace fs = std::filesystem;

namespace pagellm {
namespace {

constexpr int32_t kBs = 16;
constexpr size_t kPayload = 1000;
const TierKey kFp{0x1234, 0x5678};

TierBlock block(uint64_t n, size_t payload = kPayload) {
  TierBlock b;
  b.tokens.resize(kBs);
  std::iota(b.tokens.begin(), b.tokens.end(), static_cast<TokenId>(n * 100));
  b.key = tier_next(tier_root(kFp, 0), b.tokens);
  b.payload.resize(payload);
  for (size_t i = 0; i < payload; ++i) b.payload[i] = static_cast<uint8_t>(i * 7 + n);
  return b;
}

class TempDir {
 public:
  TempDir() {
    static int count = 0;
    path_ = fs::temp_directory_path() / ("pagellm-kvtier-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
                                         std::to_string(count++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

int64_t file_bytes() { return static_cast<int64_t>(kTierHeaderBytes + kBs * sizeof(TokenId) + kPayload); }

DiskKvTier open_disk(const TempDir& d, int64_t capacity = int64_t{1} << 30, TierKey fp = kFp) {
  return DiskKvTier(d.path(), capacity, fp, kBs, kPayload);
}

void patch(const fs::path& p, size_t at, uint8_t xor_with) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ xor_with);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST(TierKey, ChainsDependOnEveryTokenTheRootAndTheGroup) {
  const TierBlock a = block(1);
  std::vector<TokenId> t = a.tokens;
  EXPECT_EQ(tier_next(tier_root(kFp, 0), t), a.key);
  t[15] += 1;
  EXPECT_NE(tier_next(tier_root(kFp, 0), t), a.key);
  EXPECT_NE(tier_next(tier_root(kFp, 7), a.tokens), a.key);            // an adapter
  EXPECT_NE(tier_next(tier_root(TierKey{1, 5678}, 0), a.tokens), a.key);  // another model
  EXPECT_NE(tier_group_key(a.key, 1), a.key);
  EXPECT_NE(tier_group_key(a.key, 1), tier_group_key(a.key, 2));
  EXPECT_EQ(tier_group_key(a.key, 0), a.key);
  EXPECT_EQ(a.key.hex().size(), 32u);
}

TEST(HostKvTier, KeepsBlocksAndEvictsLeastRecentlyUsedBySize) {
  HostKvTier t(3 * kPayload);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t.put(block(i)));
  ASSERT_TRUE(t.get(block(0).key, block(0).tokens));  // 0 is now the most recent
  ASSERT_TRUE(t.put(block(3)));                       // evicts 1
  EXPECT_TRUE(t.contains(block(0).key));
  EXPECT_FALSE(t.contains(block(1).key));
  EXPECT_TRUE(t.contains(block(3).key));
  const auto got = t.get(block(2).key, block(2).tokens);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, block(2).payload);
  EXPECT_FALSE(t.get(block(2).key, block(3).tokens)) << "other tokens under the key: a miss";
  EXPECT_FALSE(t.put(block(9, 4 * kPayload))) << "bigger than the tier";
  const TierStats s = t.stats();
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.bytes, static_cast<int64_t>(3 * kPayload));
  EXPECT_EQ(s.evicted_blocks, 1);
  EXPECT_EQ(s.loaded_blocks, 2);
}

TEST(DiskKvTier, BlocksSurviveARestartInTheirLruOrder) {
  TempDir d;
  {
    DiskKvTier t = open_disk(d, 3 * file_bytes());
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t.put(block(i)));
    EXPECT_EQ(t.stats().bytes, 3 * file_bytes());
  }
  DiskKvTier t = open_disk(d, 3 * file_bytes());
  EXPECT_EQ(t.indexed_at_start(), 3);
  const auto got = t.get(block(1).key, block(1).tokens);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, block(1).payload);
  ASSERT_TRUE(t.put(block(3)));  // evicts 0: the oldest file
  EXPECT_FALSE(t.contains(block(0).key));
  EXPECT_FALSE(fs::exists(t.folder() / (block(0).key.hex() + ".kvb")));
  EXPECT_TRUE(t.contains(block(1).key));
  EXPECT_EQ(t.stats().evicted_blocks, 1);
}

TEST(DiskKvTier, ASmallerBoundAtStartEvictsDownToIt) {
  TempDir d;
  {
    DiskKvTier t = open_disk(d);
    for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t.put(block(i)));
  }
  DiskKvTier t = open_disk(d, 2 * file_bytes());
  EXPECT_EQ(t.stats().blocks, 2);
  EXPECT_EQ(std::distance(fs::directory_iterator(t.folder()), fs::directory_iterator{}), 2);
}

TEST(DiskKvTier, ACorruptPayloadIsNeverLoadedAndItsFileIsDeleted) {
  TempDir d;
  DiskKvTier t = open_disk(d);
  ASSERT_TRUE(t.put(block(1)));
  const fs::path p = t.folder() / (block(1).key.hex() + ".kvb");
  patch(p, static_cast<size_t>(file_bytes()) - 10, 0x40);
  EXPECT_FALSE(t.get(block(1).key, block(1).tokens));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(t.contains(block(1).key));
  EXPECT_EQ(t.stats().rejected_files, 1);
}

TEST(DiskKvTier, BadFilesAreIgnoredAndDeletedAtTheScan) {
  TempDir d;
  fs::path folder;
  std::vector<fs::path> files;
  {
    DiskKvTier t = open_disk(d);
    folder = t.folder();
    for (uint64_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(t.put(block(i)));
      files.push_back(folder / (block(i).key.hex() + ".kvb"));
    }
  }
  fs::resize_file(files[0], static_cast<uintmax_t>(file_bytes() - 1));  // truncated payload
  fs::resize_file(files[1], 50);                                         // truncated header
  patch(files[2], 8, 0x02);                                              // another format version
  patch(files[3], kTierHeaderBytes + 4, 0x01);                           // tampered tokens
  patch(files[4], 0, 0x20);                                              // not our magic
  {
    // A block of another model, renamed into our folder.
    TempDir other;
    DiskKvTier foreign = open_disk(other, int64_t{1} << 30, TierKey{9, 9});
    ASSERT_TRUE(foreign.put(block(7)));
    fs::copy_file(foreign.folder() / (block(7).key.hex() + ".kvb"), folder / (block(7).key.hex() + ".kvb"));
  }
  std::ofstream(folder / ".tmp-leftover-1") << "half a write";
  std::ofstream(folder / "notes.txt") << "not a block";
  DiskKvTier t = open_disk(d);
  EXPECT_EQ(t.indexed_at_start(), 1);
  EXPECT_TRUE(t.contains(block(5).key));
  EXPECT_EQ(t.stats().rejected_files, 6);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(fs::exists(files[static_cast<size_t>(i)])) << i;
  EXPECT_FALSE(fs::exists(folder / (block(7).key.hex() + ".kvb")));
  EXPECT_FALSE(fs::exists(folder / ".tmp-leftover-1"));
  EXPECT_TRUE(fs::exists(folder / "notes.txt")) << "files that are no blocks are left alone";
  for (uint64_t i = 0; i < 5; ++i) EXPECT_FALSE(t.get(block(i).key, block(i).tokens));
}

TEST(DiskKvTier, AFileRenamedToAnotherKeyIsRejected) {
  TempDir d;
  {
    DiskKvTier t = open_disk(d);
    ASSERT_TRUE(t.put(block(1)));
    fs::rename(t.folder() / (block(1).key.hex() + ".kvb"), t.folder() / (block(2).key.hex() + ".kvb"));
  }
  DiskKvTier t = open_disk(d);
  EXPECT_EQ(t.indexed_at_start(), 0);
  EXPECT_FALSE(t.get(block(2).key, block(2).tokens));
}

TEST(DiskKvTier, HeaderRoundTripsAndRefusesGarbage) {
  const TierBlock b = block(3);
  const std::vector<uint8_t> h = encode_tier_header(kFp, b, 42);
  std::string why;
  const auto got = decode_tier_header(h, why);
  ASSERT_TRUE(got) << why;
  EXPECT_EQ(got->fingerprint, kFp);
  EXPECT_EQ(got->key, b.key);
  EXPECT_EQ(got->tokens, b.tokens);
  EXPECT_EQ(got->payload_bytes, kPayload);
  EXPECT_EQ(got->payload_checksum, 42u);
  EXPECT_FALSE(decode_tier_header(std::span(h).subspan(0, 40), why));
  EXPECT_EQ(why, "truncated header");
  std::vector<uint8_t> bad = h;
  bad[48] = 0xff;  // block size
  EXPECT_FALSE(decode_tier_header(bad, why));
}

TEST(DiskKvTier, AFolderThatCannotBeCreatedIsAnError) {
  TempDir d;
  std::ofstream(d.path() / "a-file") << "x";
  EXPECT_THROW(DiskKvTier(d.path() / "a-file" / "kv", 1 << 20, kFp, kBs, kPayload), Error);
}

TEST(DiskKvTier, AFailedWriteStopsStoringAndReadsGoOn) {
  TempDir d;
  DiskKvTier t = open_disk(d);
  ASSERT_TRUE(t.put(block(1)));
  // The folder is gone and a file is in its place: every write fails (as on a full disk).
  const fs::path saved = d.path() / "saved";
  fs::rename(t.folder(), saved);
  std::ofstream(t.folder()) << "x";
  EXPECT_FALSE(t.put(block(2)));
  EXPECT_FALSE(t.writable());
  EXPECT_EQ(t.stats().write_errors, 1);
  fs::remove(t.folder());
  fs::rename(saved, t.folder());
  EXPECT_FALSE(t.put(block(3))) << "stays off";
  EXPECT_TRUE(t.get(block(1).key, block(1).tokens));
}

TEST(KvOffload, AnUnusableDiskTierIsLeftOutWithServingGoingOn) {
  TempDir d;
  std::ofstream(d.path() / "a-file") << "x";
  KvOffloadConfig c;
  c.disk_dir = (d.path() / "a-file" / "kv").string();
  c.disk_bytes = 1 << 20;
  c.block_size = kBs;
  c.block_bytes = kPayload;
  c.fingerprint = kFp;
  KvOffload off(c);
  EXPECT_FALSE(off.enabled());
  off.store(block(1));  // nothing happens
  TierBlock want = block(1);
  want.payload.clear();
  auto job = off.load({want});
  EXPECT_TRUE(job->done);
  EXPECT_TRUE(job->blocks[0].payload.empty());
  c.host_bytes = 1 << 20;
  KvOffload host_only(c);
  EXPECT_TRUE(host_only.enabled());
  EXPECT_EQ(host_only.stats().tiers.size(), 1u);
}

TEST(KvOffload, StoresThenLoadsThroughHostAndDisk) {
  TempDir d;
  KvOffloadConfig c;
  c.host_bytes = 2 * kPayload;  // holds two: the rest come from disk
  c.disk_dir = d.path().string();
  c.disk_bytes = int64_t{1} << 30;
  c.block_size = kBs;
  c.block_bytes = kPayload;
  c.fingerprint = kFp;
  {
    KvOffload off(c);
    for (uint64_t i = 0; i < 4; ++i) off.store(block(i));
    off.flush();
    for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(off.contains(block(i).key));
    std::vector<TierBlock> want;
    for (uint64_t i : {0, 3, 5}) {
      TierBlock b = block(i);
      b.payload.clear();
      want.push_back(b);
    }
    auto job = off.load(want);
    off.flush();
    ASSERT_TRUE(job->done);
    EXPECT_EQ(job->blocks[0].payload, block(0).payload);
    EXPECT_EQ(job->blocks[1].payload, block(3).payload);
    EXPECT_TRUE(job->blocks[2].payload.empty());
    const KvOffloadStats s = off.stats();
    ASSERT_EQ(s.tiers.size(), 2u);
    EXPECT_EQ(s.tiers[0].first, "host");
    EXPECT_EQ(s.tiers[1].second.stored_blocks, 4);
    EXPECT_EQ(s.tiers[0].second.loaded_blocks + s.tiers[1].second.loaded_blocks, 2);
    off.store(block(8));  // queued at shutdown: still written
  }
  KvOffload again(c);
  EXPECT_EQ(again.stats().disk_blocks_at_start, 5);
  EXPECT_TRUE(again.contains(block(8).key));
}

TEST(KvOffload, DropsStoresBeyondItsQueueBound) {
  KvOffloadConfig c;
  c.host_bytes = 1 << 20;
  c.block_size = kBs;
  c.block_bytes = kPayload;
  c.max_pending_bytes = 0;
  KvOffload off(c);
  off.store(block(1));
  off.flush();
  EXPECT_EQ(off.stats().dropped_stores, 1);
  EXPECT_FALSE(off.contains(block(1).key));
}

}  // namespace
}  // namespace pagellm
