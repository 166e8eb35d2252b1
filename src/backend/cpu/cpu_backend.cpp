// The CPU backend: threads, weights (matmul kernels in matmul.h), the paged KV
// cache in host memory, and the ops of ops.h dispatched by ISA.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>

#include "backend/backend.h"
#include "backend/c_export.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/encoder_ops.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/linear_attention.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "core/util.h"
#include "sampling/sampler.h"
#include "backend/registry.h"

namespace pagellm {

namespace {

// Activation memory: 64-byte aligned host memory.
class CpuBuffer : public Buffer {
 public:
  CpuBuffer(DType type, size_t n) : Buffer(type, n), mem_(allocate_aligned(std::max<size_t>(bytes(), 1))) {}
  uint8_t* bytes_ptr() { return mem_.get(); }
  const uint8_t* bytes_ptr() const { return mem_.get(); }

 private:
  AlignedBuffer mem_;
};

// An op's buffer as T values (F32 for nearly every op, I32 for expert ids);
// `need` elements must fit.
template <typename T>
T* values(Buffer& b, DType want, int64_t need) {
  PAGELLM_CHECK(b.dtype() == want, "cpu backend: an op got a {} buffer ({} expected)", dtype_name(b.dtype()),
                dtype_name(want));
  PAGELLM_CHECK(need >= 0 && static_cast<size_t>(need) <= b.size(), "cpu backend: buffer of {} values, op needs {}",
                b.size(), need);
  return reinterpret_cast<T*>(static_cast<CpuBuffer&>(b).bytes_ptr());
}
float* f32(Buffer& b, int64_t need) { return values<float>(b, DType::F32, need); }
const float* f32(const Buffer& b, int64_t need) { return f32(const_cast<Buffer&>(b), need); }
int32_t* i32(Buffer& b, int64_t need) { return values<int32_t>(b, DType::I32, need); }
const int32_t* i32(const Buffer& b, int64_t need) { return i32(const_cast<Buffer&>(b), need); }

size_t meminfo_bytes(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string k, unit;
  size_t kb = 0;
  while (in >> k >> kb >> unit)
    if (k == key) return kb * 1024;
  return 0;
}

class CpuWeight : public Weight {
 public:
  ~CpuWeight() override {
    if (matrix && repacked_total) *repacked_total -= matrix->packed_bytes();
  }
  std::unique_ptr<cpu::MatmulWeight> matrix;  // for matrices
  std::vector<float> vec;                     // for vectors (norms, biases, rope factors)
  std::vector<uint16_t> bf16;                 // an F16 matrix rounded to BF16 (f16_as_bf16), which matrix reads
  // The backend's count of repacked bytes (LoRA slots replace their weights
  // at run time); shared, so a weight may outlive the backend.
  std::shared_ptr<std::atomic<size_t>> repacked_total;
};

const CpuWeight& as_cpu(const Weight& w) { return static_cast<const CpuWeight&>(w); }

// Keys per attention split in the deterministic mode: long enough that a
// split's merge costs little next to its keys, short enough that one long
// decode still spreads over the threads.
constexpr int64_t kDeterministicSplit = 256;

// Op categories of the profile breakdown.
enum Category { kMatmul, kAttention, kOther, kNumCategories };

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : pool_(o.threads), isa_(cpu_features().best()), ops_(&cpu::ops_table(isa_)), exact_matmul_(o.exact_matmul),
        repack_(o.repack), f16_as_bf16_(o.f16_as_bf16) {}

  std::string name() const override { return "cpu"; }
  std::string describe() const override {
    const int64_t repacked = static_cast<int64_t>(repacked_bytes_->load());
    const std::string layout = !repack_      ? ", weights not repacked (--no-repack)"
                               : repacked > 0 ? fmt::format(", {} of weights repacked at load", format_bytes(repacked))
                                              : std::string();
    return fmt::format("cpu ({} threads, {}{}{}{}{}; cpu has {})", pool_.size(), cpu::describe_kernels(isa_),
                       exact_matmul_ ? ", exact float matmul" : "", deterministic_ ? ", deterministic" : "",
                       f16_as_bf16_ ? ", F16 matrices as BF16 (--dtype bfloat16)" : "", layout,
                       cpu_features().describe());
  }

  MemoryInfo memory_info() const override {
    MemoryInfo m;
    m.total_bytes = meminfo_bytes("MemTotal:");
    m.free_bytes = meminfo_bytes("MemAvailable:");
    if (m.total_bytes == 0) m.total_bytes = m.free_bytes = size_t{4} << 30;  // no /proc: assume 4 GiB
    m.host_memory = true;
    return m;
  }

