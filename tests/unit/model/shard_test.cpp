// Tensor-parallel shard geometry and the load-time cuts of model/shard.h:
// each rank's rows / columns of a (quantized) matrix are exactly that part of
// the whole, on random values.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "model/model.h"
#include "core/quant_blocks.h"
#include "model/shard.h"

namespace pagellm {
namespace {

ModelConfig config(int n_head, int n_head_kv, int n_ff, int n_vocab, int n_layer = 4) {
  ModelConfig c;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.head_dim = 64;
  c.n_embd = 256;
  c.n_ff = n_ff;
  c.n_vocab = n_vocab;
  c.n_layer = n_layer;
  return c;
}

ModelShard shard(int tp_rank, int tp_size, int pp_rank, int pp_size, std::vector<int> partition = {},
                 bool balance = false) {
  return {tp_rank, tp_size, pp_rank, pp_size, std::move(partition), balance};
}

TEST(ShardGeometry, SplitsHeadsUnitsVocabularyAndLayers) {
  const ModelConfig c = config(8, 4, 512, 1001, 5);
  const ShardGeometry g = shard_geometry(c, shard(1, 2, 0, 1));
  EXPECT_EQ(g.n_head, 4);
  EXPECT_EQ(g.head_begin, 4);
  EXPECT_EQ(g.n_head_kv, 2);
  EXPECT_EQ(g.kv_head_begin, 2);
  EXPECT_EQ(g.n_ff, 256);
  EXPECT_EQ(g.ff_begin, 256);
  EXPECT_EQ(g.vocab_stride, 501);  // the last rank's slice is the shorter one
  EXPECT_EQ(g.vocab_begin, 501);
  EXPECT_EQ(g.n_vocab, 500);
  const ShardGeometry s1 = shard_geometry(c, shard(0, 1, 1, 2));
  EXPECT_EQ(s1.layer_begin, 2);
  EXPECT_EQ(s1.layer_end, 5);
  EXPECT_FALSE(s1.first_stage);
  EXPECT_TRUE(s1.last_stage);
}

TEST(ShardGeometry, ReplicatesKvHeadsWhenFewerThanRanks) {
  const ModelConfig c = config(8, 2, 512, 512);
  for (int r = 0; r < 4; ++r) {
    const ShardGeometry g = shard_geometry(c, shard(r, 4, 0, 1));
    EXPECT_EQ(g.n_head, 2);
    EXPECT_EQ(g.n_head_kv, 1);
    EXPECT_EQ(g.kv_head_begin, r / 2);  // query heads 2r, 2r + 1 read KV head (2r) / 4
  }
}

TEST(ShardGeometry, IndivisibleSizesAreClearErrors) {
  EXPECT_THROW(shard_geometry(config(6, 2, 512, 512), shard(0, 4, 0, 1)), Error);  // heads
  EXPECT_THROW(shard_geometry(config(12, 3, 512, 512), shard(0, 2, 0, 1)), Error);  // 3 KV heads on 2 ranks
  EXPECT_THROW(shard_geometry(config(8, 4, 510, 512), shard(0, 4, 0, 1)), Error);  // FFN units
  EXPECT_THROW(shard_geometry(config(8, 4, 512, 512, 2), shard(0, 1, 0, 3)), Error);  // layers
  try {
    shard_geometry(config(6, 2, 512, 512), shard(0, 4, 0, 1));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the model's 6 attention heads"), std::string::npos);
  }
}

TEST(ShardGeometry, CutsFollowColumnAndRowParallelLayers) {
  const ShardGeometry g = shard_geometry(config(8, 4, 512, 512), shard(1, 2, 0, 1));
  EXPECT_EQ(tensor_cut(Slot::Q, g, 1, 64).kind, TensorCut::Rows);
  EXPECT_EQ(tensor_cut(Slot::Q, g, 1, 64).begin, 4 * 64);
  EXPECT_EQ(tensor_cut(Slot::K, g, 1, 64).begin, 2 * 64);
  EXPECT_EQ(tensor_cut(Slot::O, g, 1, 64).kind, TensorCut::Cols);
  EXPECT_EQ(tensor_cut(Slot::Down, g, 1, 64).kind, TensorCut::Cols);
  EXPECT_EQ(tensor_cut(Slot::AttnNorm, g, 1, 64).kind, TensorCut::All);
  EXPECT_EQ(tensor_cut(Slot::OBias, g, 1, 64).kind, TensorCut::All);  // added after the all-reduce
  EXPECT_EQ(tensor_cut(Slot::DownExpsBias, g, 1, 64).kind, TensorCut::None);
  EXPECT_EQ(tensor_cut(Slot::DownExpsBias, g, 0, 64).kind, TensorCut::All);
  EXPECT_EQ(tensor_cut(Slot::TokEmbd, g, 1, 64).kind, TensorCut::Rows);
  const ShardGeometry one = shard_geometry(config(8, 4, 512, 512), ModelShard{});
  EXPECT_EQ(tensor_cut(Slot::Q, one, 0, 64).kind, TensorCut::All);
}

// Gemma 4's global layers (heads of 256, their own KV head count) and
// double-wide FFN are cut per layer; the per-layer embedding table by the
// vocabulary, like the token embedding.
TEST(ShardGeometry, LayersOfTheirOwnShapeAreCutPerLayer) {
  const ModelConfig g4 = dummy_config("tiny-gemma4g", 512);  // KV heads 2 local, 1 global; FFN 2x in layers 3..5
  const ShardGeometry g = shard_geometry(g4, shard(1, 2, 0, 1));
  ASSERT_EQ(g.layer_n_head_kv.size(), 6u);
  EXPECT_EQ(g.kv_heads(0), 1);
  EXPECT_EQ(g.for_layer(0).kv_head_begin, 1);
  EXPECT_EQ(g.kv_heads(2), 1);  // one global KV head, replicated
  EXPECT_EQ(g.for_layer(2).kv_head_begin, 0);
  EXPECT_EQ(g.ff_units(0), 256);
  EXPECT_EQ(g.ff_units(4), 512);
  EXPECT_EQ(tensor_cut(Slot::Gate, g.for_layer(4), 1, 64).begin, 512);
  EXPECT_EQ(tensor_cut(Slot::K, g.for_layer(5), 1, 256).begin, 0);
  EXPECT_EQ(tensor_cut(Slot::K, g.for_layer(5), 1, 256).count, 256);
  EXPECT_EQ(tensor_cut(Slot::PleTokEmbd, g, 1, 64).kind, TensorCut::Rows);
  EXPECT_EQ(tensor_cut(Slot::PleTokEmbd, g, 1, 64).begin, 256);
  const ModelConfig d = dummy_config("tiny-gemma4-31b", 512);  // KV heads 4 local, 2 global
  const ShardGeometry h = shard_geometry(d, shard(1, 2, 0, 1));
  EXPECT_EQ(h.kv_heads(0), 2);
  EXPECT_EQ(h.kv_heads(2), 1);
  EXPECT_EQ(tensor_cut(Slot::K, h.for_layer(2), 1, 256).begin, 256);
  EXPECT_TRUE(shard_geometry(config(8, 4, 512, 512), shard(1, 2, 0, 1)).layer_n_head_kv.empty());
}

// Multi-head latent attention: Q's rows and O's columns go by the query and
// value head sizes (its head_dim is the latent's), the absorbed per-head
// matrices by whole heads, and the latent's own projections stay whole.
TEST(ShardGeometry, MlaCutsByQueryHeads) {
  ModelConfig c = config(4, 1, 512, 512);
  c.mla.kv_lora_rank = 256;
  c.mla.qk_rope_head_dim = 32;
  c.mla.qk_nope_head_dim = 64;
  c.mla.v_head_dim = 48;
  c.head_dim = static_cast<int>(c.mla.latent_dim());
  const ShardGeometry g = shard_geometry(c, shard(1, 2, 0, 1));
  EXPECT_EQ(g.n_head, 2);
  EXPECT_EQ(g.n_head_kv, 1);  // the latent: one KV head on every rank
  const TensorCut q = tensor_cut(Slot::Q, g, 1, c.head_dim);
  EXPECT_EQ(q.kind, TensorCut::Rows);
  EXPECT_EQ(q.begin, 2 * 96);
  EXPECT_EQ(q.count, 2 * 96);
  const TensorCut o = tensor_cut(Slot::O, g, 1, c.head_dim);
  EXPECT_EQ(o.kind, TensorCut::Cols);
  EXPECT_EQ(o.begin, 2 * 48);
  EXPECT_EQ(o.count, 2 * 48);
  for (Slot s : {Slot::MlaQAbsorb, Slot::MlaOAbsorb}) {
    const TensorCut a = tensor_cut(s, g, 1, c.head_dim);
    EXPECT_EQ(a.kind, TensorCut::Stack);
    EXPECT_EQ(a.begin, 2);
    EXPECT_EQ(a.count, 2);
  }
  for (Slot s : {Slot::MlaQA, Slot::MlaKvRope, Slot::MlaKvLatent, Slot::MlaKvNorm})
    EXPECT_EQ(tensor_cut(s, g, 1, c.head_dim).kind, TensorCut::All);
  std::vector<float> w(64, 1.0f);
  std::vector<AlignedBuffer> storage;
  EXPECT_THROW(cut_tensor(TensorData{"w", DType::F32, {8, 8}, w.data()}, {TensorCut::Stack, 0, 1}, storage), Error);
}

// A [rows, cols] matrix of `type` from random values, and its dequantized values.
struct Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  TensorData t;
};
Matrix random_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  m.values.resize(static_cast<size_t>(rows * cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    quantize_row_ref(type, row.data(), m.bytes.data() + row_bytes * static_cast<size_t>(r), cols);
    dequantize_row_ref(type, m.bytes.data() + row_bytes * static_cast<size_t>(r), m.values.data() + r * cols, cols);
  }
  m.t.name = "w";
  m.t.type = type;
  m.t.shape = {cols, rows};
  m.t.data = m.bytes.data();
  return m;
}

std::vector<float> dequantized(const TensorData& t) {
  std::vector<float> out(static_cast<size_t>(t.rows() * t.cols()));
  const size_t row_bytes = dtype_row_bytes(t.type, t.cols());
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + row_bytes * static_cast<size_t>(r),
                       out.data() + r * t.cols(), t.cols());
  return out;
}

