// The KV offload tier in the engine: with a pool too small to keep earlier
// prompts, their prefixes come back from the host or disk tier instead of
// being recomputed, cached_tokens counts them, the greedy output is the
// output without the tier, a restart finds the disk tier's blocks, and the
// stored blocks are the recomputed ones bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/kv_fingerprint.h"
#include "engine_test_util.h"
#include "kv/kv_sizing.h"

namespace fs = std::filesystem;

namespace pagellm {
namespace {

constexpr int kPromptLen = 150;  // 9 full blocks can come from a cache (the last token is computed)

EngineConfig small_pool_config(const std::string& shape = "tiny-llama") {
  EngineConfig c = test::tiny_engine_config(256);
  c.dummy_shape = shape;
  c.block_size = 16;
  c.kv_cache_dtype = DType::F32;
  // Sliding groups hold a window plus a step's tokens: small steps keep the pool small.
  c.scheduler.max_num_batched_tokens = shape == "tiny-llama" ? 256 : 32;
  c.scheduler.max_num_seqs = 4;
  // Attention splits its keys at fixed places: a prompt whose head came from a
  // cache computes its tail to the same bits as a whole recompute.
  c.deterministic = true;
  // One max_model_len sequence (16 blocks) and a block to spare: a prompt's
  // blocks are evicted by the next one.
  c.kv_cache_memory = 1;  // set below from the engine's own block size
  return c;
}

// The smallest pool of at least `blocks` blocks this config runs with (one
// max_model_len sequence must fit; sliding groups add their windows).
void size_pool(EngineConfig& c, int32_t blocks) {
  EngineConfig probe = c;
  probe.kv_cache_memory = int64_t{64} << 20;
  probe.kv_offload_host_bytes = 0;
  probe.kv_offload_dir.clear();
  const auto per_block = static_cast<int64_t>(Engine(probe).backend().kv_cache_spec().bytes_per_block());
  for (;; blocks += 4) {
    probe.kv_cache_memory = per_block * (blocks + 1);
    try {
      Engine e(probe);
      break;
    } catch (const Error&) {
      ASSERT_LT(blocks, 1000) << "no pool size fits";
    }
  }
  c.kv_cache_memory = per_block * (blocks + 1);
}

struct Finished {
  std::vector<int32_t> tokens;
  int32_t cached = 0;
};

std::vector<std::vector<int32_t>> prompts(int count, int vocab) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(count));
  for (auto& p : out) {
    p.resize(kPromptLen);
    for (auto& t : p) t = d(rng);
  }
  return out;
}

// Runs each prompt alone, in order, `rounds` times: "p<i>#<round>".
std::map<std::string, Finished> run_rounds(Engine& e, const std::vector<std::vector<int32_t>>& ps, int first_round,
                                           int rounds) {
  std::map<std::string, Finished> out;
  for (int round = first_round; round < first_round + rounds; ++round) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string id = "p" + std::to_string(i) + "#" + std::to_string(round);
      e.add_request(test::make_request(id, ps[i], 8));
      while (e.has_unfinished()) {
        for (RequestOutput& o : e.step()) {
          EXPECT_TRUE(o.error.empty()) << o.error;
          Finished& f = out[o.request_id];
          for (const CompletionDelta& d : o.completions) f.tokens.insert(f.tokens.end(), d.token_ids.begin(), d.token_ids.end());
          if (o.finished) f.cached = o.num_cached_tokens;
        }
        e.check_invariants();
        e.flush_kv_offload();  // the tier holds what it was given, however slow its thread
      }
    }
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    static int count = 0;
    path_ = fs::temp_directory_path() / ("pagellm-kvoffload-" + std::to_string(::getpid()) + "-" + std::to_string(count++));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void expect_same_tokens(const std::map<std::string, Finished>& a, const std::map<std::string, Finished>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, f] : a) EXPECT_EQ(f.tokens, b.at(id).tokens) << id;
}