  BufferPtr alloc(DType type, size_t n) override {
    PAGELLM_CHECK(dtype_size(type) > 0, "cpu backend: no buffers of block type {}", dtype_name(type));
    return std::make_unique<CpuBuffer>(type, n);
  }
  void copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) override {
    PAGELLM_CHECK(offset <= dst.bytes() && bytes <= dst.bytes() - offset, "cpu backend: copy past the buffer's end");
    std::memcpy(static_cast<CpuBuffer&>(dst).bytes_ptr() + offset, src, bytes);
  }
  void copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) override {
    PAGELLM_CHECK(offset <= src.bytes() && bytes <= src.bytes() - offset, "cpu backend: copy past the buffer's end");
    std::memcpy(dst, static_cast<const CpuBuffer&>(src).bytes_ptr() + offset, bytes);
  }
  void synchronize() override {}  // every op is done when it returns

  bool supports(Feature f) const override {
    return f == Feature::MixtureOfExperts || f == Feature::AttentionSinks || f == Feature::Deterministic ||
           f == Feature::KvEviction || f == Feature::KvGroups || f == Feature::LinearAttention ||
           f == Feature::KvVIsK || f == Feature::KvLayerShapes || f == Feature::NonCausalAttention ||
           f == Feature::SymmetricWindowAttention || f == Feature::KvBlockIO;
  }
  // Matmuls, norms and the elementwise ops already give a row the same bits
  // whatever the batch and threads; attention's key-range splits are what
  // this fixes (see attention()).
  void set_deterministic(bool on) override { deterministic_ = on; }
  bool deterministic() const override { return deterministic_; }
  bool supports_weight(DType t) const override { return cpu::matmul_supported(t); }

  std::unique_ptr<Weight> upload(const TensorData& t) override {
    auto w = std::make_unique<CpuWeight>();
    w->type = t.type;
    w->rows = t.rows();
    w->cols = t.cols();
    w->name = t.name;
    if (t.shape.size() == 1) {
      w->vec.resize(static_cast<size_t>(w->cols));
      cpu::dequantize_row_ref(t.type, t.data, w->vec.data(), w->cols);
      w->type = DType::F32;
      w->held_type = DType::F32;
      w->held_bytes = w->vec.size() * sizeof(float);
    } else {
      if (!cpu::matmul_supported(t.type))
        fail("tensor '{}' has type {}, which the CPU backend cannot multiply", t.name, dtype_name(t.type));
      cpu::PrepareOptions prep;
      prep.repack = repack_;
      prep.threads = pool_.size();
      const void* data = t.data;
      if (f16_as_bf16_ && t.type == DType::F16) {
        // Every path (panels, rows, embedding lookups) then reads the same BF16 values.
        const auto* h = static_cast<const uint16_t*>(t.data);
        w->bf16.resize(static_cast<size_t>(w->rows * w->cols));
        pool_.parallel_for(static_cast<int64_t>(w->bf16.size()), [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) w->bf16[static_cast<size_t>(i)] = fp32_to_bf16(fp16_to_fp32(h[i]));
        }, 64, 1 << 16);
        w->type = DType::BF16;
        data = w->bf16.data();
      }
      w->matrix = cpu::prepare_matmul_weight(w->type, w->rows, w->cols, data, prep);
      w->held_type = w->type;
      // A repacked copy is what stays in memory (the file's pages are only
      // read to build it), with the BF16 rows when they were converted.
      const size_t packed = w->matrix->packed_bytes();
      const size_t rows_bytes = dtype_row_bytes(w->type, w->cols) * static_cast<size_t>(w->rows);
      w->held_bytes = packed > 0 ? packed + (w->bf16.empty() ? 0 : rows_bytes) : rows_bytes;
      *repacked_bytes_ += packed;
      w->repacked_total = repacked_bytes_;
    }
    return w;
  }

  void allocate_kv_cache(const KVCacheSpec& cfg) override {
    PAGELLM_CHECK(cfg.dtype == DType::F16 || cfg.dtype == DType::F32 || cfg.dtype == DType::I8,
                  "KV cache type must be f16, f32 or int8");
    PAGELLM_CHECK(cfg.num_blocks > 1 && cfg.block_size > 0, "KV cache needs at least 2 blocks");
    kv_cfg_ = cfg;
    kv_groups_ = check_kv_groups(cfg);
    kv_elem_ = cfg.dtype == DType::F16 ? cpu::KVElem::F16 : cfg.dtype == DType::I8 ? cpu::KVElem::I8 : cpu::KVElem::F32;
    // Per slot: its elements and scaled vectors per token (slots shared by
    // layers of different shapes take the biggest: kv_slot_shapes).
    const KVCacheLayout layout = cfg.layout();
    const size_t n_slots = static_cast<size_t>(cfg.n_layers), elem = dtype_size(cfg.dtype);
    slot_block_bytes_.assign(n_slots, static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim * elem * cfg.block_size);
    slot_scale_bytes_.assign(n_slots, cfg.dtype == DType::I8 ? static_cast<size_t>(cfg.n_kv_heads) * cfg.block_size *
                                                                 sizeof(float) : 0);
    for (size_t s = 0; s < layout.slot_elems.size(); ++s) {
      slot_block_bytes_[s] = static_cast<size_t>(layout.slot_elems[s]) * elem * cfg.block_size;
      if (cfg.dtype == DType::I8) slot_scale_bytes_[s] = static_cast<size_t>(layout.slot_vectors[s]) * cfg.block_size * sizeof(float);
    }
    // A block's scales are addressed by its heads' room, so an int8 slot must
    // give every layer in it the same room.
    for (size_t l = 0; l < cfg.layer_kv_heads.size() && cfg.dtype == DType::I8; ++l) {
      const auto s = static_cast<size_t>(cfg.layer_slot[l]);
      PAGELLM_CHECK(layout.slot_elems[s] / cfg.layer_head_dim[l] == layout.slot_vectors[s],
                    "an int8 KV cache cannot hold layers of different head sizes in one block slot (layer {}: heads "
                    "of {}); use --kv-cache-dtype f16 or --disable-hybrid-kv-cache-manager", l, cfg.layer_head_dim[l]);
    }
    k_cache_.clear();
    v_cache_.clear();
    k_scale_.clear();
    v_scale_.clear();
    // One allocation for every layer's keys and values, so that it gets
    // 2 MiB pages (a small model's layer alone is below the 4 MiB the hint
    // needs): decode reads each layer's cache as block slices a few KiB
    // apart, one TLB entry per 4 KiB page otherwise.
    // v_is_k (MLA's latent): no values of their own.
    const size_t parts = cfg.v_is_k ? 1 : 2;
    auto slot_bytes = [&](size_t s) { return (slot_block_bytes_[s] * cfg.num_blocks + 63) / 64 * 64; };
    size_t total = 0;
    for (size_t s = 0; s < n_slots; ++s) total += parts * slot_bytes(s);
    kv_arena_ = allocate_aligned(total);
    size_t at = 0;
    for (size_t s = 0; s < n_slots; ++s) {
      k_cache_.push_back(kv_arena_.get() + at);
      at += slot_bytes(s);
      if (!cfg.v_is_k) v_cache_.push_back(kv_arena_.get() + at), at += slot_bytes(s);
      if (slot_scale_bytes_[s] == 0) continue;
      k_scale_.push_back(allocate_aligned(slot_scale_bytes_[s] * cfg.num_blocks));
      if (!cfg.v_is_k) v_scale_.push_back(allocate_aligned(slot_scale_bytes_[s] * cfg.num_blocks));
    }
    state_.clear();
    check_linear_state(cfg);
    for (int l = 0; l < cfg.state.n_layers; ++l)
      state_.push_back(allocate_aligned(slot_floats() * sizeof(float) * cfg.state.num_slots));
  }
  float* k_scale(int slot) const { return k_scale_.empty() ? nullptr : reinterpret_cast<float*>(k_scale_[slot].get()); }
  float* v_scale(int slot) const {
    if (kv_cfg_.v_is_k) return k_scale(slot);
    return v_scale_.empty() ? nullptr : reinterpret_cast<float*>(v_scale_[slot].get());
  }
  // A layer's value cache: its key cache when the spec says v_is_k.
  uint8_t* v_cache(int layer) const { return kv_cfg_.v_is_k ? k_cache_[layer] : v_cache_[layer]; }
  const KVCacheSpec& kv_cache_spec() const override { return kv_cfg_; }

  void copy_states(const BlockPairs& src_dst) override {
    for (const auto& [src, dst] : src_dst)
      for (int l = 0; l < kv_cfg_.state.n_layers; ++l)
        std::memcpy(state_at(l, dst), state_at(l, src), slot_floats() * sizeof(float));
  }

  void copy_blocks(const BlockPairs& src_dst) override {
    for (const auto& [src, dst] : src_dst) {
      check_block(src);
      check_block(dst);
      for (int l = 0; l < kv_cfg_.n_layers; ++l) {
        const size_t bb = slot_block_bytes_[l], sb = slot_scale_bytes_[l];
        std::memcpy(k_cache_[l] + dst * bb, k_cache_[l] + src * bb, bb);
        if (!kv_cfg_.v_is_k) std::memcpy(v_cache_[l] + dst * bb, v_cache_[l] + src * bb, bb);
        if (sb == 0) continue;
        std::memcpy(k_scale_[l].get() + dst * sb, k_scale_[l].get() + src * sb, sb);
        if (!kv_cfg_.v_is_k) std::memcpy(v_scale_[l].get() + dst * sb, v_scale_[l].get() + src * sb, sb);
      }
    }
  }

  // A block's bytes: per layer slot its K, V, then the K and V scales (int8).
  template <typename Fn>
  void for_block_parts(int32_t block, Fn&& part) const {
    check_block(block);
    for (int l = 0; l < kv_cfg_.n_layers; ++l) {
      const size_t bb = slot_block_bytes_[l], sb = slot_scale_bytes_[l];
      part(k_cache_[l] + block * bb, bb);
      if (!kv_cfg_.v_is_k) part(v_cache_[l] + block * bb, bb);
      if (sb == 0) continue;
      part(k_scale_[l].get() + block * sb, sb);
      if (!kv_cfg_.v_is_k) part(v_scale_[l].get() + block * sb, sb);
    }
  }
  void read_kv_blocks(std::span<const int32_t> blocks, uint8_t* dst) override {
    const size_t per_block = kv_cfg_.bytes_per_block();
    for (int32_t b : blocks) {
      size_t at = 0;
      for_block_parts(b, [&](uint8_t* p, size_t n) {
        PAGELLM_CHECK(at + n <= per_block, "KV block {} holds more than {} bytes", b, per_block);
        std::memcpy(dst + at, p, n);
        at += n;
      });
      PAGELLM_CHECK(at == per_block, "KV block {} holds {} bytes, the spec says {}", b, at, per_block);
      dst += per_block;
    }
  }
  void write_kv_blocks(std::span<const int32_t> blocks, const uint8_t* src) override {
    const size_t per_block = kv_cfg_.bytes_per_block();
    for (int32_t b : blocks) {
      size_t at = 0;
      for_block_parts(b, [&](uint8_t* p, size_t n) {
        PAGELLM_CHECK(at + n <= per_block, "KV block {} holds more than {} bytes", b, per_block);
        std::memcpy(p, src + at, n);
        at += n;
      });
      src += per_block;
    }
  }

  void set_batch(const BatchInfo& batch) override {
    batch_ = &batch;
    rope_tables_used_ = 0;
    const int64_t n = batch.n_tokens();
    PAGELLM_CHECK(static_cast<int64_t>(batch.positions.size()) == n &&
                      static_cast<int64_t>(batch.slot_mapping.size()) == n,
                  "batch arrays disagree in length");
    if (!kv_cfg_.num_blocks) return;
    const int64_t n_slots = static_cast<int64_t>(kv_cfg_.num_blocks) * kv_cfg_.block_size;
    for (int64_t s : batch.slot_mapping) PAGELLM_CHECK(s >= 0 && s < n_slots, "KV slot {} out of range", s);
    // A pipeline stage's layers may use only some of the engine's groups:
    // the batch covers at least theirs.
    PAGELLM_CHECK(static_cast<int>(batch.group_slots.size()) >= kv_groups_ - 1,
                  "batch has slots for {} KV-cache groups, the cache has {}", batch.group_slots.size() + 1, kv_groups_);
    for (const auto& slots : batch.group_slots) {
      PAGELLM_CHECK(static_cast<int64_t>(slots.size()) == n, "batch arrays disagree in length");
      for (int64_t s : slots) PAGELLM_CHECK(s >= 0 && s < n_slots, "KV slot {} out of range", s);
    }
    for (const auto& seq : batch.seqs) {
      PAGELLM_CHECK(static_cast<int>(seq.group_tables.size()) >= kv_groups_ - 1,
                    "sequence has block tables for {} KV-cache groups, the cache has {}", seq.group_tables.size() + 1,
                    kv_groups_);
      PAGELLM_CHECK(seq.q_len > 0 && seq.q_start >= 0 && seq.q_start + seq.q_len <= n && seq.ctx_len >= seq.q_len,
                    "bad sequence slice in batch");
      const int64_t need = (seq.ctx_len + kv_cfg_.block_size - 1) / kv_cfg_.block_size;
      PAGELLM_CHECK(static_cast<int64_t>(seq.block_table.size()) >= need, "block table too short: {} < {}",
                    seq.block_table.size(), need);
      for (int64_t b = 0; b < need; ++b) check_block(seq.block_table[b]);
      for (const auto& table : seq.group_tables) {  // null (0) where a window no longer looks
        PAGELLM_CHECK(static_cast<int64_t>(table.size()) >= need, "block table too short: {} < {}", table.size(),
                      need);
        for (int64_t b = 0; b < need; ++b) check_block(table[b]);
      }
    }
  }

  void embed(const Weight& table, float scale, Buffer& out_buf) override {
    Timer t(this, kOther, "embed");
    const auto& w = as_cpu(table);
    float* out = f32(out_buf, batch_->n_tokens() * w.cols);
    const int64_t cols = w.cols;
    const auto* data = static_cast<const uint8_t*>(w.matrix->data());
    const size_t row_bytes = w.matrix->row_bytes();
    const auto& ids = batch_->token_ids;
    for (int32_t id : ids) PAGELLM_CHECK(id >= 0 && id < w.rows, "token id {} outside the vocabulary ({})", id, w.rows);
    pool_.parallel_for(static_cast<int64_t>(ids.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float* o = out + i * cols;
        cpu::dequantize_row(w.type, data + static_cast<size_t>(ids[i]) * row_bytes, o, cols);
        if (scale != 1.0f)
          for (int64_t c = 0; c < cols; ++c) o[c] *= scale;
      }
    });
  }

  void matmul(const Weight& w, const Buffer& xb, int64_t n, Buffer& yb) override {
    Timer t(this, kMatmul, w.name.c_str());
    const float* x = f32(xb, n * w.cols);
    float* y = f32(yb, n * w.rows);
    if (exact_matmul_) return matmul_exact(*as_cpu(w).matrix, x, n, y);
    cpu::matmul(pool_, *as_cpu(w).matrix, x, n, y);
  }

  void add_bias(Buffer& y, const Weight& bias, int64_t n) override {
    Timer t(this, kOther, "add_bias");
    ops_->add_rows(f32(y, n * bias.cols), as_cpu(bias).vec.data(), n, bias.cols);
  }

  void rms_norm(const Buffer& xb, const Weight* w, int64_t n_rows, int64_t dim, float eps, Buffer& yb) override {
    Timer t(this, kOther, "rms_norm");
    const float* x = f32(xb, n_rows * dim);
    float* y = f32(yb, n_rows * dim);
    const float* wv = w ? as_cpu(*w).vec.data() : nullptr;
    if (w) PAGELLM_CHECK(w->cols == dim, "norm weight '{}' has {} values, rows have {}", w->name, w->cols, dim);
    pool_.parallel_for(
        n_rows, [&](int64_t b, int64_t e) { ops_->rms_norm(x + b * dim, wv, e - b, dim, eps, y + b * dim); }, 1,
        min_rows(dim));
  }

  void rope(Buffer& xb, int n_heads, int head_dim, const RopeConfig& cfg) override {
    Timer t(this, kOther, "rope");
    float* x = f32(xb, batch_->n_tokens() * n_heads * head_dim);
    const float* cs = rope_table(cfg);
    const int half = cfg.n_rot / 2;
    pool_.parallel_for(
        batch_->n_tokens(),
        [&](int64_t b, int64_t e) {
          ops_->rope(x + b * n_heads * head_dim, e - b, n_heads, head_dim, cfg.n_rot, cfg.neox, cs + b * half * 2);
        },
        1, min_rows(static_cast<int64_t>(n_heads) * head_dim));
  }

  void store_kv(int layer, Buffer& kb, const Buffer& vb, const RopeConfig* k_rope) override {
    Timer t(this, kAttention, "store_kv");
    const auto [group, slot] = kv_place(layer);
    // Plain copies, not bindings: clang 14 cannot capture a structured binding in a lambda.
    const auto shape = kv_layer_shape(layer);
    const int heads = shape.first, hd = shape.second;
    const int row = heads * hd;
    float* k = f32(kb, batch_->n_tokens() * row);
    // v_is_k: the (rotated) key row is written again as its own value, in place: the same bytes.
    const float* v = kv_cfg_.v_is_k ? k : f32(vb, batch_->n_tokens() * row);
    const cpu::KVStore cache{k_cache_[slot], v_cache(slot), kv_elem_,      k_scale(slot), v_scale(slot),
                             heads,          kv_cfg_.block_size, hd, block_heads(slot, hd)};
    const auto& slots = batch_->slots(group);
    const float* cs = k_rope ? rope_table(*k_rope) : nullptr;
    const int half = k_rope ? k_rope->n_rot / 2 : 0;
    pool_.parallel_for(
        static_cast<int64_t>(slots.size()),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            if (cs)
              ops_->rope(k + i * row, 1, heads, hd, k_rope->n_rot, k_rope->neox,
                         cs + i * half * 2);
            ops_->store_kv(cache, slots[i], k + i * row, v + i * row);
          }
        },
        1, min_rows(2 * row));
  }

  void attention(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) override;
  void attention_kv(const Buffer& q, const Buffer& kv, const KvRowLayout& rows, Buffer& out,
                    const AttentionConfig& cfg) override;
  void gather_kv(int layer, std::span<const uint8_t> seqs, Buffer& out) override;
  // AttentionConfig::kv_seqs: none, or one flag per sequence of the batch.
  void check_seq_flags(std::span<const uint8_t> flags, const char* op) const {
    PAGELLM_CHECK(flags.empty() || flags.size() == batch_->seqs.size(), "{}: {} sequence flags for {} sequences", op,
                  flags.size(), batch_->seqs.size());
  }

  void glu(const Buffer& gate_b, const Buffer& up_b, int64_t n, Activation act, Buffer& out_b) override {
    Timer t(this, kOther, "glu");
    const float* gate = f32(gate_b, n);
    const float* up = f32(up_b, n);
    float* out = f32(out_b, n);
    const int a = static_cast<int>(act);  // the kernels' numbering is the enum's
    pool_.parallel_for(n, [&](int64_t b, int64_t e) { ops_->glu(gate + b, up + b, e - b, a, out + b); }, 64,
                       kMinParallelElements);
  }

  void add(Buffer& yb, const Buffer& xb, int64_t n) override {
    Timer t(this, kOther, "add");
    float* y = f32(yb, n);
    const float* x = f32(xb, n);
    pool_.parallel_for(n, [&](int64_t b, int64_t e) { ops_->add(y + b, x + b, e - b); }, 64, kMinParallelElements);
  }

  void gather_rows(const Buffer& xb, int64_t dim, const std::vector<int32_t>& rows, Buffer& out_b) override {
    const int64_t x_rows = static_cast<int64_t>(xb.size()) / std::max<int64_t>(dim, 1);
    for (int32_t r : rows) PAGELLM_CHECK(r >= 0 && r < x_rows, "gather_rows: row {} of {}", r, x_rows);
    const float* x = f32(xb, 0);
    float* out = f32(out_b, static_cast<int64_t>(rows.size()) * dim);
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(out + i * dim, x + static_cast<int64_t>(rows[i]) * dim, dim * sizeof(float));
  }

  void moe_route(const Buffer& logits_b, int64_t n, const MoeRouting& r, Buffer& ids_b, Buffer& w_b) override {
    Timer t(this, kOther, "moe_route");
    PAGELLM_CHECK(r.n_expert > 0 && r.n_expert <= cpu::kMaxExperts && r.k > 0 && r.k <= r.n_expert,
                  "moe_route: {} of {} experts", r.k, r.n_expert);
    PAGELLM_CHECK(!r.grouped() || (r.n_group > 0 && r.n_expert % r.n_group == 0 && r.topk_group > 0 &&
                                   r.k <= r.topk_group * (r.n_expert / r.n_group)),
                  "moe_route: {} experts do not split into {} groups with {} of them holding {} experts", r.n_expert,
                  r.n_group, r.topk_group, r.k);
    const float* bias = r.choice_bias ? as_cpu(*r.choice_bias).vec.data() : nullptr;
    if (bias)
      PAGELLM_CHECK(r.choice_bias->cols == r.n_expert, "moe_route: choice bias '{}' has {} values for {} experts",
                    r.choice_bias->name, r.choice_bias->cols, r.n_expert);
    const float* logits = f32(logits_b, n * r.n_expert);
    int32_t* ids = i32(ids_b, n * r.k);
    float* w = f32(w_b, n * r.k);
    pool_.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) cpu::route_token(logits + i * r.n_expert, r, bias, ids + i * r.k, w + i * r.k);
    });
  }

  void matmul_experts(const std::vector<const Weight*>& experts, const Buffer& xb, int64_t n, int k, bool x_per_slot,
                      const Buffer& ids_b, Buffer& yb, const std::vector<const Weight*>& biases) override {
    Timer t(this, kMatmul, "matmul_experts");
    PAGELLM_CHECK(!experts.empty() && k > 0, "matmul_experts: no experts");
    const int64_t rows = experts[0]->rows, cols = experts[0]->cols;
    for (const Weight* w : experts)
      PAGELLM_CHECK(w->rows == rows && w->cols == cols, "matmul_experts: expert '{}' is [{}, {}], not [{}, {}]",
                    w->name, w->rows, w->cols, rows, cols);
    PAGELLM_CHECK(biases.empty() || biases.size() == experts.size(), "matmul_experts: {} biases for {} experts",
                  biases.size(), experts.size());
    for (const Weight* b : biases)
      PAGELLM_CHECK(b->cols == rows, "matmul_experts: bias '{}' has {} values for {} rows", b->name, b->cols, rows);
    const int64_t slots = n * k;
    const float* x = f32(xb, (x_per_slot ? slots : n) * cols);
    float* y = f32(yb, slots * rows);
    cpu::group_by_expert(i32(ids_b, slots), slots, static_cast<int>(experts.size()), moe_groups_);
    // Each routed expert multiplies its tokens' rows, gathered contiguous (in
    // expert order), and all of them run in one parallel region.
    if (moe_in_.size() < static_cast<size_t>(slots * cols)) moe_in_.resize(slots * cols);
    if (moe_out_.size() < static_cast<size_t>(slots * rows)) moe_out_.resize(slots * rows);
    for (int64_t i = 0; i < slots; ++i) {
      const int64_t src = x_per_slot ? moe_groups_.slots[i] : moe_groups_.slots[i] / k;
      std::memcpy(moe_in_.data() + i * cols, x + src * cols, cols * sizeof(float));
    }
    moe_problems_.clear();
    for (size_t e = 0; e < experts.size(); ++e) {
      const int64_t m = moe_groups_.count(static_cast<int>(e)), first = moe_groups_.offsets[e];
      if (m > 0)
        moe_problems_.push_back({as_cpu(*experts[e]).matrix.get(), moe_in_.data() + first * cols, m,
                                 moe_out_.data() + first * rows});
    }
    if (exact_matmul_) {
      for (const auto& p : moe_problems_) matmul_exact(*p.w, p.x, p.n, p.y);
    } else {
      cpu::matmul_many(pool_, moe_problems_.data(), moe_problems_.size());
    }
    for (int64_t i = 0; i < slots; ++i)
      std::memcpy(y + static_cast<int64_t>(moe_groups_.slots[i]) * rows, moe_out_.data() + i * rows,
                  rows * sizeof(float));
    if (!biases.empty()) {
      const int32_t* ids = i32(ids_b, slots);
      for (int64_t i = 0; i < slots; ++i) ops_->add_rows(y + i * rows, as_cpu(*biases[ids[i]]).vec.data(), 1, rows);
    }
  }

  // Rows grouped by slot (slot 0, the base model's, skipped): every slot's A
  // products in one parallel region, then every B product in another, then
  // the sums into y. (B transposed, added with vertical FMAs, measured 15%
  // slower per call at decode than these row dots.)
  void lora_matmul(const std::vector<const Weight*>& a, const std::vector<const Weight*>& b, const Buffer& xb,
                   int64_t n, const Buffer& slots_b, Buffer& yb, Buffer*, Buffer*) override {
    Timer t(this, kMatmul, "lora_matmul");
    PAGELLM_CHECK(!a.empty() && a.size() == b.size(), "lora_matmul: {} A and {} B weights", a.size(), b.size());
    const int64_t rank = a[0]->rows, in = a[0]->cols, out = b[0]->rows;
    for (size_t s = 0; s < a.size(); ++s)
      PAGELLM_CHECK(a[s]->rows == rank && a[s]->cols == in && b[s]->rows == out && b[s]->cols == rank,
                    "lora_matmul: slot {} is A [{}, {}], B [{}, {}], not [{}, {}], [{}, {}]", s, a[s]->rows,
                    a[s]->cols, b[s]->rows, b[s]->cols, rank, in, out, rank);
    const float* x = f32(xb, n * in);
    float* y = f32(yb, n * out);
    cpu::group_by_expert(i32(slots_b, n), n, static_cast<int>(a.size()), lora_groups_);
    const int64_t first = lora_groups_.offsets[1], m = n - first;  // rows of slots 1..
    if (m == 0) return;
    if (lora_in_.size() < static_cast<size_t>(m * in)) lora_in_.resize(m * in);
    if (lora_t_.size() < static_cast<size_t>(m * rank)) lora_t_.resize(m * rank);
    if (lora_out_.size() < static_cast<size_t>(m * out)) lora_out_.resize(m * out);
    for (int64_t i = first; i < n; ++i)
      std::memcpy(lora_in_.data() + (i - first) * in, x + lora_groups_.slots[i] * in, in * sizeof(float));
    std::vector<cpu::MatmulProblem> shrink, expand;
    for (size_t s = 1; s < a.size(); ++s) {
      const int64_t rows = lora_groups_.count(static_cast<int>(s)), at = lora_groups_.offsets[s] - first;
      if (rows == 0) continue;
      shrink.push_back({as_cpu(*a[s]).matrix.get(), lora_in_.data() + at * in, rows, lora_t_.data() + at * rank});
      expand.push_back({as_cpu(*b[s]).matrix.get(), lora_t_.data() + at * rank, rows, lora_out_.data() + at * out});
    }
    for (auto* problems : {&shrink, &expand}) {
      if (exact_matmul_) {
        for (const auto& p : *problems) matmul_exact(*p.w, p.x, p.n, p.y);
      } else {
        cpu::matmul_float_many(pool_, problems->data(), problems->size());
      }
    }
    for (int64_t i = first; i < n; ++i)
      ops_->add(y + lora_groups_.slots[i] * out, lora_out_.data() + (i - first) * out, out);
  }

  void moe_combine(const Buffer& yb, const Buffer& wb, int64_t n, int k, int64_t dim, Buffer& out_b) override {
    Timer t(this, kOther, "moe_combine");
    const float* y = f32(yb, n * k * dim);
    const float* w = f32(wb, n * k);
    float* out = f32(out_b, n * dim);
    pool_.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float* o = out + i * dim;
        for (int64_t c = 0; c < dim; ++c) o[c] = 0.0f;
        for (int j = 0; j < k; ++j) {
          const float wj = w[i * k + j];
          const float* yj = y + (i * k + j) * dim;
          for (int64_t c = 0; c < dim; ++c) o[c] += wj * yj[c];
        }
      }
    });
  }

  void scale_rows_sigmoid(Buffer& yb, const Buffer& sb, int64_t n, int64_t dim) override {
    Timer t(this, kOther, "scale_rows_sigmoid");
    float* y = f32(yb, n * dim);
    const float* s = f32(sb, n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = 1.0f / (1.0f + std::exp(-s[i]));
      for (int64_t c = 0; c < dim; ++c) y[i * dim + c] *= g;
    }
  }

  void causal_conv1d(int layer, const Buffer& xb, const Weight& w, const Weight* bias, Buffer& out_b) override {
    Timer t(this, kOther, "causal_conv1d");
    const LinearStateSpec& st = kv_cfg_.state;
    const int sl = state_layer(layer);
    const int64_t dim = st.conv_dim, n = batch_->n_tokens();
    const int K = st.conv_kernel;
    PAGELLM_CHECK(w.cols == dim * K, "conv weight '{}' has {} values, not {} channels x {} taps", w.name, w.cols, dim, K);
    if (bias) PAGELLM_CHECK(bias->cols == dim, "conv bias '{}' has {} values, not {}", bias->name, bias->cols, dim);
    const float* x = f32(xb, n * dim);
    float* out = f32(out_b, n * dim);
    const float* wv = as_cpu(w).vec.data();
    const float* bv = bias ? as_cpu(*bias).vec.data() : nullptr;
    const auto& seqs = batch_->seqs;
    for (const SeqInfo& q : seqs)
      if (q.ctx_len == q.q_len) std::fill_n(state_at(sl, q.state_slot), st.conv_floats(), 0.0f);
    constexpr int64_t kChannels = 256;  // channels per work unit
    const int64_t chunks = (dim + kChannels - 1) / kChannels;
    pool_.parallel_for(static_cast<int64_t>(seqs.size()) * chunks, [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; ++u) {
        const SeqInfo& q = seqs[u / chunks];
        const int64_t c0 = (u % chunks) * kChannels, c1 = std::min(dim, c0 + kChannels);
        cpu::causal_conv1d_seq(x + q.q_start * dim, q.q_len, dim, wv, K, bv, c0, c1, state_at(sl, q.state_slot),
                               out + q.q_start * dim);
      }
    });
  }

  void gated_delta_rule(int layer, const Buffer& qkv_b, const Buffer& a_b, const Buffer& b_b, const Weight& ssm_a,
                        const Weight& dt_bias, const GatedDeltaConfig& cfg, Buffer& out_b) override {
    Timer t(this, kOther, "gated_delta_rule");
    const LinearStateSpec& st = kv_cfg_.state;
    const int sl = state_layer(layer);
    const int H = cfg.n_v_heads;
    PAGELLM_CHECK(H == st.n_v_heads && cfg.head_k_dim == st.head_k_dim && cfg.head_v_dim == st.head_v_dim &&
                      cfg.n_k_heads > 0 && H % cfg.n_k_heads == 0,
                  "gated delta rule: heads {}/{} of {}x{} do not match the state ({} heads of {}x{})", cfg.n_k_heads,
                  H, cfg.head_k_dim, cfg.head_v_dim, st.n_v_heads, st.head_k_dim, st.head_v_dim);
    PAGELLM_CHECK(ssm_a.cols == H && dt_bias.cols == H, "gated delta rule: '{}' / '{}' need {} values", ssm_a.name,
                  dt_bias.name, H);
    const int64_t n = batch_->n_tokens(), dk = cfg.head_k_dim, dv = cfg.head_v_dim;
    const float* qkv = f32(qkv_b, n * cfg.qkv_dim());
    const float* a = f32(a_b, n * H);
    const float* b = f32(b_b, n * H);
    float* out = f32(out_b, n * H * dv);
    const float* sa = as_cpu(ssm_a).vec.data();
    const float* dt = as_cpu(dt_bias).vec.data();
    const auto& seqs = batch_->seqs;
    pool_.parallel_for(static_cast<int64_t>(seqs.size()) * H, [&](int64_t lo, int64_t hi) {
      for (int64_t u = lo; u < hi; ++u) {
        const SeqInfo& q = seqs[u / H];
        const int h = static_cast<int>(u % H);
        float* S = state_at(sl, q.state_slot) + st.conv_floats() + h * dk * dv;
        if (q.ctx_len == q.q_len) std::fill_n(S, dk * dv, 0.0f);
        cpu::gated_delta_rule_head(qkv + q.q_start * cfg.qkv_dim(), a + q.q_start * H, b + q.q_start * H, q.q_len,
                                   cfg, h, sa[h], dt[h], S, out + q.q_start * H * dv, isa_, !deterministic_);
      }
    });
  }

  bool supports_op(const OpQuery& q) const override {
    return q.op == PGLB_OP_SOFTCAP || q.op == PGLB_OP_SAMPLE || q.op == PGLB_OP_LAYER_NORM ||
           q.op == PGLB_OP_ACTIVATION || q.op == PGLB_OP_LORA_MATMUL || q.op == PGLB_OP_ATTENTION_KV ||
           q.op == PGLB_OP_GATHER_KV ||
           Backend::supports_op(q);
  }

  void layer_norm(const Buffer& xb, const Weight* w, const Weight* bias, int64_t n_rows, int64_t dim, float eps,
                  Buffer& yb) override {
    Timer t(this, kOther, "layer_norm");
    const float* x = f32(xb, n_rows * dim);
    float* y = f32(yb, n_rows * dim);
    for (const Weight* v : {w, bias})
      if (v) PAGELLM_CHECK(v->cols == dim, "norm weight '{}' has {} values, rows have {}", v->name, v->cols, dim);
    const float* wv = w ? as_cpu(*w).vec.data() : nullptr;
    const float* bv = bias ? as_cpu(*bias).vec.data() : nullptr;
    pool_.parallel_for(
        n_rows, [&](int64_t b, int64_t e) { cpu::layer_norm_rows(x + b * dim, wv, bv, e - b, dim, eps, y + b * dim); },
        1, min_rows(dim));
  }

  void activation(const Buffer& xb, int64_t n, Activation act, Buffer& outb) override {
    Timer t(this, kOther, "activation");
    const float* x = f32(xb, n);
    float* out = f32(outb, n);
    pool_.parallel_for(n, [&](int64_t b, int64_t e) { cpu::activate(x + b, e - b, act, out + b); }, 64,
                       kMinParallelElements);
  }

  void scale(Buffer& xb, int64_t n, float s) override {
    Timer t(this, kOther, "scale");
    float* x = f32(xb, n);
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }

  void softcap(Buffer& xb, int64_t n, float cap) override {
    Timer t(this, kOther, "softcap");
    float* x = f32(xb, n);
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
  }

  // The host sampler's own filters and draw (sampling/sampler.h), so a draw
  // here picks the very token the host would from the same row and number.
  void sample(const Buffer& logits_b, int64_t n_vocab, const std::vector<SampleDraw>& draws, Buffer& ids_b) override {
    Timer t(this, kOther, "sample");
    const int64_t rows = static_cast<int64_t>(logits_b.size()) / std::max<int64_t>(n_vocab, 1);
    const float* logits = f32(logits_b, 0);
    int32_t* ids = i32(ids_b, static_cast<int64_t>(draws.size()));
    for (size_t i = 0; i < draws.size(); ++i) {
      const SampleDraw& d = draws[i];
      PAGELLM_CHECK(d.row >= 0 && d.row < rows, "sample: row {} of {}", d.row, rows);
      ids[i] = sampler_.sample_plain(logits + static_cast<int64_t>(d.row) * n_vocab, static_cast<int32_t>(n_vocab),
                                     d.temperature, d.top_k, d.top_p, d.min_p, d.u);
    }
  }

  void set_profiling(bool on) override {
    profiling_ = on;
    for (auto& c : category_ns_) c = 0;
  }
  std::string profile_report() const override {
    const double total = static_cast<double>(category_ns_[kMatmul] + category_ns_[kAttention] + category_ns_[kOther]);
    if (total <= 0) return "no profile (run with profiling on)";
    auto pct = [&](int c) { return 100.0 * static_cast<double>(category_ns_[c]) / total; };
    return fmt::format("matmul {:.1f} ms ({:.0f}%), attention {:.1f} ms ({:.0f}%), other {:.1f} ms ({:.0f}%)",
                       category_ns_[kMatmul] / 1e6, pct(kMatmul), category_ns_[kAttention] / 1e6, pct(kAttention),
                       category_ns_[kOther] / 1e6, pct(kOther));
  }

 private:
  // Times an op into its profile category and, with --trace, the timeline.
  struct Timer {
    Timer(CpuBackend* b, Category c, const char* name)
        : b_(b), c_(c), t0_(b->profiling_ ? ThreadPool::now_ns() : 0), scope_(name, "op") {}
    ~Timer() {
      if (b_->profiling_) b_->category_ns_[c_] += ThreadPool::now_ns() - t0_;
    }
    CpuBackend* b_;
    Category c_;
    int64_t t0_;
    trace::Scope scope_;
  };

  // y[n, rows] = x[n, cols] * dequant(W)^T in float: rows dequantized once
  // each into a per-thread buffer, then float dot products.
  void matmul_exact(const cpu::MatmulWeight& w, const float* x, int64_t n, float* y) {
    const int64_t rows = w.rows(), cols = w.cols();
    const auto* data = static_cast<const uint8_t*>(w.data());
    const size_t row_bytes = w.row_bytes();
    if (static_cast<int64_t>(exact_rows_.size()) < pool_.size() * cols) exact_rows_.resize(pool_.size() * cols);
    const int64_t chunk = 64;
    std::atomic<int64_t> next{0};
    pool_.run_dynamic([&](int ith, int) {
      float* row = exact_rows_.data() + ith * cols;
      for (int64_t b = next.fetch_add(chunk); b < rows; b = next.fetch_add(chunk)) {
        for (int64_t r = b; r < std::min(rows, b + chunk); ++r) {
          cpu::dequantize_row(w.type(), data + r * row_bytes, row, cols);
          for (int64_t t = 0; t < n; ++t) y[t * rows + r] = ops_->dot(x + t * cols, row, cols);
        }
      }
    });
  }

  // Elementwise work below this many values runs on one thread: waking the
  // others costs more than it saves.
  static constexpr int64_t kMinParallelElements = 32768;
  static int64_t min_rows(int64_t row_elements) {
    return (kMinParallelElements + row_elements - 1) / std::max<int64_t>(row_elements, 1);
  }

  // Checks the spec's layer -> (group, slot) map; returns the group count.
  static int check_kv_groups(const KVCacheSpec& cfg) {
    if (cfg.layer_group.empty() && cfg.layer_slot.empty()) return 1;
    PAGELLM_CHECK(cfg.layer_group.size() == cfg.layer_slot.size(), "KV cache spec: {} layer groups but {} slots",
                  cfg.layer_group.size(), cfg.layer_slot.size());
    int groups = 1;
    for (size_t l = 0; l < cfg.layer_group.size(); ++l) {
      PAGELLM_CHECK(cfg.layer_group[l] >= 0 && cfg.layer_slot[l] >= 0 && cfg.layer_slot[l] < cfg.n_layers,
                    "KV cache spec: layer {} in group {} slot {} of {}", l, cfg.layer_group[l], cfg.layer_slot[l],
                    cfg.n_layers);
      groups = std::max(groups, cfg.layer_group[l] + 1);
    }
    PAGELLM_CHECK(cfg.layer_kv_heads.empty() || (cfg.layer_kv_heads.size() == cfg.layer_group.size() &&
                                                  cfg.layer_head_dim.size() == cfg.layer_group.size()),
                  "KV cache spec: {} layer shapes for {} layers", cfg.layer_kv_heads.size(), cfg.layer_group.size());
    return groups;
  }
  // The KV-cache group of a layer and its slot in that group's blocks.
  std::pair<int, int> kv_place(int layer) const {
    if (kv_cfg_.layer_group.empty()) {
      PAGELLM_CHECK(layer >= 0 && layer < kv_cfg_.n_layers, "KV layer {} out of range", layer);
      return {0, layer};
    }
    PAGELLM_CHECK(layer >= 0 && layer < static_cast<int>(kv_cfg_.layer_group.size()), "KV layer {} out of range",
                  layer);
    return {kv_cfg_.layer_group[layer], kv_cfg_.layer_slot[layer]};
  }

  // A cache layer's K/V heads and head size (KVCacheSpec::layer_kv_heads).
  std::pair<int, int> kv_layer_shape(int layer) const {
    if (kv_cfg_.layer_kv_heads.empty()) return {kv_cfg_.n_kv_heads, kv_cfg_.head_dim};
    return {kv_cfg_.layer_kv_heads[static_cast<size_t>(layer)], kv_cfg_.layer_head_dim[static_cast<size_t>(layer)]};
  }
  // The heads of head_dim a block of the slot has room for.
  int block_heads(int slot, int head_dim) const {
    const size_t per_token = slot_block_bytes_[static_cast<size_t>(slot)] / kv_cfg_.block_size / dtype_size(kv_cfg_.dtype);
    return static_cast<int>(per_token / static_cast<size_t>(head_dim));
  }

  // ---- linear-attention state: per state layer, num_slots slots of
  // [conv state, recurrent state] floats.
  static void check_linear_state(const KVCacheSpec& cfg) {
    const LinearStateSpec& st = cfg.state;
    if (st.n_layers == 0) {
      PAGELLM_CHECK(std::all_of(cfg.layer_state.begin(), cfg.layer_state.end(), [](int32_t s) { return s < 0; }),
                    "KV cache spec: a layer keeps a linear-attention state but the spec has no state layers");
      return;
    }
    PAGELLM_CHECK(st.num_slots > 0 && st.conv_dim > 0 && st.conv_kernel > 1 && st.n_v_heads > 0 &&
                      st.head_k_dim > 0 && st.head_v_dim > 0,
                  "KV cache spec: linear-attention state of {} slots, conv {}x{}, {} heads of {}x{}", st.num_slots,
                  st.conv_kernel, st.conv_dim, st.n_v_heads, st.head_k_dim, st.head_v_dim);
    for (int32_t s : cfg.layer_state)
      PAGELLM_CHECK(s < st.n_layers, "KV cache spec: state layer {} of {}", s, st.n_layers);
  }
  int64_t slot_floats() const { return kv_cfg_.state.conv_floats() + kv_cfg_.state.recurrent_floats(); }
  int state_layer(int layer) const {
    const auto& ls = kv_cfg_.layer_state;
    PAGELLM_CHECK(layer >= 0 && static_cast<size_t>(layer) < ls.size() && ls[layer] >= 0,
                  "layer {} keeps no linear-attention state", layer);
    return ls[layer];
  }
  float* state_at(int state_layer, int32_t slot) const {
    PAGELLM_CHECK(slot >= 0 && slot < kv_cfg_.state.num_slots, "linear-attention state slot {} of {}", slot,
                  kv_cfg_.state.num_slots);
    return reinterpret_cast<float*>(state_[state_layer].get()) + slot * slot_floats();
  }

  void check_block(int32_t b) const {
    PAGELLM_CHECK(b >= 0 && b < kv_cfg_.num_blocks, "KV block {} out of range [0, {})", b, kv_cfg_.num_blocks);
  }

  // cos/sin of every batch position for one RoPE configuration, computed once
  // per step (in double, then rounded) and shared by all layers using it.
  const float* rope_table(const RopeConfig& cfg) {
    for (size_t i = 0; i < rope_tables_used_; ++i)
      if (rope_tables_[i].first.same_table(cfg)) return rope_tables_[i].second.data();
    const int half = cfg.n_rot / 2;
    const int64_t n = batch_->n_tokens();
    // Buffers are kept across steps: no allocation once they have grown.
    if (rope_tables_used_ == rope_tables_.size()) rope_tables_.emplace_back();
    auto& [slot_key, table] = rope_tables_[rope_tables_used_++];
    slot_key = cfg;
    table.resize(static_cast<size_t>(n * half * 2));
    const float* factors = cfg.freq_factors ? as_cpu(*cfg.freq_factors).vec.data() : nullptr;
    const double mscale = rope_pair_frequencies(cfg, factors, rope_freqs_);
    for (int i = 0; i < half; ++i) {
      for (int64_t t = 0; t < n; ++t) {
        const double theta = static_cast<double>(batch_->positions[t]) * rope_freqs_[i];
        table[(t * half + i) * 2] = static_cast<float>(std::cos(theta) * mscale);
        table[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(theta) * mscale);
      }
    }
    return table.data();
  }

  ThreadPool pool_;
  Isa isa_;
  const cpu::OpsTable* ops_;
  KVCacheSpec kv_cfg_;
  int kv_groups_ = 1;
  std::vector<size_t> slot_block_bytes_;  // [slot] one block's K (or V) bytes
  std::vector<size_t> slot_scale_bytes_;  // [slot] one block's scales (int8 caches), else 0
  cpu::KVElem kv_elem_ = cpu::KVElem::F16;
  AlignedBuffer kv_arena_;                     // [slot][k, v][num_blocks * slot_block_bytes_[slot]]
  std::vector<uint8_t*> k_cache_, v_cache_;    // [layer], into kv_arena_
  std::vector<AlignedBuffer> state_;              // [state layer] linear-attention states
  std::vector<AlignedBuffer> k_scale_, v_scale_;  // [layer], int8 caches
  const BatchInfo* batch_ = nullptr;
  std::vector<std::pair<RopeConfig, std::vector<float>>> rope_tables_;
  std::vector<double> rope_freqs_;  // [n_rot / 2] of the table being built
  size_t rope_tables_used_ = 0;  // tables valid for the current batch
  bool profiling_ = false;
  int64_t category_ns_[kNumCategories] = {};

  // Attention work units, reused across calls.
  struct AttnUnit {
    int32_t row;       // first query token row of the tile in the batch
    int32_t n_tokens;  // tokens in the tile
    int32_t seq;       // index into batch seqs
    int32_t g;         // KV head
    int64_t j0, j1;    // key range
    int64_t pos0;      // position of the tile's first token
  };
  std::vector<AttnUnit> units_;
  std::vector<float> partials_;  // [units, tile rows * (2 + value dims)]
  // Both attention ops: work units over the keys of each sequence take(seq)
  // accepts, kv_of(unit) saying where they are; out [n_tokens, n_head * Dv]
  // (the other sequences' rows untouched).
  template <typename Take, typename KvOf>
  void attend_units(const AttentionConfig& cfg, const float* q, float* out, int Dv, Take take, KvOf kv_of);
  Sampler sampler_;  // scratch of sample()
  bool exact_matmul_ = false;
  bool repack_ = true;
  bool f16_as_bf16_ = false;
  std::shared_ptr<std::atomic<size_t>> repacked_bytes_ = std::make_shared<std::atomic<size_t>>(0);  // start-up line
  bool deterministic_ = false;
  std::vector<float> exact_rows_;  // [threads, cols] dequantized weight rows
  cpu::ExpertGroups moe_groups_;      // matmul_experts: slots per expert
  std::vector<float> moe_in_, moe_out_;  // input rows gathered by expert, and their outputs
  cpu::ExpertGroups lora_groups_;       // lora_matmul: rows per slot
  std::vector<float> lora_in_, lora_t_, lora_out_;  // its rows gathered by slot, A's products, B's
  std::vector<cpu::MatmulProblem> moe_problems_;
};

