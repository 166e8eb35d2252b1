// The one seam between the engine and the hardware. Model code describes a
// forward pass as a sequence of these ops; a backend (the CPU, OpenCL, later
// CUDA or a vendor accelerator) implements them over memory it owns.
//
// - Activations are Buffers allocated by the backend. Code above the backend
//   holds them by handle and never dereferences them: the only way to their
//   bytes is copy_to_host / copy_from_host.
// - Ops are enqueued, in order, on the backend's one queue; they may return
//   before their work is done. The caller waits with synchronize(), which it
//   does only where the host needs a result (the logits). A synchronous
//   backend (the CPU) simply runs each op before returning.
// - Per-step metadata (token ids, positions, KV slots, block tables) is handed
//   over once per step with set_batch(), as a device backend uploads it once;
//   embed, rope, store_kv and attention use it.
//
// Backends are created by name through backend/registry.h, each behind the
// plain C ABI of include/pagellm_backend.h (backend/c_backend.h adapts it to
// this class; backend/c_export.h serves a C++ backend through it).
// docs/backends.md is the guide to writing one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/kv_layout.h"
#include "pagellm_backend.h"

namespace pagellm {

// A host tensor to upload (usually a view into the mmapped model file).
struct TensorData {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // ne[0] first: shape[0] is the row length
  const void* data = nullptr;
  int64_t cols() const { return shape.empty() ? 1 : shape[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t k = 1; k < shape.size(); ++k) r *= shape[k];
    return r;
  }
  size_t bytes() const { return dtype_row_bytes(type, cols()) * static_cast<size_t>(rows()); }
};

// Expert e of a stacked expert tensor (shape [cols, rows, n_expert], or
// [cols, n_expert] for per-expert vectors) as a view [cols, rows] ([cols])
// of the same bytes, named "<name>[e]".
TensorData expert_slice(const TensorData& experts, int64_t e);

// A weight as the backend holds it: a matrix [rows = out features, cols = in
// features] or a vector (rows == 1) such as a norm weight or a bias. `type`
// is the type as stored in the file; `held_type` what the backend keeps
// (they differ when a backend converts a type it cannot multiply).
class Weight {
 public:
  virtual ~Weight() = default;
  DType type = DType::F32;
  DType held_type = DType::F32;
  int64_t rows = 0, cols = 0;
  size_t held_bytes = 0;  // backend memory the weight takes
  std::string name;
};

// Activation memory owned by a backend: `size` elements of `dtype`. Only the
// backend that allocated a buffer may be handed it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  DType dtype() const { return dtype_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * dtype_size(dtype_); }

 protected:
  Buffer(DType dtype, size_t size) : dtype_(dtype), size_(size) {}

 private:
  DType dtype_;
  size_t size_;
};
using BufferPtr = std::unique_ptr<Buffer>;

// SwigluOai is gpt-oss's clamped form: gate clamped above at 7, up to [-7, 7],
// act(g) * (up + 1) with act(g) = g * sigmoid(1.702 g). Sigmoid is a plain
// gate, sigmoid(g) * up (Qwen3.5's gated attention output).
// GeluErf is transformers' "gelu" (BERT), only as a plain activation
// (Backend::activation), never in glu.
enum class Activation { Silu, GeluTanh, SwigluOai, Sigmoid, GeluErf };

// Mixture-of-experts routing: how router logits become each token's experts
// and their weights (Mixtral / Qwen-MoE: softmax; DeepSeek V3 style: sigmoid).
enum class RouterScoring { Softmax, Sigmoid };
// Group-limited routing (DeepSeek): how a group of experts is ranked, from
// its experts' choice scores. V3: the sum of its two best; V2's
// group_limited_greedy: its best.
enum class GroupScore { Top2Sum, Max };
struct MoeRouting {
  int n_expert = 0;           // experts in the layer
  int k = 0;                  // experts each token uses
  RouterScoring scoring = RouterScoring::Softmax;
  bool normalize = false;     // the k chosen weights are rescaled to sum to 1
  float scale = 1.0f;         // applied to the chosen weights last
  // [n_expert] added to the scores for the choice only; the weights stay the
  // unbiased scores (DeepSeek V3's e_score_correction_bias). Null: none.
  const Weight* choice_bias = nullptr;
  // The experts form n_group equal groups (in id order); only the experts of
  // the topk_group best groups compete. 1, 1: no groups.
  int n_group = 1, topk_group = 1;
  GroupScore group_score = GroupScore::Top2Sum;
  bool grouped() const { return n_group > 1 && topk_group < n_group; }
};

