// Elementwise, normalization, RoPE and attention kernels of the CPU backend.
// ops_impl.h holds one implementation; it is compiled three times
// (ops_scalar.cpp for baseline x86-64, ops_avx2.cpp with AVX2/FMA/F16C,
// ops_avx512.cpp with AVX-512 attention) and the backend picks a table at
// start-up. The scalar table is the reference the tests compare with.
#pragma once

#include <cstdint>

#include "core/cpu_features.h"

namespace pagellm::cpu {

// Partial attention result for one (query token, KV head group, KV range):
// per head the running max m, the softmax denominator l and the unnormalised
// output acc[head_dim] (flash-attention style), merged across ranges later.
struct AttnPartial {
  float* m;    // [group]
  float* l;    // [group]
  float* acc;  // [group, head_dim]
};

// A tile of query rows of one sequence that share KV head g: n_tokens
// consecutive tokens (positions pos0, pos0 + 1, ...) x `group` heads. Row
// r = t * group + h reads q + t * q_stride + h * head_dim.
struct AttnKV;

struct AttnTile {
  const float* q;
  int64_t q_stride;     // floats between consecutive tokens' q
  int n_tokens, group;
  int64_t pos0;
  int64_t j0, j1;       // key positions to visit; each row still masks j > its position + ahead
  int window;           // > 0: row at position p only sees keys j > p - window
  float scale, softcap;
  // Keys after a row's position it also sees: j <= p + ahead. 0: causal;
  // window - 1: a symmetric window (bidirectional sliding layers).
  int ahead = 0;
  // The unit the calling thread runs next (a hint; null: none). Its first
  // keys are fetched during this unit's last span: at decode the cache is
  // cold, and a unit's first span otherwise waits on memory.
  const AttnKV* next_kv = nullptr;
  int next_g = 0;
  int64_t next_j0 = 0, next_j1 = 0;
};

// The attention kernels' limits. 576: an MLA latent (DeepSeek's 512 + 64);
// 128 rows: its 128 query heads on one KV head.
constexpr int kAttnMaxHeadDim = 576, kAttnMaxBlock = 64, kAttnMaxRows = 128;

// Element type of a KV cache. I8 holds round(x / s) per element and a float
// scale s = max |x| / 127 per (token, KV head) vector.
enum class KVElem { F32, F16, I8 };

// What one attention call needs to find a sequence's keys and values.
struct AttnKV {
  const void* k;               // this layer's K cache, [num_blocks][block_heads][block_size][head_dim]
  const void* v;               // same layout for V
  KVElem elem;
  const float* k_scale;        // I8: [num_blocks][block_heads][block_size]; else null
  const float* v_scale;
  int n_kv_heads, block_size, head_dim;
  const int32_t* block_table;  // logical block -> physical block
  // Heads' room in a block: n_kv_heads, or more where the cache slot is
  // shared with a layer of bigger rows (core/kv_layout.h's kv_slot_shapes).
  int block_heads;
  // Dense keys (block_table null, F32; attention_kv): the sequence's key j
  // at k + j * key_stride and its value at v + j * key_stride, the pointers
  // already at its first token and this KV head; block_size keys are one
  // chunk. Values may then be shorter than keys (v_dim; 0: head_dim).
  int64_t key_stride = 0;
  int v_dim = 0;
};

// Where one token's K and V rows go (store_kv).
struct KVStore {
  void* k;
  void* v;
  KVElem elem;
  float* k_scale;  // I8 only
  float* v_scale;
  int n_kv_heads, block_size, head_dim;
  int block_heads;  // as AttnKV's
};

struct OpsTable {
  void (*rms_norm)(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* y);
  // x[n_tokens, n_heads, head_dim]; cos_sin[n_tokens, n_rot / 2, 2].
  void (*rope)(float* x, int64_t n_tokens, int n_heads, int head_dim, int n_rot, bool neox, const float* cos_sin);
  void (*glu)(const float* gate, const float* up, int64_t n, int act, float* out);  // act: 0 silu, 1 gelu-tanh, 2 swiglu-oai
  void (*add)(float* y, const float* x, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*add_rows)(float* y, const float* b, int64_t n_rows, int64_t dim);  // y[r] += b
  // Online-softmax attention of a tile's rows over keys [j0, j1) of KV head g,
  // causal (and windowed) per row; writes the partial (m, l, acc) of each row.
  // Rows that see no key in the range get m = -inf, l = 0, acc = 0.
  void (*attend)(const AttnTile& tile, const AttnKV& kv, int g, AttnPartial out);
  // Writes one token's rows of K and V (n_kv_heads * head_dim each) at
  // `slot`, quantized as they go into an I8 cache.
  void (*store_kv)(const KVStore& cache, int64_t slot, const float* k, const float* v);
};

const OpsTable& ops_table(Isa isa);
const OpsTable& ops_scalar();
const OpsTable& ops_avx2();
const OpsTable& ops_avx512();

}  // namespace pagellm::cpu