void check_tier_recovers_prefixes(const std::string& shape, bool disk) {
  EngineConfig plain = small_pool_config(shape);
  size_pool(plain, 20);
  Engine without(plain);
  const auto ps = prompts(3, without.model_config().n_vocab);
  const auto base = run_rounds(without, ps, 0, 2);
  // The pool is too small: the second round finds at most a prompt's head
  // block (released last, so evicted last).
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_LE(base.at("p" + std::to_string(i) + "#1").cached, 16);

  TempDir dir;
  EngineConfig tiered = plain;
  if (disk) {
    tiered.kv_offload_dir = dir.str();
    tiered.kv_offload_disk_bytes = int64_t{1} << 30;
  } else {
    tiered.kv_offload_host_bytes = int64_t{64} << 20;
  }
  Engine with(tiered);
  const auto got = run_rounds(with, ps, 0, 2);
  expect_same_tokens(got, base);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(got.at("p" + std::to_string(i) + "#0").cached, 0);
    EXPECT_EQ(got.at("p" + std::to_string(i) + "#1").cached, 144) << i;
  }
  const EngineStats s = with.stats();
  ASSERT_TRUE(s.kv_tier.enabled);
  // The pool's blocks and the tier's together make up each prefix.
  EXPECT_EQ(s.metrics.prefix_cache_hits, 3 * 144);
  EXPECT_GE(s.kv_tier.hit_tokens, 3 * 128);
  EXPECT_GT(s.kv_tier.offload.tiers[0].second.stored_blocks, 0);
  EXPECT_GT(s.kv_tier.offload.tiers[0].second.loaded_blocks, 0);
  EXPECT_EQ(s.kv.used_blocks, 0);
}

TEST(KvOffloadEngine, HostTierBringsBackEvictedPrefixesWithTheSameOutput) {
  check_tier_recovers_prefixes("tiny-llama", false);
}

TEST(KvOffloadEngine, DiskTierBringsBackEvictedPrefixesWithTheSameOutput) {
  check_tier_recovers_prefixes("tiny-llama", true);
}

// Gemma 3's sliding-window layers: each group's blocks are stored apart.
TEST(KvOffloadEngine, SlidingWindowGroupsComeBackToo) { check_tier_recovers_prefixes("tiny-gemma3", false); }

TEST(KvOffloadEngine, ARestartFindsTheDiskTiersPrefixes) {
  EngineConfig plain = small_pool_config();
  size_pool(plain, 20);
  std::map<std::string, Finished> base;
  std::vector<std::vector<int32_t>> ps;
  {
    Engine without(plain);
    ps = prompts(2, without.model_config().n_vocab);
    base = run_rounds(without, ps, 1, 1);
  }
  TempDir dir;
  EngineConfig tiered = plain;
  tiered.kv_offload_dir = dir.str();
  {
    Engine first(tiered);
    run_rounds(first, ps, 0, 1);
  }  // stops: its queued blocks are written
  Engine second(tiered);
  EXPECT_GT(second.stats().kv_tier.offload.disk_blocks_at_start, 0);
  const auto got = run_rounds(second, ps, 1, 1);
  expect_same_tokens(got, base);
  for (const auto& [id, f] : got) EXPECT_EQ(f.cached, 144) << id;

  // Another model (or KV dtype) never reads them: its fingerprint differs.
  EngineConfig other = tiered;
  other.kv_cache_dtype = DType::F16;
  size_pool(other, 17);
  Engine third(other);
  EXPECT_EQ(third.stats().kv_tier.offload.disk_blocks_at_start, 0);
  for (const auto& [id, f] : run_rounds(third, ps, 1, 1)) EXPECT_EQ(f.cached, 0) << id;
}