TEST(CutTensor, RowsAndColumnsOfQuantizedMatricesAreExactlyTheirPart) {
  for (DType type : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const int64_t rows = 6, cols = 1024;
    const Matrix m = random_matrix(type, rows, cols, 7);
    std::vector<AlignedBuffer> storage;
    const TensorData r = cut_tensor(m.t, {TensorCut::Rows, 2, 3}, storage);
    EXPECT_TRUE(storage.empty()) << "rows are a view";
    const std::vector<float> rv = dequantized(r);
    ASSERT_EQ(r.rows(), 3);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(rv[i * cols + j], m.values[(i + 2) * cols + j]);
    const TensorData c = cut_tensor(m.t, {TensorCut::Cols, 512, 512}, storage);
    ASSERT_EQ(c.cols(), 512);
    ASSERT_EQ(c.rows(), rows);
    const std::vector<float> cv = dequantized(c);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 512; ++j)
        ASSERT_EQ(cv[i * 512 + j], m.values[i * cols + 512 + j]) << dtype_name(type) << " " << i << "," << j;
  }
}

TEST(CutTensor, ColumnsInsideABlockAreAClearError) {
  const Matrix m = random_matrix(DType::Q4_K, 2, 512, 3);
  std::vector<AlignedBuffer> storage;
  EXPECT_THROW(cut_tensor(m.t, {TensorCut::Cols, 128, 256}, storage), Error);
  EXPECT_THROW(cut_tensor(m.t, {TensorCut::Rows, 1, 2}, storage), Error);  // past the end
}

