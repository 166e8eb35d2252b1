#include "model/shard.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/error.h"

namespace pagellm {

ShardGeometry shard_geometry(const ModelConfig& c, const ModelShard& s) {
  const int n = s.tp_size, r = s.tp_rank;
  PAGELLM_CHECK(n >= 1 && r >= 0 && r < n, "tensor-parallel rank {} of {}", r, n);
  PAGELLM_CHECK(s.pp_size >= 1 && s.pp_rank >= 0 && s.pp_rank < s.pp_size, "pipeline stage {} of {}", s.pp_rank,
                s.pp_size);
  ShardGeometry g;
  g.tp = n > 1;
  PAGELLM_CHECK(c.n_head % n == 0, "--tensor-parallel-size {} does not divide the model's {} attention heads", n,
                c.n_head);
  g.n_head = c.n_head / n;
  g.head_begin = r * g.n_head;
  // A rank's KV heads: n_kv / tp_size of them, or the one (replicated) its
  // query heads read when there are fewer KV heads than ranks.
  auto kv_split = [&](int n_kv, int& local, int& begin) {
    if (n_kv % n == 0) {
      local = n_kv / n;
      begin = r * local;
      return;
    }
    PAGELLM_CHECK(n % n_kv == 0, "--tensor-parallel-size {} neither divides nor is a multiple of the model's {} KV "
                  "heads", n, n_kv);
    local = 1;
    begin = g.head_begin / (c.n_head / n_kv);
  };
  kv_split(c.n_head_kv, g.n_head_kv, g.kv_head_begin);
  if (c.is_mla()) {
    g.q_rows_per_head = c.mla.q_head_dim();
    g.o_cols_per_head = c.mla.v_head_dim;
  }
  auto split = [&](int64_t total, const char* what, int64_t& local, int64_t& begin) {
    if (total == 0) return;
    PAGELLM_CHECK(total % n == 0, "--tensor-parallel-size {} does not divide the model's {} {}", n, total, what);
    local = total / n;
    begin = r * local;
  };
  g.lin = c.linear;
  if (c.n_linear_layers() > 0 && n > 1) {
    const ModelConfig::LinearAttn& la = c.linear;
    PAGELLM_CHECK(la.n_k_heads % n == 0, "--tensor-parallel-size {} does not divide the model's {} linear-attention "
                  "key heads", n, la.n_k_heads);
    const int nk = la.n_k_heads / n, per_k = la.n_v_heads / la.n_k_heads;
    g.lin.n_k_heads = nk;
    g.lin.n_v_heads = nk * per_k;
    g.lin_k_begin = r * nk;
    g.lin_all_k_heads = la.n_k_heads;
    // Local value head h' reads local key head h' % nk (tiled) or h' / per_k
    // (grouped), as its global one reads the global key head.
    if (la.v_heads_tiled) {
      for (int j = 0; j < per_k; ++j)
        for (int i = 0; i < nk; ++i) g.lin_v_heads.push_back(j * la.n_k_heads + g.lin_k_begin + i);
    } else {
      for (int i = 0; i < nk; ++i)
        for (int j = 0; j < per_k; ++j) g.lin_v_heads.push_back((g.lin_k_begin + i) * per_k + j);
    }
  }
  split(c.n_ff, "feed-forward units", g.n_ff, g.ff_begin);
  if (!c.layers_alike()) {
    for (int il = 0; il < c.n_layer; ++il) {
      int kv = 0, kv_begin = 0;
      int64_t ff = 0, ff_begin = 0;
      kv_split(c.layer_n_head_kv(il), kv, kv_begin);
      split(c.layer_ff(il), "feed-forward units", ff, ff_begin);
      g.layer_n_head_kv.push_back(kv);
      g.layer_kv_head_begin.push_back(kv_begin);
      g.layer_n_ff.push_back(ff);
      g.layer_ff_begin.push_back(ff_begin);
    }
  }
  split(c.n_ff_exp, "feed-forward units per expert", g.n_ff_exp, g.ff_exp_begin);
  split(c.n_ff_shexp, "shared-expert units", g.n_ff_shexp, g.ff_shexp_begin);
  PAGELLM_CHECK(c.n_vocab >= n, "a vocabulary of {} tokens does not split {} ways", c.n_vocab, n);
  g.vocab_stride = (c.n_vocab + n - 1) / n;
  g.vocab_begin = std::min<int64_t>(c.n_vocab, g.vocab_stride * r);
  g.n_vocab = std::min<int64_t>(c.n_vocab, g.vocab_begin + g.vocab_stride) - g.vocab_begin;
  PAGELLM_CHECK(g.n_vocab > 0, "a vocabulary of {} tokens leaves rank {} of {} no rows", c.n_vocab, r, n);
  PAGELLM_CHECK(c.n_layer >= s.pp_size, "--pipeline-parallel-size {} exceeds the model's {} layers", s.pp_size,
                c.n_layer);
  if (s.layer_partition.empty()) {
    for (int st = 0; st < s.pp_size; ++st)
      g.stage_layers.push_back(static_cast<int>(static_cast<int64_t>(c.n_layer) * (st + 1) / s.pp_size -
                                                static_cast<int64_t>(c.n_layer) * st / s.pp_size));
  } else {
    PAGELLM_CHECK(static_cast<int>(s.layer_partition.size()) == s.pp_size,
                  "--pipeline-layer-partition gives {} stages; --pipeline-parallel-size is {}",
                  s.layer_partition.size(), s.pp_size);
    int64_t sum = 0;
    for (int n : s.layer_partition) {
      PAGELLM_CHECK(n >= 1, "--pipeline-layer-partition: every stage needs at least one layer, got {}", n);
      sum += n;
    }
    PAGELLM_CHECK(sum == c.n_layer, "--pipeline-layer-partition adds up to {} layers; the model has {}", sum,
                  c.n_layer);
    g.stage_layers = s.layer_partition;
  }
  for (int st = 0; st < s.pp_rank; ++st) g.layer_begin += g.stage_layers[st];
  g.layer_end = g.layer_begin + g.stage_layers[s.pp_rank];
  g.first_stage = s.pp_rank == 0;
  g.last_stage = s.pp_rank == s.pp_size - 1;
  return g;
}

ShardGeometry ShardGeometry::for_layer(int il) const {
  ShardGeometry g = *this;
  if (layer_n_head_kv.empty()) return g;
  const auto i = static_cast<size_t>(il);
  g.n_head_kv = layer_n_head_kv[i];
  g.kv_head_begin = layer_kv_head_begin[i];
  g.n_ff = layer_n_ff[i];
  g.ff_begin = layer_ff_begin[i];
  return g;
}

std::vector<int> balance_pipeline_stages(const std::vector<int64_t>& layer_cost, int64_t last_stage_extra,
                                         int stages) {
  const int n = static_cast<int>(layer_cost.size());
  PAGELLM_CHECK(stages >= 1 && stages <= n, "{} pipeline stages for {} layers", stages, n);
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_cost[i];
  auto cost = [&](int begin, int end, bool last) {
    return prefix[end] - prefix[begin] + (last ? last_stage_extra : 0);
  };
  // Two passes over (stage, layers so far). First the least cost of the
  // costliest stage, W; then, among partitions with every stage within W,
  // the one whose counts are the closest to even (least sum of squared
  // deviations): each pass's quantity is optimal over prefixes.
  constexpr int64_t kInf = INT64_MAX;
  using Table = std::vector<std::vector<int64_t>>;
  auto solve = [&](auto&& combine, int64_t limit, std::vector<std::vector<int>>* cuts) {
    Table best(stages + 1, std::vector<int64_t>(n + 1, kInf));
    best[0][0] = 0;
    for (int st = 1; st <= stages; ++st) {
      const bool last = st == stages;
      for (int i = st; i <= n - (stages - st); ++i) {
        if (last && i != n) continue;
        for (int j = st - 1; j < i; ++j) {
          if (best[st - 1][j] == kInf || cost(j, i, last) > limit) continue;
          const int64_t v = combine(best[st - 1][j], j, i, last);
          if (v < best[st][i]) {
            best[st][i] = v;
            if (cuts) (*cuts)[st][i] = j;
          }
        }
      }
    }
    return best[stages][n];
  };
  const int64_t worst = solve([&](int64_t prev, int j, int i, bool last) { return std::max(prev, cost(j, i, last)); },
                              kInf, nullptr);
  const int64_t even = n / stages;
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  solve([&](int64_t prev, int j, int i, bool) { return prev + (i - j - even) * (i - j - even); }, worst, &cut);
  std::vector<int> counts(stages);
  for (int st = stages, i = n; st >= 1; --st) {
    const int j = cut[st][i];
    counts[st - 1] = i - j;
    i = j;
  }
  return counts;
}

TensorCut tensor_cut(Slot slot, const ShardGeometry& g, int tp_rank, int head_dim) {
  using K = TensorCut::Kind;
  const int64_t hd = head_dim;
  const int64_t q_hd = g.q_rows_per_head > 0 ? g.q_rows_per_head : hd;
  const int64_t o_hd = g.o_cols_per_head > 0 ? g.o_cols_per_head : hd;
  switch (slot) {
    case Slot::TokEmbd:
    case Slot::PleTokEmbd:
    case Slot::Output:
      if (!g.tp) return {};
      return {K::Rows, g.vocab_begin, g.n_vocab};
    default: break;
  }
  if (!g.tp) return {};
  switch (slot) {
    // Column-parallel: each rank computes its heads / units.
    case Slot::Q:
    case Slot::QGate:
    case Slot::QBias: return {K::Rows, g.head_begin * q_hd, g.n_head * q_hd};
    case Slot::MlaQAbsorb:
    case Slot::MlaOAbsorb:
    case Slot::MlaKvExpand: return {K::Stack, g.head_begin, g.n_head};
    case Slot::AttnSinks: return {K::Rows, g.head_begin, g.n_head};
    case Slot::K:
    case Slot::V:
    case Slot::KBias:
    case Slot::VBias: return {K::Rows, g.kv_head_begin * hd, g.n_head_kv * hd};
    case Slot::Gate:
    case Slot::Up: return {K::Rows, g.ff_begin, g.n_ff};
    case Slot::GateExps:
    case Slot::UpExps:
    case Slot::GateExpsBias:
    case Slot::UpExpsBias: return {K::Rows, g.ff_exp_begin, g.n_ff_exp};
    case Slot::GateShexp:
    case Slot::UpShexp: return {K::Rows, g.ff_shexp_begin, g.n_ff_shexp};
    // Row-parallel: each rank multiplies its share of the inputs; the sum
    // over ranks (one all-reduce) is the product.
    case Slot::O: return {K::Cols, g.head_begin * o_hd, g.n_head * o_hd};
    case Slot::Down: return {K::Cols, g.ff_begin, g.n_ff};
    case Slot::DownExps: return {K::Cols, g.ff_exp_begin, g.n_ff_exp};
    case Slot::DownShexp: return {K::Cols, g.ff_shexp_begin, g.n_ff_shexp};
    // Added to each expert's output before the sum over ranks: one rank only.
    case Slot::DownExpsBias: return tp_rank == 0 ? TensorCut{} : TensorCut{K::None, 0, 0};
    default: break;
  }
  if (!g.lin_v_heads.empty()) {
    // Gated DeltaNet: this rank's key heads' q and k and its value heads,
    // wherever the file keeps them.
    const ModelConfig::LinearAttn& l = g.lin;
    const int64_t dk = l.head_k_dim, dv = l.head_v_dim, key_dim = static_cast<int64_t>(l.n_k_heads) * dk;
    const int64_t global_keys = static_cast<int64_t>(g.lin_all_k_heads) * dk;
    auto per_v = [&](K kind, int64_t first, int64_t unit) {  // adjacent heads in one run (whole quantization blocks)
      TensorCut c;
      c.kind = kind;
      for (int v : g.lin_v_heads) {
        if (!c.runs.empty() && c.runs.back().first + c.runs.back().second == first + v * unit)
          c.runs.back().second += unit;
        else
          c.runs.emplace_back(first + v * unit, unit);
      }
      return c;
    };
    switch (slot) {
      case Slot::LinQkv:
      case Slot::LinConv: {  // [q | k | v]: rows of qkv; channels of the conv (a vector, conv_kernel taps each)
        const int64_t unit = slot == Slot::LinConv ? l.conv_kernel : 1;
        TensorCut c = per_v(K::GatherRows, 2 * global_keys * unit, dv * unit);
        c.runs.insert(c.runs.begin(), {(global_keys + g.lin_k_begin * dk) * unit, key_dim * unit});
        c.runs.insert(c.runs.begin(), {g.lin_k_begin * dk * unit, key_dim * unit});
        return c;
      }
      case Slot::LinZ: return per_v(K::GatherRows, 0, dv);
      case Slot::LinBeta:
      case Slot::LinAlpha:
      case Slot::LinA:
      case Slot::LinDtBias: return per_v(K::GatherRows, 0, 1);
      case Slot::LinOut: return per_v(K::GatherCols, 0, dv);
      default: break;
    }
  }
  return {};  // norms, the router, biases added after the all-reduce
}

// Run [b, b + n) must lie in the tensor's rows (by_rows) or columns; a
// column run must keep quantization blocks whole.
static void check_run(const TensorData& t, int64_t b, int64_t n, bool by_rows) {
  const int64_t limit = by_rows ? t.rows() : t.cols();
  PAGELLM_CHECK(b >= 0 && n > 0 && b + n <= limit, "tensor '{}': slice [{}, {}) outside its {} {}", t.name, b, b + n,
                limit, by_rows ? "rows" : "columns");
  const int block = dtype_block_size(t.type);
  PAGELLM_CHECK(by_rows || (b % block == 0 && n % block == 0),
                "tensor '{}' ({}) cannot be split at column {}: {} blocks are {} values wide; choose a "
                "--tensor-parallel-size that divides its blocks",
                t.name, dtype_name(t.type), b, dtype_name(t.type), block);
}

// The runs of rows (by_rows) or columns, copied in order into one buffer kept in storage.
static TensorData copy_runs(const TensorData& t, const std::vector<std::pair<int64_t, int64_t>>& runs, bool by_rows,
                            std::vector<AlignedBuffer>& storage) {
  int64_t kept = 0;
  for (const auto& run : runs) kept += run.second;
  const auto* base = static_cast<const uint8_t*>(t.data);
  const size_t row_bytes = dtype_row_bytes(t.type, t.cols());
  TensorData out = t;
  AlignedBuffer buf;
  if (by_rows) {
    buf = allocate_aligned(row_bytes * static_cast<size_t>(kept));
    size_t at = 0;
    for (const auto& [b, n] : runs) {
      std::memcpy(buf.get() + at, base + row_bytes * static_cast<size_t>(b), row_bytes * static_cast<size_t>(n));
      at += row_bytes * static_cast<size_t>(n);
    }
    out.shape = {t.cols(), kept};
  } else {
    const int64_t rows = t.rows();
    const size_t keep = dtype_row_bytes(t.type, kept);
    buf = allocate_aligned(keep * static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      size_t at = keep * static_cast<size_t>(i);
      for (const auto& [b, n] : runs) {
        const size_t skip = dtype_row_bytes(t.type, b), bytes = dtype_row_bytes(t.type, n);
        std::memcpy(buf.get() + at, base + row_bytes * static_cast<size_t>(i) + skip, bytes);
        at += bytes;
      }
    }
    out.shape[0] = kept;
  }
  out.data = buf.get();
  storage.push_back(std::move(buf));
  return out;
}

TensorData cut_tensor(const TensorData& t, const TensorCut& cut, std::vector<AlignedBuffer>& storage) {
  if (cut.kind == TensorCut::All) return t;
  PAGELLM_CHECK(cut.kind != TensorCut::None, "tensor '{}' is not held by this rank", t.name);
  PAGELLM_CHECK(cut.kind != TensorCut::Stack, "tensor '{}': a stack is cut by its matrices, not within one",
                t.name);
  // A vector (one row) is cut by its columns whichever kind is asked.
  const bool vector = t.rows() == 1;
  const bool by_rows = (cut.kind == TensorCut::Rows || cut.kind == TensorCut::GatherRows) && !vector;
  if (cut.kind == TensorCut::GatherRows || cut.kind == TensorCut::GatherCols) {
    for (const auto& [b, n] : cut.runs) check_run(t, b, n, by_rows);
    return copy_runs(t, cut.runs, by_rows, storage);
  }
  check_run(t, cut.begin, cut.count, by_rows);
  // One range of rows, or of a vector's elements: a view of the same bytes.
  TensorData out = t;
  const auto* base = static_cast<const uint8_t*>(t.data);
  if (by_rows) {
    out.shape = {t.cols(), cut.count};
    out.data = base + static_cast<size_t>(cut.begin) * dtype_row_bytes(t.type, t.cols());
    return out;
  }
  if (vector) {
    out.shape[0] = cut.count;
    out.data = base + dtype_row_bytes(t.type, cut.begin);
    return out;
  }
  return copy_runs(t, {{cut.begin, cut.count}}, false, storage);
}

}  // namespace pagellm
