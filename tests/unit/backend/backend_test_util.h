// Helpers of the backend tests (the op suite every backend passes, and the
// OpenCL backend's own cases): random data, the error measure, the backend's
// own copies in and out, reference weights, and small batches and caches.
// Nothing here knows a particular backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/quant_blocks.h"

namespace pagellm::backend_test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||got - ref|| / ||ref||.
inline double rel_l2(const std::vector<float>& got, const std::vector<double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A backend buffer holding v. Synchronizes: v may go away afterwards.
inline BufferPtr upload(Backend& be, const std::vector<float>& v) {
  BufferPtr b = be.alloc(DType::F32, v.size());
  be.copy_from_host(v.data(), *b, 0, v.size() * sizeof(float));
  be.synchronize();
  return b;
}

inline std::vector<float> download(Backend& be, const Buffer& b, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(b, 0, n * sizeof(float), v.data());
  be.synchronize();
  return v;
}

// Rows of `cols` values of x in `type` by the reference quantizer, and back.
inline std::vector<uint8_t> quantize_rows(DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> q(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row_ref(t, x.data() + r * cols, q.data() + r * row_bytes, cols);
  return q;
}

inline std::vector<float> dequantize_rows(DType t, const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row_ref(t, q.data() + r * row_bytes, w.data() + r * cols, cols);
  return w;
}

// A [rows, cols] weight of `type` quantized from random values; `dequant`
// gets what the file holds, dequantized by the reference. The bytes are gone
// on return: only for backends that copy at upload (the CPU borrows them).
inline std::unique_ptr<Weight> random_weight(Backend& be, DType type, int64_t rows, int64_t cols, uint32_t seed,
                                             std::vector<float>* dequant, const std::string& name = "w") {
  const auto q = quantize_rows(type, randn(static_cast<size_t>(rows * cols), seed, 0.5f), rows, cols);
  if (dequant) *dequant = dequantize_rows(type, q, rows, cols);
  TensorData t{name, type, {cols, rows}, q.data()};
  return be.upload(t);
}

// In place on one head: the first n_rot dims rotate, at position pos.
inline void rope_ref(double* v, int64_t pos, int n_rot, bool neox, double base, double scale, const float* factors) {
  const int half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    double f = std::pow(base, -2.0 * i / n_rot);
    if (factors) f /= factors[i];
    const double th = pos * scale * f, c = std::cos(th), s = std::sin(th);
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const double x = v[a], y = v[b];
    v[a] = x * c - y * s;
    v[b] = x * s + y * c;
  }
}

// An attention case: heads, cache block size, sliding window (0: none),
// softcap (0: none), F16 or F32 cache, and each sequence's (q_len, ctx_len).
struct AttnCase {
  int n_head, n_kv, head_dim, block;
  int window;
  float softcap;
  bool f16;
  std::vector<std::pair<int, int>> seqs;
  bool neox = true;  // RoPE pairing, where the case rotates k
  bool sinks = false;  // per-head sink logits (where the backend supports them)
  bool int8 = false;   // an int8 cache (f16 ignored), where the backend has one
  // Sliding KV eviction: keys [evict_sinks, evict_to) of every sequence are gone.
  int evict_sinks = 0, evict_to = 0;
  bool v_is_k = false;  // no V stored: the values are the keys (an MLA latent), where the backend can
  bool non_causal = false;  // every query sees every key of its sequence (an encoder's attention)
};

inline void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "h" << c.n_head << " kv" << c.n_kv << " D" << c.head_dim << " block" << c.block << " window" << c.window
      << " softcap" << c.softcap << (c.int8 ? " int8" : c.f16 ? " f16" : " f32") << (c.sinks ? " sinks" : "");
}

// A paged cache of num_blocks blocks of 16 tokens.
inline KVCacheSpec cache_spec(int n_layers, int n_kv_heads, int head_dim, int num_blocks, DType dtype = DType::F32) {
  KVCacheSpec spec;
  spec.n_layers = n_layers;
  spec.n_kv_heads = n_kv_heads;
  spec.head_dim = head_dim;
  spec.block_size = 16;
  spec.num_blocks = num_blocks;
  spec.dtype = dtype;
  return spec;
}

// One sequence of n tokens at positions 0 .. n-1 over `table`, all computed
// this step (a prompt), in blocks of `block_size`.
inline BatchInfo one_sequence(int n, const std::vector<int32_t>& table, int block_size) {
  BatchInfo b;
  SeqInfo s;
  s.q_start = 0;
  s.q_len = n;
  s.ctx_len = n;
  s.block_table = table;
  b.seqs.push_back(s);
  for (int t = 0; t < n; ++t) {
    b.token_ids.push_back(0);
    b.positions.push_back(t);
    b.slot_mapping.push_back(static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size);
  }
  return b;
}

}  // namespace pagellm::backend_test
