// One rank's share of a model under tensor parallelism (attention heads, FFN
// hidden units and the vocabulary split tp_size ways: Megatron's column- and
// row-parallel layers) and pipeline parallelism (a contiguous range of
// layers per stage). The loader cuts each tensor as it maps it; the forward
// pass runs on the local sizes and all-reduces where a row-parallel product
// leaves partial sums.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/aligned_buffer.h"
#include "model/arch.h"
#include "model/model_config.h"

namespace pagellm {

struct ModelShard {
  int tp_rank = 0, tp_size = 1;
  int pp_rank = 0, pp_size = 1;
  // Layers of each pipeline stage, in order (pp_size counts summing to the
  // model's layers). Empty: equal counts, or with balance_stages, counts
  // Model::load balances by the bytes of weights each stage reads per token
  // (balance_pipeline_stages).
  std::vector<int> layer_partition;
  bool balance_stages = false;
};

// The local sizes of a shard. Attention heads: each rank takes n_head /
// tp_size query heads and the KV heads they read: n_head_kv / tp_size of
// them, or one (replicated) when there are fewer KV heads than ranks.
// Multi-head latent attention has one KV head (the latent) on every rank.
struct ShardGeometry {
  int n_head = 0, head_begin = 0;
  int n_head_kv = 0, kv_head_begin = 0;
  // Rows of Q and columns of O per query head: head_dim, except under MLA
  // (q_head_dim and v_head_dim; its head_dim is the latent's). 0: head_dim.
  int64_t q_rows_per_head = 0, o_cols_per_head = 0;
  int64_t n_ff = 0, ff_begin = 0;            // dense FFN
  int64_t n_ff_exp = 0, ff_exp_begin = 0;    // each routed expert
  int64_t n_ff_shexp = 0, ff_shexp_begin = 0;  // the shared expert
  // Vocabulary rows [vocab_begin, vocab_begin + n_vocab); every rank's slice
  // but the last has vocab_stride rows (ceil(n_vocab / tp_size)).
  int64_t n_vocab = 0, vocab_begin = 0, vocab_stride = 0;
  // Gated DeltaNet layers: this rank's key heads (n_k_heads / tp_size from
  // lin_k_begin) and the value heads that read them, as ModelConfig::LinearAttn
  // with the local counts (the value heads keep the file's order, tiled or
  // grouped, among themselves); lin_v_heads lists their global numbers in
  // local order (empty without tensor parallelism).
  ModelConfig::LinearAttn lin;
  int lin_k_begin = 0, lin_all_k_heads = 0;
  std::vector<int> lin_v_heads;
  // Layers of their own shape (Gemma 4's global layers, its double-wide
  // FFN): each layer's local KV heads and FFN units, cut as the uniform ones
  // are. Empty when the layers are alike.
  std::vector<int> layer_n_head_kv, layer_kv_head_begin;
  std::vector<int64_t> layer_n_ff, layer_ff_begin;
  int layer_begin = 0, layer_end = 0;        // this pipeline stage's layers
  std::vector<int> stage_layers;             // every stage's layer count (KV blocks are sized for the largest)
  bool first_stage = true, last_stage = true;
  bool tp = false;
  bool has_layer(int il) const { return il >= layer_begin && il < layer_end; }
  int kv_heads(int il) const { return layer_n_head_kv.empty() ? n_head_kv : layer_n_head_kv[static_cast<size_t>(il)]; }
  int64_t ff_units(int il) const { return layer_n_ff.empty() ? n_ff : layer_n_ff[static_cast<size_t>(il)]; }
  // This geometry with layer il's KV heads and FFN units (to cut its tensors).
  ShardGeometry for_layer(int il) const;
};

// Fails with an error naming the size that does not divide.
ShardGeometry shard_geometry(const ModelConfig& c, const ModelShard& s);

// Contiguous layer counts of `stages` pipeline stages (each at least one
// layer) that minimise the cost of the costliest stage, the last stage also
// paying `last_stage_extra` (the output matrix). Under pipelining the
// costliest stage sets the pace, so equal layer counts waste the others'
// time when the output matrix is large next to a layer (Gemma 3 270M: 168M
// of its 268M parameters) in decode; prefill, which computes the output for
// one row per sequence, is balanced by equal counts. Ties go to the
// partition closest to even.
std::vector<int> balance_pipeline_stages(const std::vector<int64_t>& layer_cost, int64_t last_stage_extra,
                                         int stages);

// The part of a tensor a rank holds: all of it, a range of rows (output
// features) or of columns (input features), nothing, or (Stack, for a
// stack of per-head matrices such as MLA's absorbed ones) a range of the
// stacked matrices, each whole.
struct TensorCut {
  enum Kind { All, Rows, Cols, None, Stack, GatherRows, GatherCols } kind = All;
  int64_t begin = 0, count = 0;
  // GatherRows / GatherCols: the runs [begin, begin + count) of rows (of
  // elements, for a vector) or columns kept, in order (a copy).
  std::vector<std::pair<int64_t, int64_t>> runs;
};
TensorCut tensor_cut(Slot slot, const ShardGeometry& g, int tp_rank, int head_dim);

// The cut applied to t: rows are a view of the same bytes; columns of a
// matrix are copied into a new buffer kept in `storage` (block-quantized
// types split only on block boundaries). A vector (one row) is cut by
// columns whichever kind is asked.
TensorData cut_tensor(const TensorData& t, const TensorCut& cut, std::vector<AlignedBuffer>& storage);

}  // namespace pagellm