void CpuBackend::attention(int layer, const Buffer& q_buf, Buffer& out_buf, const AttentionConfig& cfg) {
  Timer timer(this, kAttention, "attention");
  // Plain variables, not a structured binding: the lambda below captures them (C++17).
  const int group = kv_place(layer).first, slot = kv_place(layer).second;
  const float* q = f32(q_buf, batch_->n_tokens() * cfg.n_head * cfg.head_dim);
  float* out = f32(out_buf, batch_->n_tokens() * cfg.n_head * cfg.head_dim);
  const auto [layer_heads, layer_hd] = kv_layer_shape(layer);
  PAGELLM_CHECK(cfg.n_head_kv > 0 && cfg.n_head % cfg.n_head_kv == 0 && cfg.n_head_kv == layer_heads &&
                    cfg.head_dim == layer_hd,
                "attention shape does not match the KV cache");
  PAGELLM_CHECK(kv_cfg_.block_size <= cpu::kAttnMaxBlock, "attention kernel limits: block size {} (<= {})",
                kv_cfg_.block_size, cpu::kAttnMaxBlock);
  const int heads_per_block = block_heads(slot, cfg.head_dim);
  check_seq_flags(cfg.kv_seqs, "attention");
  const auto take = [&](int32_t si) { return cfg.kv_seqs.empty() || !cfg.kv_seqs[static_cast<size_t>(si)]; };
  attend_units(cfg, q, out, cfg.head_dim, take, [&](const AttnUnit& w) {
    return cpu::AttnKV{k_cache_[slot],      v_cache(slot), kv_elem_, k_scale(slot),
                       v_scale(slot),       cfg.n_head_kv, kv_cfg_.block_size, cfg.head_dim,
                       batch_->seqs[w.seq].table(group).data(), heads_per_block};
  });
}