struct RopeConfig {
  int n_rot = 0;             // leading dims of each head that rotate (== head_dim usually)
  float freq_base = 10000;
  float freq_scale = 1.0f;   // 1 / linear scaling factor
  bool neox = false;         // rotate (i, i + n_rot/2) pairs; else adjacent (2i, 2i+1) pairs
  const Weight* freq_factors = nullptr;  // [n_rot / 2] divisors (Llama 3.1 style), optional
  // YaRN context extension (ext_factor > 0; Qwen long-context configs,
  // gpt-oss): pairs that turn fewer than beta_slow times over n_ctx_orig
  // tokens are interpolated by freq_scale, pairs that turn more than
  // beta_fast times keep their frequency, with a linear ramp between; cos and
  // sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale)).
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int n_ctx_orig = 0;
  // The ramp's ends are rounded out to whole pairs (llama.cpp always;
  // transformers unless a config says truncate: false, as gpt-oss does).
  bool yarn_truncate = true;

  bool same_table(const RopeConfig& o) const {
    return freq_base == o.freq_base && freq_scale == o.freq_scale && n_rot == o.n_rot &&
           freq_factors == o.freq_factors && ext_factor == o.ext_factor && attn_factor == o.attn_factor &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && n_ctx_orig == o.n_ctx_orig &&
           yarn_truncate == o.yarn_truncate;
  }
};

// Every backend's RoPE angles: pair i of a head turns by pos * inv_freq[i]
// (n_rot / 2 pairs; factors: freq_factors' values or null), and cos / sin
// are multiplied by the returned scale (attn_factor, and YaRN's own factor).
double rope_pair_frequencies(const RopeConfig& cfg, const float* factors, std::vector<double>& inv_freq);

struct AttentionConfig {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;        // applied to q.k
  // > 0: a query at position p sees keys at p - window < j <= p; with
  // non_causal (Feature::SymmetricWindowAttention), keys at |p - j| < window.
  int sliding_window = 0;
  float softcap = 0.0f;      // > 0: scores = softcap * tanh(scores / softcap)
  // [n_head] per-head logits of a "sink": one more key, with a zero value,
  // in every softmax (gpt-oss). Feature::AttentionSinks; null: none.
  const Weight* sinks = nullptr;
  // Feature::NonCausalAttention: every query sees every key of its sequence
  // (an encoder's bidirectional attention; the sequence's whole prompt is in
  // the cache, computed in this one step), or those in its symmetric window.
  bool non_causal = false;
  // MLA's two forms in one step: one flag per sequence of the batch; 1:
  // attention_kv computes the sequence's rows, and attention may leave them
  // as they are (a hint; computing them is right too). Empty: attention
  // computes every row, attention_kv the sequences whole in the step
  // (ctx_len == q_len).
  std::span<const uint8_t> kv_seqs;
};

// Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5) keep no
// per-token K/V: each sequence has a fixed-size state per such layer, in a
// state slot the KV manager assigns (SeqInfo::state_slot):
//   conv state       [conv_kernel - 1, conv_dim]: the last inputs of the causal conv
//   recurrent state  [n_v_heads, head_k_dim, head_v_dim]: the delta rule's matrix
// both F32. A sequence whose first position in a step is 0 starts from zeros.
struct LinearStateSpec {
  int n_layers = 0;   // linear-attention layers (of this stage)
  int num_slots = 0;  // sequences that can hold a state at once
  int conv_dim = 0, conv_kernel = 0;
  int n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  int64_t conv_floats() const { return static_cast<int64_t>(conv_kernel - 1) * conv_dim; }
  int64_t recurrent_floats() const { return static_cast<int64_t>(n_v_heads) * head_k_dim * head_v_dim; }
  // One slot: every linear layer's conv and recurrent state.
  size_t bytes_per_slot() const {
    return static_cast<size_t>(n_layers) * static_cast<size_t>(conv_floats() + recurrent_floats()) * sizeof(float);
  }
};