TEST(CutTensor, VectorsAreCutByColumns) {
  std::vector<float> bias(64);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.5f * static_cast<float>(i) - 3.0f;
  TensorData t{"b", DType::F32, {64}, bias.data()};
  std::vector<AlignedBuffer> storage;
  const TensorData part = cut_tensor(t, {TensorCut::Rows, 16, 32}, storage);
  ASSERT_EQ(part.cols(), 32);
  EXPECT_EQ(static_cast<const float*>(part.data)[0], bias[16]);
  EXPECT_EQ(static_cast<const float*>(part.data)[31], bias[47]);
}

// Gated DeltaNet under TP: a rank takes key heads and the value heads that
// read them, so that its local heads keep the file's order (tiled: value
// head h reads key head h % n_k; grouped: h / (n_v / n_k)).
TEST(ShardGeometry, GatedDeltaNetCutsByKeyHeadsAndTheirValueHeads) {
  ModelConfig c = config(4, 2, 512, 512);
  c.is_linear = {true, false, true, false};
  c.linear = {4, 8, 16, 16, 4, true};
  const ShardGeometry tiled = shard_geometry(c, shard(1, 2, 0, 1));
  EXPECT_EQ(tiled.lin.n_k_heads, 2);
  EXPECT_EQ(tiled.lin.n_v_heads, 4);
  EXPECT_EQ(tiled.lin_v_heads, (std::vector<int>{2, 3, 6, 7}));
  for (size_t h = 0; h < tiled.lin_v_heads.size(); ++h)  // local key head h % 2 is global key head 2 + h % 2
    EXPECT_EQ(tiled.lin_v_heads[h] % 4, 2 + static_cast<int>(h) % 2);
  const TensorCut qkv = tensor_cut(Slot::LinQkv, tiled, 1, c.head_dim);
  EXPECT_EQ(qkv.kind, TensorCut::GatherRows);
  // (Adjacent value heads make one run.)
  const std::vector<std::pair<int64_t, int64_t>> want{{32, 32}, {64 + 32, 32}, {128 + 2 * 16, 32}, {128 + 6 * 16, 32}};
  EXPECT_EQ(qkv.runs, want);
  const TensorCut conv = tensor_cut(Slot::LinConv, tiled, 1, c.head_dim);  // 4 taps per channel
  ASSERT_EQ(conv.runs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(conv.runs[i], std::make_pair(want[i].first * 4, want[i].second * 4));
  const TensorCut out = tensor_cut(Slot::LinOut, tiled, 1, c.head_dim);
  EXPECT_EQ(out.kind, TensorCut::GatherCols);
  EXPECT_EQ(out.runs, (std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {96, 32}}));
  EXPECT_EQ(tensor_cut(Slot::LinA, tiled, 1, c.head_dim).runs,
            (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {6, 2}}));
  EXPECT_EQ(tensor_cut(Slot::LinNorm, tiled, 1, c.head_dim).kind, TensorCut::All);
  EXPECT_EQ(tensor_cut(Slot::QGate, tiled, 1, c.head_dim).kind, TensorCut::Rows);

  c.linear.v_heads_tiled = false;
  const ShardGeometry grouped = shard_geometry(c, shard(1, 2, 0, 1));
  EXPECT_EQ(grouped.lin_v_heads, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(tensor_cut(Slot::LinZ, grouped, 1, c.head_dim).runs,
            (std::vector<std::pair<int64_t, int64_t>>{{64, 64}}));
  EXPECT_TRUE(shard_geometry(c, shard(0, 1, 0, 1)).lin_v_heads.empty());
  c.n_head = c.n_head_kv = 8;  // (so that the attention heads split 8 ways)
  try {
    shard_geometry(c, shard(0, 8, 0, 1));
    ADD_FAILURE() << "8 ranks for 4 key heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the model's 4 linear-attention key heads"),
              std::string::npos)
        << e.what();
  }
}

