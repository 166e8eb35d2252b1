// plan_kv_budget: how many KV blocks an engine gets, from --kv-cache-memory,
// the device's memory or host memory, and how virtual engines share them.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine_builder.h"
#include "kv/kv_sizing.h"

namespace pagellm {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
// 2 layers, 2 KV heads of 64, F32, 16 tokens: 32 KiB a block.
const KVCacheLayout kLayout{2, 2, 64, 16, 4};
const int64_t kBlock = kv_bytes_per_block(kLayout);

// max_model_len 512 (32 blocks, 1 MiB a sequence), 4 sequences, 4 GiB free host memory.
KvBudgetInputs base_inputs() {
  KvBudgetInputs in;
  in.layout = kLayout;
  in.max_model_len = 512;
  in.max_num_seqs = 4;
  in.memory = {static_cast<size_t>(8 * kGiB), static_cast<size_t>(4 * kGiB), true};
  in.device = "test";
  return in;
}

struct BudgetCase {
  std::string name;
  std::function<void(KvBudgetInputs&)> set;
  int64_t budget_bytes;
};

TEST(EngineKvBudget, TableOfBudgets) {
  const int64_t device_total = kGiB, weights = 100 * kMiB, activations = 10 * kMiB;
  const int64_t device_share = static_cast<int64_t>(static_cast<double>(device_total) * 0.9) - weights - activations;
  auto device = [&](KvBudgetInputs& in, int64_t free) {
    in.memory = {static_cast<size_t>(device_total), static_cast<size_t>(free), false};
    in.weight_bytes = weights;
    in.activation_bytes = activations;
  };
  const std::vector<BudgetCase> cases = {
      {"asked for", [](KvBudgetInputs& in) { in.kv_cache_memory = 100 * kBlock + 100; }, 100 * kBlock + 100},
      {"asked for, the device's memory unread",
       [&](KvBudgetInputs& in) {
         in.kv_cache_memory = 7 * kBlock;
         device(in, 0);
       },
       7 * kBlock},
      {"host: capped by max_num_seqs full sequences", [](KvBudgetInputs&) {}, 4 * kMiB},
      {"host: a quarter of what is free",
       [](KvBudgetInputs& in) {
         in.max_num_seqs = 256;
         in.memory.free_bytes = 64 * kMiB;
       },
       16 * kMiB},
      {"host: at least one sequence and a block (tiny memory)",
       [](KvBudgetInputs& in) { in.memory.free_bytes = kMiB; }, 33 * kBlock},
      {"host: max_model_len rounds up to whole blocks",
       [](KvBudgetInputs& in) {
         in.max_model_len = 17;
         in.max_num_seqs = 1;
       },
       3 * kBlock},
      {"host: max_num_seqs 0 counts as one", [](KvBudgetInputs& in) { in.max_num_seqs = 0; }, 33 * kBlock},
      {"device: 0.9 of it less weights and activations", [&](KvBudgetInputs& in) { device(in, device_total); },
       device_share},
      {"device: no more than is free", [&](KvBudgetInputs& in) { device(in, 200 * kMiB); }, 190 * kMiB},
      {"host with --gpu-memory-utilization: the device's rule",
       [](KvBudgetInputs& in) {
         in.gpu_memory_utilization = 0.5;
         in.memory = {static_cast<size_t>(kGiB), static_cast<size_t>(kGiB), true};
       },
       kGiB / 2},
  };
  for (const BudgetCase& c : cases) {
    SCOPED_TRACE(c.name);
    KvBudgetInputs in = base_inputs();
    c.set(in);
    const KvBudget kv = plan_kv_budget(in);
    EXPECT_EQ(kv.bytes_per_block, kBlock);
    EXPECT_EQ(kv.budget_bytes, c.budget_bytes);
    EXPECT_EQ(kv.num_blocks, c.budget_bytes / kBlock);
    ASSERT_EQ(kv.shares.size(), 1u);
    EXPECT_EQ(kv.shares[0].block_shift, 0);
    EXPECT_EQ(kv.shares[0].num_blocks, kv.num_blocks);
  }
}

TEST(EngineKvBudget, VirtualEnginesSplitTheUsableBlocks) {
  KvBudgetInputs in = base_inputs();
  in.kv_cache_memory = 100 * kBlock;  // 99 usable blocks
  in.virtual_engines = 2;
  KvBudget kv = plan_kv_budget(in);
  ASSERT_EQ(kv.shares.size(), 2u);
  // The first share takes the odd block; each counts its own null block.
  EXPECT_EQ(kv.shares[0].block_shift, 0);
  EXPECT_EQ(kv.shares[0].num_blocks, 51);
  EXPECT_EQ(kv.shares[1].block_shift, 50);
  EXPECT_EQ(kv.shares[1].num_blocks, 50);

  in.kv_cache_memory = 10 * kBlock;
  in.virtual_engines = 4;  // 9 usable: 3, 2, 2, 2
  kv = plan_kv_budget(in);
  ASSERT_EQ(kv.shares.size(), 4u);
  const int32_t shifts[] = {0, 3, 5, 7}, blocks[] = {4, 3, 3, 3};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(kv.shares[i].block_shift, shifts[i]) << i;
    EXPECT_EQ(kv.shares[i].num_blocks, blocks[i]) << i;
  }
  // More virtual engines than usable blocks: the last shares are empty (the
  // scheduler refuses them and the engine falls back to one).
  const std::vector<KvShare> thin = kv_shares(3, 4);
  ASSERT_EQ(thin.size(), 4u);
  EXPECT_EQ(thin[1].num_blocks, 2);
  EXPECT_EQ(thin[2].num_blocks, 1);
  EXPECT_EQ(thin[3].block_shift, 2);
}

void expect_error(const KvBudgetInputs& in, const std::string& part) {
  try {
    plan_kv_budget(in);
    ADD_FAILURE() << "no error, expected one with: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(EngineKvBudget, BudgetsThatHoldNoCacheFail) {
  KvBudgetInputs in = base_inputs();
  in.kv_cache_memory = kBlock + 1;  // one block; the null block needs a second
  expect_error(in, fmt::format("KV cache budget of {} bytes holds 1 blocks", kBlock + 1));

  in = base_inputs();
  in.memory = {static_cast<size_t>(kGiB), static_cast<size_t>(kGiB), false};
  in.weight_bytes = kGiB;
  expect_error(in, "--gpu-memory-utilization 0.9 of the test device's 1.00 GiB leaves no room for the KV cache after "
                   "weights of 1.00 GiB");

  in = base_inputs();
  in.gpu_memory_utilization = 1.5;
  expect_error(in, "--gpu-memory-utilization must be in (0, 1], got 1.5");
}

}  // namespace
}  // namespace pagellm