// Gated DeltaNet's recurrence (Backend::gated_delta_rule). Per token and
// value head h, with S the head's [head_k_dim, head_v_dim] state, q and k
// (of h's key head) L2-normalised (eps 1e-6) and q scaled by `scale`:
//   g = ssm_a[h] * softplus(a + dt_bias[h]),  beta = sigmoid(b)
//   S = exp(g) S;  S += k (beta (v - k^T S))^T;  out = q^T S
// ssm_a is -exp(A_log), as llama.cpp's converter stores it.
struct GatedDeltaConfig {
  int n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_k_dim)
  // Which key head value head h reads: grouped (h / (n_v_heads / n_k_heads),
  // transformers' order) or tiled (h % n_k_heads, the order llama.cpp's
  // converter writes so that ggml can broadcast).
  bool v_heads_tiled = false;
  int key_head(int h) const { return v_heads_tiled ? h % n_k_heads : h / (n_v_heads / n_k_heads); }
  // Row layout of qkv: [q (n_k_heads * head_k_dim), k (same), v (n_v_heads * head_v_dim)].
  int64_t qkv_dim() const {
    return 2 * static_cast<int64_t>(n_k_heads) * head_k_dim + static_cast<int64_t>(n_v_heads) * head_v_dim;
  }
};

// Where attention_kv finds its keys and values: token t's KV head g is the
// row kv[(t * n_head_kv + g) * row ...], its key the first head_dim values,
// its value v_dim values from v_offset. Token t is the step's t-th token, or
// with `context`, the t-th of every key of the sequences attention_kv takes:
// each one's positions [0, ctx_len), sequences in batch order (gather_kv's
// rows, expanded).
struct KvRowLayout {
  int64_t row = 0, v_offset = 0;
  int v_dim = 0;
  bool context = false;
};

struct KVCacheSpec {
  // n_layers: layer slots per block. Without groups, one per layer; with
  // KV-cache groups (Feature::KvGroups), the slots of one group's block, and
  // layer l of the model (this stage's l-th layer) keeps its K/V in slot
  // layer_slot[l] of the blocks of group layer_group[l]. Empty: slot = layer,
  // group 0.
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<int32_t> layer_group, layer_slot;
  int block_size = 16;
  int num_blocks = 0;        // including block 0 (reserved padding block)
  // F32, F16, or I8: symmetric int8 with one float scale per (token, KV
  // head) vector, max |x| / 127, set as the vector is written.
  DType dtype = DType::F16;
  // Feature::LinearAttention: layer l keeps a state (no K/V) when
  // layer_state[l] >= 0, its index among the state layers. Empty: none.
  LinearStateSpec state;
  std::vector<int32_t> layer_state;
  // Feature::KvVIsK: no V is stored; attention reads its values from the keys
  // (MLA: the latent [rope(k_pe), c_kv] is both; the rope part meets zero
  // columns of the output's absorbed matrix). store_kv's v is then ignored.
  bool v_is_k = false;
  // Feature::KvLayerShapes: layer l's K/V has layer_kv_heads[l] heads of
  // layer_head_dim[l] (Gemma 4's global layers); slots take the size of their
  // largest layer (core/kv_layout.h's kv_slot_shapes). Empty: n_kv_heads and
  // head_dim for every layer.
  std::vector<int32_t> layer_kv_heads, layer_head_dim;
  KVCacheLayout layout() const {
    KVCacheLayout l{n_layers, n_kv_heads, head_dim, block_size, static_cast<int32_t>(dtype_size(dtype)),
                    dtype == DType::I8 ? static_cast<int32_t>(sizeof(float)) : 0, v_is_k ? 1 : 0};
    if (!layer_kv_heads.empty()) {
      KvSlotShapes s = kv_slot_shapes(n_layers, layer_slot, layer_kv_heads, layer_head_dim);
      l.slot_elems = std::move(s.elems);
      l.slot_vectors = std::move(s.vectors);
    }
    return l;
  }
  // Bytes of one block across all layers, K and V (core/kv_layout.h).
  size_t bytes_per_block() const { return static_cast<size_t>(kv_bytes_per_block(layout())); }
};