void CpuBackend::attention_kv(const Buffer& q_buf, const Buffer& kv_buf, const KvRowLayout& rows, Buffer& out_buf,
                              const AttentionConfig& cfg) {
  Timer timer(this, kAttention, "attention_kv");
  const int64_t n = batch_->n_tokens();
  PAGELLM_CHECK(cfg.n_head_kv > 0 && cfg.n_head % cfg.n_head_kv == 0 && rows.v_dim > 0 && rows.v_dim % 8 == 0 &&
                    rows.v_dim <= cpu::kAttnMaxHeadDim && cfg.head_dim <= rows.row &&
                    rows.v_offset + rows.v_dim <= rows.row && rows.v_offset >= 0,
                "attention_kv: {} heads of {} on {} KV heads, values [{}, {}) of rows of {}", cfg.n_head,
                cfg.head_dim, cfg.n_head_kv, rows.v_offset, rows.v_offset + rows.v_dim, rows.row);
  const auto& seqs = batch_->seqs;
  check_seq_flags(cfg.kv_seqs, "attention_kv");
  const auto take = [&](int32_t si) {
    return cfg.kv_seqs.empty() ? seqs[static_cast<size_t>(si)].ctx_len == seqs[static_cast<size_t>(si)].q_len
                               : cfg.kv_seqs[static_cast<size_t>(si)] != 0;
  };
  // Each taken sequence's first key row: its first token's in the step, or
  // with rows.context, after the keys of the sequences taken before it.
  std::vector<int64_t> first_row(seqs.size());
  int64_t kv_rows = n;
  if (rows.context) {
    kv_rows = 0;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (take(static_cast<int32_t>(i))) first_row[i] = kv_rows, kv_rows += seqs[i].ctx_len;
  } else {
    for (size_t i = 0; i < seqs.size(); ++i) {
      PAGELLM_CHECK(!take(static_cast<int32_t>(i)) || seqs[i].ctx_len == seqs[i].q_len,
                    "attention_kv: a sequence with cached keys needs them given (context rows)");
      first_row[i] = seqs[i].q_start;
    }
  }
  const float* q = f32(q_buf, n * cfg.n_head * cfg.head_dim);
  const float* kv = f32(kv_buf, kv_rows * cfg.n_head_kv * rows.row);
  float* out = f32(out_buf, n * cfg.n_head * rows.v_dim);
  attend_units(cfg, q, out, rows.v_dim, take, [&](const AttnUnit& w) {
    const float* k = kv + (first_row[static_cast<size_t>(w.seq)] * cfg.n_head_kv + w.g) * rows.row;
    cpu::AttnKV a{k, k + rows.v_offset, cpu::KVElem::F32, nullptr, nullptr, cfg.n_head_kv, cpu::kAttnMaxBlock,
                  cfg.head_dim, nullptr, cfg.n_head_kv};
    a.key_stride = cfg.n_head_kv * rows.row;
    a.v_dim = rows.v_dim;
    return a;
  });
}