TEST(CutTensor, GatherTakesRunsOfRowsColumnsAndElementsInOrder) {
  std::vector<float> m(6 * 4);  // 6 rows of 4
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) + 0.5f;
  const TensorData t{"m", DType::F32, {4, 6}, m.data()};
  std::vector<AlignedBuffer> storage;
  // The part's values, row by row, and those at (row, column) of m.
  auto values = [](const TensorData& part) {
    const auto* d = static_cast<const float*>(part.data);
    return std::vector<float>(d, d + part.rows() * part.cols());
  };
  auto picked = [&](const std::vector<int>& rows, const std::vector<int>& cols) {
    std::vector<float> v;
    for (int r : rows)
      for (int c : cols) v.push_back(m[static_cast<size_t>(4 * r + c)]);
    return v;
  };
  TensorCut rows{TensorCut::GatherRows, 0, 0, {{4, 1}, {1, 2}}};
  const TensorData r = cut_tensor(t, rows, storage);
  ASSERT_EQ(r.rows(), 3);
  ASSERT_EQ(r.cols(), 4);
  EXPECT_EQ(values(r), picked({4, 1, 2}, {0, 1, 2, 3}));
  TensorCut cols{TensorCut::GatherCols, 0, 0, {{2, 2}, {0, 1}}};
  const TensorData cpart = cut_tensor(t, cols, storage);
  ASSERT_EQ(cpart.rows(), 6);
  ASSERT_EQ(cpart.cols(), 3);
  EXPECT_EQ(values(cpart), picked({0, 1, 2, 3, 4, 5}, {2, 3, 0}));
  const TensorData v{"v", DType::F32, {6}, m.data()};
  const TensorData vpart = cut_tensor(v, rows, storage);  // a vector: runs of elements
  ASSERT_EQ(vpart.cols(), 3);
  EXPECT_EQ(static_cast<const float*>(vpart.data)[0], m[4]);
  EXPECT_EQ(static_cast<const float*>(vpart.data)[2], m[2]);
  TensorCut outside{TensorCut::GatherRows, 0, 0, {{5, 2}}};
  EXPECT_THROW(cut_tensor(t, outside, storage), Error);
}