// One sequence's slice of a step's batch. Its tokens are rows
// [q_start, q_start + q_len) of every activation; they sit at positions
// [ctx_len - q_len, ctx_len) and the cache holds ctx_len tokens after store_kv.
struct SeqInfo {
  int32_t q_start = 0, q_len = 0, ctx_len = 0;
  std::vector<int32_t> block_table;  // physical block of each logical block
  // Sliding KV eviction (Feature::KvEviction): keys [kv_sinks, kv_evicted_to)
  // are gone (their blocks may hold another sequence's data); attention
  // visits only [0, kv_sinks) and [kv_evicted_to, ctx_len). 0, 0: none gone.
  int32_t kv_sinks = 0, kv_evicted_to = 0;
  // KV-cache groups 1.. (Feature::KvGroups): their tables; a sliding group's
  // holds kNullBlock (0) for blocks its window no longer sees.
  std::vector<std::vector<int32_t>> group_tables;
  // Linear-attention layers: the sequence's state slot (-1: none).
  int32_t state_slot = -1;
  // LoRA: the model's adapter slot of the sequence (0: the base model; model/lora.h).
  int32_t lora_slot = 0;
  const std::vector<int32_t>& table(int group) const {
    return group == 0 ? block_table : group_tables[static_cast<size_t>(group - 1)];
  }
};

struct BatchInfo {
  std::vector<int32_t> token_ids;     // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int64_t> slot_mapping;  // [n_tokens] block * block_size + offset
  std::vector<SeqInfo> seqs;
  std::vector<std::vector<int64_t>> group_slots;  // groups 1..: [n_tokens] slots in their blocks
  int64_t n_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  const std::vector<int64_t>& slots(int group) const {
    return group == 0 ? slot_mapping : group_slots[static_cast<size_t>(group - 1)];
  }
};

// What the backend's memory holds. KV sizing reads it.
struct MemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;   // now, before the KV cache is allocated
  bool host_memory = true; // the device computes in the host's RAM (CPU, PoCL)
};

// Optional abilities, asked before use (no #if ladders in callers).
enum class Feature {
  SwapToHost,  // allocate_swap_space / swap_out / swap_in
  AsyncOps,    // ops return before their work is done
  MixtureOfExperts,  // moe_route / matmul_experts / moe_combine / scale_rows_sigmoid
  AttentionSinks,    // AttentionConfig::sinks
  // set_deterministic(true): a row's results are the same bits whatever the
  // thread count and whatever else is in the batch (fixed reduction orders
  // and split points in every kernel).
  Deterministic,
  KvEviction,  // SeqInfo::kv_sinks / kv_evicted_to
  KvGroups,    // KVCacheSpec::layer_group / layer_slot, SeqInfo::group_tables, BatchInfo::group_slots
  // Gated DeltaNet layers: KVCacheSpec::state / layer_state, SeqInfo::state_slot,
  // causal_conv1d, gated_delta_rule, copy_states.
  LinearAttention,
  KvVIsK,  // KVCacheSpec::v_is_k
  KvLayerShapes,  // KVCacheSpec::layer_kv_heads / layer_head_dim
  NonCausalAttention,  // AttentionConfig::non_causal
  SymmetricWindowAttention,  // AttentionConfig::non_causal with a sliding_window (EmbeddingGemma)
  KvBlockIO,  // read_kv_blocks / write_kv_blocks (the KV offload tier)
};

// (source, destination) block pairs.
using BlockPairs = std::vector<std::pair<int32_t, int32_t>>;

// An op with its operands' types and shapes, as supports_op is asked it (the
// C ABI's struct: include/pagellm_backend.h).
using OpQuery = pglb_op_query;
OpQuery op_query(pglb_op op, std::initializer_list<std::pair<DType, std::vector<int64_t>>> operands = {});
// "matmul", "attention", ...: for errors and logs.
const char* op_name(pglb_op op);