void CpuBackend::gather_kv(int layer, std::span<const uint8_t> seqs, Buffer& out_buf) {
  Timer timer(this, kAttention, "gather_kv");
  const int group = kv_place(layer).first, slot = kv_place(layer).second;
  const int heads = kv_layer_shape(layer).first, hd = kv_layer_shape(layer).second;
  PAGELLM_CHECK(seqs.size() == batch_->seqs.size(), "gather_kv: {} sequence flags for {} sequences", seqs.size(),
                batch_->seqs.size());
  // (sequence, first position, first output row) per block of keys: the units of work.
  struct Piece {
    int32_t seq, pos;
    int64_t row;
  };
  std::vector<Piece> pieces;
  const int bs = kv_cfg_.block_size;
  int64_t rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i]) continue;
    const SeqInfo& s = batch_->seqs[i];
    PAGELLM_CHECK(s.kv_evicted_to <= s.kv_sinks, "gather_kv: sequence {} has evicted keys", i);
    for (int32_t p = 0; p < s.ctx_len; p += bs) pieces.push_back({static_cast<int32_t>(i), p, rows + p});
    rows += s.ctx_len;
  }
  const int64_t row = static_cast<int64_t>(heads) * hd;
  float* out = f32(out_buf, rows * row);
  const int bh = block_heads(slot, hd);
  const uint8_t* k = k_cache_[slot];
  const float* scales = k_scale(slot);
  const size_t esize = dtype_size(kv_cfg_.dtype);
  pool_.parallel_for(
      static_cast<int64_t>(pieces.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) {
          const Piece& pc = pieces[static_cast<size_t>(u)];
          const SeqInfo& s = batch_->seqs[static_cast<size_t>(pc.seq)];
          const int64_t block = s.table(group)[static_cast<size_t>(pc.pos / bs)];
          const int n = std::min(bs, s.ctx_len - pc.pos);
          for (int g = 0; g < heads; ++g) {
            const int64_t at = (block * bh + g) * bs;  // the head's first token in the block
            for (int t = 0; t < n; ++t) {
              float* o = out + (pc.row + t) * row + static_cast<int64_t>(g) * hd;
              const uint8_t* src = k + static_cast<size_t>((at + t) * hd) * esize;
              if (kv_elem_ != cpu::KVElem::I8) {
                cpu::dequantize_row_ref(kv_cfg_.dtype, src, o, hd);
              } else {
                const auto* c = reinterpret_cast<const int8_t*>(src);
                const float sc = scales[at + t];
                for (int d = 0; d < hd; ++d) o[d] = static_cast<float>(c[d]) * sc;
              }
            }
          }
        }
      },
      1, 1);
}