TEST(ShardGeometry, LayerPartitionSetsEachStagesLayers) {
  const ModelConfig c = config(8, 4, 512, 512, 5);
  const ModelShard s = shard(0, 1, 1, 3, {2, 1, 2});
  const ShardGeometry g = shard_geometry(c, s);
  EXPECT_EQ(g.layer_begin, 2);
  EXPECT_EQ(g.layer_end, 3);
  EXPECT_EQ(g.stage_layers, (std::vector<int>{2, 1, 2}));
  EXPECT_EQ(shard_geometry(c, shard(0, 1, 0, 2)).stage_layers, (std::vector<int>{2, 3}));  // none given: even
  auto error_of = [&](std::vector<int> partition) {
    try {
      shard_geometry(c, shard(0, 1, 0, 2, std::move(partition)));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({1, 1, 3}).find("gives 3 stages; --pipeline-parallel-size is 2"), std::string::npos);
  EXPECT_NE(error_of({2, 2}).find("adds up to 4 layers; the model has 5"), std::string::npos);
  EXPECT_NE(error_of({5, 0}).find("at least one layer"), std::string::npos);
}

TEST(BalancePipelineStages, EqualCostsSplitEvenlyAndAHeavyOutputShortensTheLastStage) {
  EXPECT_EQ(balance_pipeline_stages(std::vector<int64_t>(18, 10), 0, 2), (std::vector<int>{9, 9}));
  std::vector<int> seven = balance_pipeline_stages(std::vector<int64_t>(7, 10), 0, 3);
  std::sort(seven.begin(), seven.end());
  EXPECT_EQ(seven, (std::vector<int>{2, 2, 3}));
  // Gemma 3 270M's proportions: the output matrix weighs 30 layers.
  EXPECT_EQ(balance_pipeline_stages(std::vector<int64_t>(18, 10), 300, 2), (std::vector<int>{17, 1}));
  // TinyLlama's: 22 layers, the output about 1.5 layers.
  EXPECT_EQ(balance_pipeline_stages(std::vector<int64_t>(22, 10), 15, 2), (std::vector<int>{12, 10}));
  EXPECT_EQ(balance_pipeline_stages({5, 1, 1, 1, 1, 5}, 0, 3), (std::vector<int>{1, 4, 1}));
  EXPECT_THROW(balance_pipeline_stages(std::vector<int64_t>(2, 1), 0, 3), Error);
}

// Against every partition of small random problems: the costliest stage is
// the least possible, and among those the counts are the closest to even.
TEST(BalancePipelineStages, MatchesExhaustiveSearch) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9), stages = 1 + static_cast<int>(rng() % n);
    std::vector<int64_t> cost(n);
    for (auto& x : cost) x = 1 + static_cast<int64_t>(rng() % 20);
    const int64_t extra = static_cast<int64_t>(rng() % 60);
    auto score = [&](const std::vector<int>& counts) {
      int64_t worst = 0, uneven = 0;
      for (int st = 0, i = 0; st < stages; ++st) {
        int64_t c = st == stages - 1 ? extra : 0;
        for (int k = 0; k < counts[st]; ++k) c += cost[i++];
        worst = std::max(worst, c);
        const int64_t d = counts[st] - n / stages;
        uneven += d * d;
      }
      return std::pair{worst, uneven};
    };
    std::pair<int64_t, int64_t> best{INT64_MAX, INT64_MAX};
    std::vector<int> counts(stages, 1);
    // Every composition of n into `stages` positive parts.
    std::function<void(int, int)> visit = [&](int st, int left) {
      if (st == stages - 1) {
        counts[st] = left;
        best = std::min(best, score(counts));
        return;
      }
      for (int k = 1; k <= left - (stages - 1 - st); ++k) {
        counts[st] = k;
        visit(st + 1, left - k);
      }
    };
    visit(0, n);
    const std::vector<int> got = balance_pipeline_stages(cost, extra, stages);
    ASSERT_EQ(static_cast<int>(got.size()), stages);
    EXPECT_EQ(score(got), best) << "trial " << trial;
  }
}