// The stored blocks are what a recompute gives, bit for bit: the same
// prompts computed one at a time and all in one batch (deterministic mode)
// leave byte-identical files under the same names.
TEST(KvOffloadEngine, StoredBlocksEqualRecomputedOnesBitForBit) {
  EngineConfig c = small_pool_config();
  c.deterministic = true;
  size_pool(c, 64);
  TempDir a, b;
  std::vector<std::vector<int32_t>> ps;
  {
    EngineConfig ca = c;
    ca.kv_offload_dir = a.str();
    Engine e(ca);
    ps = prompts(3, e.model_config().n_vocab);
    run_rounds(e, ps, 0, 1);
  }
  {
    EngineConfig cb = c;
    cb.kv_offload_dir = b.str();
    Engine e(cb);
    for (size_t i = 0; i < ps.size(); ++i) e.add_request(test::make_request("q" + std::to_string(i), ps[i], 8));
    test::run_all(e);
  }
  int compared = 0;
  for (const auto& sub : fs::directory_iterator(a.path())) {
    for (const auto& f : fs::directory_iterator(sub.path())) {
      const fs::path other = b.path() / sub.path().filename() / f.path().filename();
      ASSERT_TRUE(fs::exists(other)) << other;
      std::ifstream x(f.path(), std::ios::binary), y(other, std::ios::binary);
      const std::string bx((std::istreambuf_iterator<char>(x)), {}), by((std::istreambuf_iterator<char>(y)), {});
      EXPECT_EQ(bx, by) << f.path();
      ++compared;
    }
  }
  EXPECT_GE(compared, 3 * 9);
}

TEST(KvOffloadEngine, AnUnwritableFolderLeavesServingAsItWas) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::ofstream(dir.path() / "file") << "x";
  EngineConfig c = small_pool_config();
  size_pool(c, 17);
  c.kv_offload_dir = (dir.path() / "file" / "kv").string();
  Engine e(c);
  EXPECT_FALSE(e.stats().kv_tier.enabled);
  const auto ps = prompts(1, e.model_config().n_vocab);
  EXPECT_EQ(run_rounds(e, ps, 0, 1).size(), 1u);
}

// Batch invariance with tier hits mixed in: after a restart, prompts whose
// prefixes load from disk run in one batch with fresh ones, prompts sharing
// a head with them and n > 1 samples; each output is the output alone.
TEST(KvOffloadEngine, TierHitsMixedIntoABatchChangeNoOutput) {
  EngineConfig plain = small_pool_config();
  size_pool(plain, 48);
  std::vector<std::vector<int32_t>> ps;
  {
    Engine probe(plain);
    ps = prompts(6, probe.model_config().n_vocab);
  }
  // Prompts 4 and 5 share the first 100 tokens of prompts 0 and 1.
  std::copy(ps[0].begin(), ps[0].begin() + 100, ps[4].begin());
  std::copy(ps[1].begin(), ps[1].begin() + 100, ps[5].begin());
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < ps.size(); ++i) reqs.push_back(test::make_request("b" + std::to_string(i), ps[i], 12));
  reqs[3].params.n = 2;
  reqs[3].params.temperature = 0.8f;
  reqs[3].params.seed = 7;
  std::map<std::string, std::vector<test::Result>> alone;
  for (const EngineRequest& r : reqs) {
    Engine e(plain);
    e.add_request(r);
    alone[r.id] = test::run_all(e).at(r.id);
  }
  TempDir dir;
  EngineConfig tiered = plain;
  tiered.kv_offload_dir = dir.str();
  {
    Engine warm(tiered);
    run_rounds(warm, {ps[0], ps[1], ps[2]}, 0, 1);
  }
  Engine e(tiered);
  for (const EngineRequest& r : reqs) e.add_request(r);
  const test::Results together = test::run_all(e, nullptr, /*flush_kv_tier=*/true);
  for (const EngineRequest& r : reqs) {
    ASSERT_EQ(together.at(r.id).size(), alone.at(r.id).size()) << r.id;
    for (size_t k = 0; k < alone.at(r.id).size(); ++k)
      EXPECT_EQ(together.at(r.id)[k].tokens, alone.at(r.id)[k].tokens) << r.id << " sample " << k;
  }
  EXPECT_GE(e.stats().kv_tier.hit_tokens, 3 * 128);
  EXPECT_EQ(e.stats().kv.used_blocks, 0);
  e.check_invariants();
}