template <typename Take, typename KvOf>
void CpuBackend::attend_units(const AttentionConfig& cfg, const float* q, float* out, int Dv, Take take,
                              KvOf kv_of) {
  const int G = cfg.n_head / cfg.n_head_kv, D = cfg.head_dim;
  PAGELLM_CHECK(D % 8 == 0 && D <= cpu::kAttnMaxHeadDim && G <= cpu::kAttnMaxRows,
                "attention kernel limits: head_dim {} (multiple of 8, <= {}), {} query heads per KV head (<= {})", D,
                cpu::kAttnMaxHeadDim, G, cpu::kAttnMaxRows);
  const int ahead = cfg.non_causal && cfg.sliding_window > 0 ? cfg.sliding_window - 1 : 0;
  const float* sinks = cfg.sinks ? as_cpu(*cfg.sinks).vec.data() : nullptr;
  if (sinks)
    PAGELLM_CHECK(cfg.sinks->cols == cfg.n_head, "attention sinks '{}' have {} values for {} heads", cfg.sinks->name,
                  cfg.sinks->cols, cfg.n_head);
  const int nth = pool_.size();
  // Tiles of consecutive query tokens of one sequence (about 32 query rows
  // with their heads), so each key block loaded serves many rows.
  const int tile_tokens = std::max(1, 32 / G);

  // Work units: (sequence, KV head, token tile, key range). Decode tiles (one
  // token) over long contexts are split into key ranges when there are too
  // few units to keep every thread busy, and merged afterwards (flash-decoding).
  // A row's result depends on where its keys are split, so the deterministic
  // mode splits every tile, decode or prefill, at the same fixed key
  // positions (multiples of kDeterministicSplit), whatever the batch and
  // thread count.
  const int64_t split = (kDeterministicSplit + kv_cfg_.block_size - 1) / kv_cfg_.block_size * kv_cfg_.block_size;
  int64_t base_units = 0;
  for (int32_t si = 0; si < static_cast<int32_t>(batch_->seqs.size()); ++si)
    if (take(si)) base_units += ((batch_->seqs[si].q_len + tile_tokens - 1) / tile_tokens) * cfg.n_head_kv;
  const int64_t want_units = static_cast<int64_t>(nth) * 4;
  units_.clear();
  for (int32_t si = 0; si < static_cast<int32_t>(batch_->seqs.size()); ++si) {
    const auto& s = batch_->seqs[si];
    if (!take(si)) continue;
    for (int32_t t0 = 0; t0 < s.q_len; t0 += tile_tokens) {
      const int32_t nt = std::min(tile_tokens, s.q_len - t0);
      // Non-causal: every key of the sequence, and the tile masks as if each
      // row sat at the last position (the kernels' mask is j <= position).
      // Non-causal with a window: each row at its own position, seeing
      // window - 1 keys either side of it (|p - j| < window).
      const bool symmetric = cfg.non_causal && cfg.sliding_window > 0;
      const int64_t pos0 = cfg.non_causal && !symmetric ? s.ctx_len - 1 : s.ctx_len - s.q_len + t0;
      const int64_t j1 = symmetric     ? std::min<int64_t>(s.ctx_len, pos0 + nt - 1 + cfg.sliding_window)
                         : cfg.non_causal ? s.ctx_len
                                          : pos0 + nt;
      const int64_t j0 = cfg.sliding_window > 0 ? std::max<int64_t>(0, pos0 - cfg.sliding_window + 1) : 0;
      // Key ranges: [j0, j1), or with evicted keys the sinks and what follows the gap.
      int64_t ranges[2][2] = {{j0, j1}, {0, 0}};
      int n_ranges = 1;
      if (s.kv_evicted_to > s.kv_sinks) {
        n_ranges = 0;
        if (j0 < s.kv_sinks) ranges[n_ranges][0] = j0, ranges[n_ranges++][1] = std::min<int64_t>(j1, s.kv_sinks);
        const int64_t a = std::max<int64_t>(j0, s.kv_evicted_to);
        if (a < j1) ranges[n_ranges][0] = a, ranges[n_ranges++][1] = j1;
      }
      int64_t keys = 0;
      for (int r = 0; r < n_ranges; ++r) keys += ranges[r][1] - ranges[r][0];
      int64_t parts = 1;
      if (nt == 1 && base_units < want_units) {
        parts = std::min<int64_t>((want_units + base_units - 1) / base_units, (keys + 255) / 256);
        parts = std::max<int64_t>(parts, 1);
      }
      for (int32_t g = 0; g < cfg.n_head_kv; ++g) {
        if (n_ranges == 0) units_.push_back({s.q_start + t0, nt, si, g, j0, j0, pos0});  // no key: zero output
        for (int r = 0; r < n_ranges; ++r) {
          const int64_t lo = ranges[r][0], hi = ranges[r][1];
          if (deterministic_) {
            for (int64_t a = lo; a < hi;) {
              const int64_t b = std::min(hi, (a / split + 1) * split);
              units_.push_back({s.q_start + t0, nt, si, g, a, b, pos0});
              a = b;
            }
            continue;
          }
          const int64_t rp = std::max<int64_t>(1, parts * (hi - lo) / std::max<int64_t>(keys, 1));
          for (int64_t p = 0; p < rp; ++p) {
            const int64_t a = lo + (hi - lo) * p / rp, b = lo + (hi - lo) * (p + 1) / rp;
            units_.push_back({s.q_start + t0, nt, si, g, a, b, pos0});
          }
        }
      }
    }
  }
  const size_t rows_max = static_cast<size_t>(tile_tokens) * G;
  const size_t unit_floats = rows_max * (2 + Dv);
  if (partials_.size() < units_.size() * unit_floats) partials_.resize(units_.size() * unit_floats);

  const int64_t q_stride = static_cast<int64_t>(cfg.n_head) * D, out_stride = static_cast<int64_t>(cfg.n_head) * Dv;
  std::atomic<int64_t> next{0};
  const int64_t n_units = static_cast<int64_t>(units_.size());
  pool_.run_dynamic([&](int, int) {
    // Each thread claims its next unit before running this one, so the
    // kernel can fetch that unit's first keys while it finishes this one.
    int64_t u = next.fetch_add(1, std::memory_order_relaxed);
    while (u < n_units) {
      const int64_t un = next.fetch_add(1, std::memory_order_relaxed);
      const AttnUnit& w = units_[u];
      const cpu::AttnKV kv = kv_of(w);
      cpu::AttnTile tile{q + static_cast<int64_t>(w.row) * q_stride + static_cast<int64_t>(w.g) * G * D,
                         q_stride, w.n_tokens, G, w.pos0, w.j0, w.j1, cfg.sliding_window, cfg.scale, cfg.softcap,
                         ahead};
      cpu::AttnKV next_kv;
      if (un < n_units) {
        const AttnUnit& wn = units_[un];
        next_kv = kv_of(wn);
        tile.next_kv = &next_kv;
        tile.next_g = wn.g;
        tile.next_j0 = wn.j0;
        tile.next_j1 = wn.j1;
      }
      float* p = partials_.data() + u * unit_floats;
      const size_t rows = static_cast<size_t>(w.n_tokens) * G;
      ops_->attend(tile, kv, w.g, cpu::AttnPartial{p, p + rows, p + 2 * rows});
      u = un;
    }
  });

  // Merge: the parts of one tile and KV head are adjacent units.
  for (int64_t u = 0; u < n_units;) {
    int64_t e = u + 1;
    while (e < n_units && units_[e].row == units_[u].row && units_[e].g == units_[u].g) ++e;
    const int rows = units_[u].n_tokens * G;
    for (int r = 0; r < rows; ++r) {
      const int head = units_[u].g * G + r % G;
      // A sink is one more score in the softmax, whose value adds nothing.
      float m = sinks ? sinks[head] : -INFINITY;
      for (int64_t k = u; k < e; ++k) m = std::max(m, partials_[k * unit_floats + r]);
      float* o = out + static_cast<int64_t>(units_[u].row + r / G) * out_stride + head * Dv;
      for (int d = 0; d < Dv; ++d) o[d] = 0;
      float l = sinks ? std::exp(sinks[head] - m) : 0.0f;
      for (int64_t k = u; k < e; ++k) {
        const float* p = partials_.data() + k * unit_floats;
        if (p[r] == -INFINITY) continue;  // this part saw no key of this row
        const float w = std::exp(p[r] - m);
        l += p[rows + r] * w;
        const float* acc = p + 2 * rows + static_cast<int64_t>(r) * Dv;
        for (int d = 0; d < Dv; ++d) o[d] += acc[d] * w;
      }
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      for (int d = 0; d < Dv; ++d) o[d] *= inv;
    }
    u = e;
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

CpuBackendOptions CpuBackendOptions::from(const BackendOptions& o) {
  check_backend_options(o, "cpu", {"threads", "exact_matmul", "repack", "dtype"});
  CpuBackendOptions c;
  c.threads = backend_option_int(o, "cpu", "threads", 0);
  c.exact_matmul = backend_option_bool(o, "cpu", "exact_matmul", false);
  c.repack = backend_option_bool(o, "cpu", "repack", true);
  if (const auto it = o.find("dtype"); it != o.end()) {
    if (it->second != "auto" && it->second != "bfloat16")
      fail("cpu backend option dtype={}: auto (weights as stored) or bfloat16 (F16 matrices rounded to BF16)",
           it->second);
    c.f16_as_bf16 = it->second == "bfloat16";
  }
  return c;
}

// The CPU is served through the plain C ABI like any plugin (exported and
// re-imported), so every run exercises the tables a vendor implements.
void register_cpu_backend() {
  ExportedBackend x;
  x.kind = "cpu";
#if defined(PAGELLM_CPU_ARM)
  x.description = "the host CPU (scalar, NEON, dotprod and i8mm kernels chosen at start-up)";
#else
  x.description = "the host CPU (scalar, AVX2 and AVX-512 kernels chosen at start-up)";
#endif
  x.device_count = [] { return 1; };
  x.create = [](int index, const BackendOptions& o) {
    if (index != 0) fail("--device cpu:{}: the cpu backend has one device (cpu or cpu:0)", index);
    return make_cpu_backend(CpuBackendOptions::from(o));
  };
  register_c_backend(export_backend(std::move(x)), "built in");
}

}  // namespace pagellm