// One token drawn on the device from a logits row (Backend::sample): the
// host draws the random number, so a seeded request gets the same tokens
// whichever device samples (pglb_sample_row).
using SampleDraw = pglb_sample_row;

// One rank's end of a collective group over device buffers, in the order of
// the backend's queue (NCCL / HCCL / BKCL style). A backend may bring its
// own (Backend::comm_init); dist::make_device_comm otherwise gives the host
// default, which copies to the host and uses MPI. Counts are F32 values.
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual std::string describe() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum of buf[offset, offset + count).
  virtual void all_reduce_sum(Buffer& buf, size_t offset, size_t count) = 0;
  // out[r * count, (r + 1) * count) = rank r's in[0, count).
  virtual void all_gather(const Buffer& in, size_t count, Buffer& out) = 0;
  virtual void broadcast(Buffer& buf, size_t count, int root) = 0;
  virtual void send(const Buffer& buf, size_t count, int dst) = 0;
  virtual void recv(Buffer& buf, size_t count, int src) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;      // "cpu", "opencl"
  virtual std::string describe() const = 0;  // device, kernels, threads: for logs
  virtual bool supports(Feature f) const { return false; }
  // Feature::Deterministic; the default accepts only false.
  virtual void set_deterministic(bool on);
  virtual bool deterministic() const { return false; }

  // ---- memory
  virtual MemoryInfo memory_info() const = 0;
  // A buffer of n elements (F32 always; other types where the backend says).
  virtual BufferPtr alloc(DType type, size_t n) = 0;
  // Enqueued copies of `bytes` bytes at byte `offset` of the buffer. The host
  // memory must stay valid (copy_from_host) or is filled (copy_to_host) only
  // once synchronize() returns.
  virtual void copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) = 0;
  virtual void copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) = 0;
  // Waits until every enqueued op and copy is done.
  virtual void synchronize() = 0;

  // ---- weights (vectors such as norms and biases are held as F32)
  virtual bool supports_weight(DType t) const = 0;
  virtual std::unique_ptr<Weight> upload(const TensorData& t) = 0;

  // ---- KV cache: [num_blocks][n_kv_heads][block_size][head_dim] per layer, K and V
  virtual void allocate_kv_cache(const KVCacheSpec& spec) = 0;
  virtual const KVCacheSpec& kv_cache_spec() const = 0;
  // Copy-on-write: whole blocks (all layers, K and V) from source to destination.
  virtual void copy_blocks(const BlockPairs& src_dst) = 0;
  // Swap-to-host preemption (Feature::SwapToHost): a host pool of num_blocks
  // blocks of the device cache's layout; blocks copied out (device -> host)
  // and back in (host -> device).
  virtual void allocate_swap_space(int num_blocks);
  virtual void swap_out(const BlockPairs& device_to_host);
  virtual void swap_in(const BlockPairs& host_to_device);
  // The KV offload tier (Feature::KvBlockIO): whole blocks as bytes in host
  // memory, kv_cache_spec().bytes_per_block() each, in the backend's own
  // order (every layer slot's K, V and int8 scales), back to back in the
  // blocks' order. Synchronous: dst is filled (the blocks written) when the
  // call returns. Reading a block and writing the bytes back into any block
  // gives it the same contents, bit for bit.
  virtual void read_kv_blocks(std::span<const int32_t> blocks, uint8_t* dst);
  virtual void write_kv_blocks(std::span<const int32_t> blocks, const uint8_t* src);

  // ---- the step's batch (see the top of this file). The caller keeps
  // `batch` alive and unchanged until the next set_batch (a host backend may
  // read it in place rather than copy it).
  virtual void set_batch(const BatchInfo& batch) = 0;

  // ---- ops. `n` is a row count; matrices are row-major [n, cols]; buffers
  // are F32 and at least as large as the rows the op reads or writes.
  virtual void embed(const Weight& table, float scale, Buffer& out) = 0;  // out[n_tokens, table.cols]
  virtual void matmul(const Weight& w, const Buffer& x, int64_t n, Buffer& y) = 0;  // y[n, w.rows] = x W^T
  virtual void add_bias(Buffer& y, const Weight& bias, int64_t n) = 0;              // y[r] += bias
  // y[r] = x[r] / rms(x[r]) * w (w may be null); rows of length dim; y may be x.
  virtual void rms_norm(const Buffer& x, const Weight* w, int64_t n_rows, int64_t dim, float eps, Buffer& y) = 0;
  // In place on x[n_tokens, n_heads * head_dim] at the batch positions.
  virtual void rope(Buffer& x, int n_heads, int head_dim, const RopeConfig& cfg) = 0;
  // Writes k, v [n_tokens, n_kv_heads * head_dim] into the cache at the batch
  // slots. With k_rope, k is rotated (in place) at the batch positions as it
  // is written: one pass instead of a rope op followed by a copy.
  virtual void store_kv(int layer, Buffer& k, const Buffer& v, const RopeConfig* k_rope = nullptr) = 0;
  // Causal paged attention of q [n_tokens, n_head * head_dim] over each
  // sequence's cache -> out [n_tokens, n_head * head_dim].
  virtual void attention(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) = 0;
  // out = act(gate) * up, elementwise over n values; out may be gate.
  virtual void glu(const Buffer& gate, const Buffer& up, int64_t n, Activation act, Buffer& out) = 0;
  virtual void add(Buffer& y, const Buffer& x, int64_t n) = 0;  // y += x
  // out[i] = x[rows[i]] for rows of length dim.
  virtual void gather_rows(const Buffer& x, int64_t dim, const std::vector<int32_t>& rows, Buffer& out) = 0;

  // ---- Mixture-of-experts (Feature::MixtureOfExperts); the defaults throw.
  // ids[n, k] (an I32 buffer) and weights[n, k] from router logits[n, n_expert].
  // Ties go to the lower expert id, so a token's route never depends on its batch.
  virtual void moe_route(const Buffer& logits, int64_t n, const MoeRouting& r, Buffer& ids, Buffer& weights);
  // Expert-grouped products: y[t*k + j] = x_row * experts[ids[t, j]]^T, where
  // x_row is x[t] (x_per_slot false: the layer input, shared by a token's k
  // experts) or x[t*k + j]. Each routed expert's weights stream once for all
  // the step's tokens routed to it; unrouted experts are not read. With
  // biases (one vector per expert, gpt-oss), y[t*k + j] += biases[ids[t, j]].
  virtual void matmul_experts(const std::vector<const Weight*>& experts, const Buffer& x, int64_t n, int k,
                              bool x_per_slot, const Buffer& ids, Buffer& y,
                              const std::vector<const Weight*>& biases = {});
  // LoRA (PGLB_OP_LORA_MATMUL): y[t] += b[s] (a[s] x[t]) for each row t of
  // x[n, in] whose slot s = slots[t] (I32) is > 0; a[s]: [rank, in], b[s]:
  // [out, rank]. The default runs two grouped products (matmul_experts: slot
  // 0 holds zeros) and an add through t_scratch [n, rank] and d_scratch [n,
  // out], which it needs; an override may take null scratch.
  virtual void lora_matmul(const std::vector<const Weight*>& a, const std::vector<const Weight*>& b, const Buffer& x,
                           int64_t n, const Buffer& slots, Buffer& y, Buffer* t_scratch, Buffer* d_scratch);
  // out[t] = sum_j weights[t, j] * y[t*k + j], rows of dim values.
  virtual void moe_combine(const Buffer& y, const Buffer& weights, int64_t n, int k, int64_t dim, Buffer& out);
  // y[t] *= sigmoid(s[t]) for rows of dim values (Qwen2-MoE's shared-expert gate).
  virtual void scale_rows_sigmoid(Buffer& y, const Buffer& s, int64_t n, int64_t dim);

  // ---- linear attention (Feature::LinearAttention); the defaults throw.
  // out[t] = silu(bias + sum_j w[c, j] x[t - K + 1 + j]) per channel c of
  // x[n_tokens, conv_dim] (w: [conv_dim, K] taps, oldest first; bias may be
  // null), where inputs before a sequence's first token this step come from
  // its conv state (zeros for a sequence starting at position 0); the state
  // then holds its last K - 1 inputs. `layer` is the model layer.
  virtual void causal_conv1d(int layer, const Buffer& x, const Weight& w, const Weight* bias, Buffer& out);
  // The gated delta rule over each sequence's tokens in order, from and into
  // its recurrent state: qkv[n_tokens, cfg.qkv_dim()], a and b
  // [n_tokens, n_v_heads], ssm_a and dt_bias [n_v_heads] -> out[n_tokens,
  // n_v_heads * head_v_dim].
  virtual void gated_delta_rule(int layer, const Buffer& qkv, const Buffer& a, const Buffer& b, const Weight& ssm_a,
                                const Weight& dt_bias, const GatedDeltaConfig& cfg, Buffer& out);
  // State slot pairs (source, destination): a forked sequence's state.
  virtual void copy_states(const BlockPairs& src_dst);

  // ---- what the backend can run. The default: every op above, the
  // Mixture-of-experts ops with Feature::MixtureOfExperts, none of the
  // optional ops below. Asked at model load (a model the backend cannot run
  // is refused before anything is uploaded) and for the optional ops.
  virtual bool supports_op(const OpQuery& q) const;

  // ---- optional ops (supports_op says; the defaults throw)
  // Causal attention of q [n_tokens, n_head * head_dim] over keys and values
  // given in kv, not the cache (rows: KvRowLayout) -> out [n_tokens, n_head *
  // v_dim] (PGLB_OP_ATTENTION_KV: MLA's expanded form for prefill, where keys
  // and values are wider per head than the cached latent is cheap), for the
  // sequences cfg.kv_seqs marks (empty: those whole in the step); the other
  // sequences' rows of out are left as they are.
  virtual void attention_kv(const Buffer& q, const Buffer& kv, const KvRowLayout& rows, Buffer& out,
                            const AttentionConfig& cfg);
  // The cached keys of the marked sequences (one flag per sequence of the
  // batch), positions [0, ctx_len) of each, in batch order, as F32 rows of
  // n_kv_heads * head_dim -> out (PGLB_OP_GATHER_KV: MLA's expanded form for
  // a prompt chunk after cached keys). Sequences with evicted keys cannot be
  // marked.
  virtual void gather_kv(int layer, std::span<const uint8_t> seqs, Buffer& out);
  // x = cap * tanh(x / cap) over n values (Gemma 2's final logits).
  virtual void softcap(Buffer& x, int64_t n, float cap);
  // y[r] = (x[r] - mean(x[r])) / sqrt(var(x[r]) + eps) * w + b for rows of
  // length dim (w, b may be null); y may be x (BERT's norms).
  virtual void layer_norm(const Buffer& x, const Weight* w, const Weight* b, int64_t n_rows, int64_t dim, float eps,
                          Buffer& y);
  // out = act(x) over n values; out may be x (Silu, GeluTanh, GeluErf, Sigmoid).
  virtual void activation(const Buffer& x, int64_t n, Activation act, Buffer& out);
  // x *= s over n values (Gemma 4's per-layer output scale). The default
  // goes through host memory, so every backend runs it; a backend may do it in place.
  virtual void scale(Buffer& x, int64_t n, float s);
  // ids[i] (an I32 buffer) = the token draws[i] picks from its row of
  // logits [rows, n_vocab], so that only the ids cross to the host; -1 for
  // a row with no finite logit.
  virtual void sample(const Buffer& logits, int64_t n_vocab, const std::vector<SampleDraw>& draws, Buffer& ids);

  // ---- device collectives (optional). A backend that has its own: rank 0
  // makes a unique id, the host hands it to every rank, each calls comm_init.
  virtual bool has_device_comm() const { return false; }
  virtual std::vector<uint8_t> comm_unique_id();
  virtual std::unique_ptr<DeviceComm> comm_init(int rank, int size, const std::vector<uint8_t>& id);

  // ---- optional per-op timing (the --profile breakdown)
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::string profile_report() const { return {}; }
};

}  // namespace pagellm