// Asked to, Model::load balances stages by the bytes each one reads: a large
// output matrix leaves the last stage fewer layers; a small one, an even
// split. A given partition is kept as it is; by default the counts are equal.
TEST(ModelShard, LoadBalancesStagesByWeightBytesWhenAsked) {
  auto backend = make_cpu_backend(1);
  ThreadPool pool(1);
  auto stages_of = [&](int n_vocab, std::vector<int> partition, bool balance = true) {
    const ModelConfig cfg = dummy_config("tiny-gemma3", n_vocab);  // 6 layers, hidden 256, tied output
    auto src = make_dummy_source(cfg, {"tiny-gemma3", DType::F32, 1}, pool);
    auto last = Model::from_source(cfg, *src, *backend, {}, shard(0, 1, 1, 2, partition, balance));
    EXPECT_EQ(last->geometry().layer_end, cfg.n_layer);
    EXPECT_EQ(last->geometry().layer_end - last->geometry().layer_begin, last->geometry().stage_layers.back());
    return last->geometry().stage_layers;
  };
  // A layer holds about 0.5M weights; an output of 32768 x 256 is 8M.
  EXPECT_EQ(stages_of(32768, {}), (std::vector<int>{5, 1}));
  EXPECT_EQ(stages_of(512, {}), (std::vector<int>{3, 3}));
  EXPECT_EQ(stages_of(32768, {2, 4}), (std::vector<int>{2, 4}));
  EXPECT_EQ(stages_of(32768, {}, false), (std::vector<int>{3, 3}));
}

}  // namespace
}  // namespace pagellm