// Preemption under a pool too small for the running sequences: a preempted
// sequence's blocks that the pool lost while it waited come back from the
// tier before it runs again, and the outputs are those without the tier.
TEST(KvOffloadEngine, APreemptedSequenceGetsItsLostBlocksBack) {
  EngineConfig plain = small_pool_config();
  size_pool(plain, 20);
  std::vector<EngineRequest> reqs;
  {
    Engine probe(plain);
    const auto ps = prompts(3, probe.model_config().n_vocab);
    for (size_t i = 0; i < ps.size(); ++i) reqs.push_back(test::make_request("x" + std::to_string(i), ps[i], 100));
  }
  auto run = [&](const EngineConfig& c) {
    Engine e(c);
    for (const EngineRequest& r : reqs) e.add_request(r);
    auto out = test::run_all(e, nullptr, /*flush_kv_tier=*/true);
    EXPECT_EQ(e.stats().kv.used_blocks, 0);
    return std::make_pair(out, e.stats());
  };
  const auto [base, base_stats] = run(plain);
  EngineConfig tiered = plain;
  tiered.kv_offload_host_bytes = int64_t{64} << 20;
  const auto [got, stats] = run(tiered);
  for (const EngineRequest& r : reqs) EXPECT_EQ(got.at(r.id)[0].tokens, base.at(r.id)[0].tokens) << r.id;
  EXPECT_GT(stats.metrics.num_preemptions, 0) << "the pool should force preemption";
  EXPECT_GT(stats.kv_tier.hit_tokens, 0);
  EXPECT_GT(stats.metrics.prefix_cache_hits, base_stats.metrics.prefix_cache_hits);
}

// Under pressure the sequences waiting at the head of the queue find no room
// for their tier blocks at every step: each prefetch that found none backs
// off instead of reading the same blocks from disk again at the next step.
TEST(KvOffloadEngine, WaitingSequencesAreNotReadAgainAtEveryStep) {
  EngineConfig c = small_pool_config();
  size_pool(c, 20);
  TempDir dir;
  c.kv_offload_dir = dir.path().string();
  c.kv_offload_disk_bytes = int64_t{256} << 20;
  Engine e(c);
  const auto ps = prompts(6, e.model_config().n_vocab);
  // Every other request ends at its first token: sequences that finish in
  // the step that admits them, while the tier may hold a load for them.
  for (size_t i = 0; i < ps.size(); ++i)
    e.add_request(test::make_request("w" + std::to_string(i), ps[i], i % 2 ? 1 : 100));
  test::run_all(e, nullptr, /*flush_kv_tier=*/true);
  const EngineStats st = e.stats();
  EXPECT_GT(st.metrics.num_preemptions, 0) << "the pool should force preemption";
  int64_t read = 0;
  for (const auto& [name, t] : st.kv_tier.offload.tiers) read += t.loaded_blocks;
  EXPECT_GT(st.kv_tier.imported_blocks, 0);
  EXPECT_LE(read, 2 * st.kv_tier.imported_blocks + 8 * kPromptLen / 16)
      << "blocks read " << read << ", imported " << st.kv_tier.imported_blocks;
}

TEST(KvFingerprint, SameShapedModelFilesWithOtherWeightsDiffer) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::string data(size_t{8} << 20, 'a');
  const fs::path a = dir.path() / "a.gguf", b = dir.path() / "b.gguf";
  std::ofstream(a, std::ios::binary) << data;
  std::fill(data.begin() + (3 << 20), data.begin() + (4 << 20), 'b');  // other weights in the middle
  std::ofstream(b, std::ios::binary) << data;
  fs::last_write_time(b, fs::last_write_time(a));
  EXPECT_NE(path_fingerprint(a.string()), path_fingerprint(b.string()));
  fs::copy_file(a, b, fs::copy_options::overwrite_existing);
  fs::last_write_time(b, fs::last_write_time(a));
  EXPECT_EQ(path_fingerprint(a.string()), path_fingerprint(b.string()));
  EXPECT_NE(path_fingerprint(a.string()), 0u);
  EXPECT_EQ(path_fingerprint((dir.path() / "none").string()), 0u);
}

TEST(KvOffloadEngine, IsOffWhereBlocksAreNotCachedByPrefix) {
  EngineConfig c = small_pool_config();
  size_pool(c, 17);
  c.kv_offload_host_bytes = int64_t{16} << 20;
  c.enable_prefix_caching = false;
  EXPECT_FALSE(Engine(c).stats().kv_tier.enabled);
}

}  // namespace
}  // namespace pagellm
