#include "backend/c_backend.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace pagellm {

static_assert(static_cast<int>(DType::Q4_K) == PGLB_Q4_K && static_cast<int>(DType::BF16) == PGLB_BF16 &&
                  static_cast<int>(DType::I32) == PGLB_I32 && static_cast<int>(DType::MXFP4) == PGLB_MXFP4,
              "pglb_dtype takes GGUF's values, as DType does");

namespace {

const char* status_text(pglb_status s) {
  switch (s) {
    case PGLB_OK: return "ok";
    case PGLB_UNSUPPORTED: return "unsupported";
    case PGLB_OUT_OF_MEMORY: return "out of memory";
    case PGLB_INVALID_ARGUMENT: return "invalid argument";
    default: return "error";
  }
}

// A table as this core knows it: the plugin's bytes up to its struct_size,
// zeros after (members a smaller, older table lacks read as "not provided").
template <class T>
T copy_table(const T* t) {
  T out{};
  if (t) std::memcpy(&out, t, std::min(t->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

pglb_dtype to_c(DType t) { return static_cast<pglb_dtype>(t); }

// What the Backend and everything it handed out share: the device closes
// when the last of them goes (a Weight may outlive the Backend that made it).
struct Device {
  std::string kind, origin;
  pglb_registry reg{};
  pglb_device_iface di{};
  pglb_stream_iface si{};
  pglb_comm_iface ci{};
  bool has_comm = false;
  pglb_device* dev = nullptr;
  pglb_stream* stream = nullptr;

  ~Device() {
    if (stream && di.stream_destroy) di.stream_destroy(dev, stream);
    if (dev && di.close) di.close(dev);
  }

  [[noreturn]] void failed(const char* call, pglb_status st) const {
    const char* msg = di.last_error ? di.last_error(dev) : nullptr;
    fail("{} backend: {} failed ({}): {}", kind, call, status_text(st), msg && *msg ? msg : "no message");
  }
  void check(pglb_status st, const char* call) const {
    if (st != PGLB_OK) failed(call, st);
  }
  [[noreturn]] void missing(const char* call) const {
    fail("the {} backend (plugin {}) does not provide {}", kind, origin, call);
  }
};
using DevicePtr = std::shared_ptr<Device>;

class CBuffer final : public Buffer {
 public:
  CBuffer(DevicePtr d, pglb_buffer* h, DType t, size_t n) : Buffer(t, n), d_(std::move(d)), h_(h) {}
  ~CBuffer() override { d_->di.buffer_free(d_->dev, h_); }
  pglb_buffer* handle() const { return h_; }

 private:
  DevicePtr d_;
  pglb_buffer* h_;
};

class CWeight final : public Weight {
 public:
  CWeight(DevicePtr d, pglb_weight* h) : d_(std::move(d)), h_(h) {}
  ~CWeight() override {
    if (d_->di.weight_free) d_->di.weight_free(d_->dev, h_);
  }
  pglb_weight* handle() const { return h_; }

 private:
  DevicePtr d_;
  pglb_weight* h_;
};

// Only the backend that made a buffer or weight is handed it (backend.h).
pglb_buffer* h(const Buffer& b) { return static_cast<const CBuffer&>(b).handle(); }
const pglb_weight* h(const Weight& w) { return static_cast<const CWeight&>(w).handle(); }
const pglb_weight* h(const Weight* w) { return w ? h(*w) : nullptr; }

pglb_rope_config to_c(const RopeConfig& c) {
  pglb_rope_config r{};
  r.struct_size = sizeof r;
  r.n_rot = c.n_rot;
  r.freq_base = c.freq_base;
  r.freq_scale = c.freq_scale;
  r.neox = c.neox;
  r.freq_factors = h(c.freq_factors);
  r.ext_factor = c.ext_factor;
  r.attn_factor = c.attn_factor;
  r.beta_fast = c.beta_fast;
  r.beta_slow = c.beta_slow;
  r.n_ctx_orig = c.n_ctx_orig;
  r.yarn_truncate = c.yarn_truncate;
  return r;
}

class CComm final : public DeviceComm {
 public:
  CComm(DevicePtr d, pglb_comm* c, int rank, int size) : d_(std::move(d)), c_(c), rank_(rank), size_(size) {}
  ~CComm() override {
    if (d_->ci.destroy) d_->ci.destroy(c_);
  }
  std::string describe() const override {
    return d_->kind + " device communicator (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Buffer& buf, size_t offset, size_t count) override {
    if (!d_->ci.all_reduce_sum) d_->missing("comm all_reduce_sum");
    d_->check(d_->ci.all_reduce_sum(c_, d_->stream, h(buf), offset, count), "comm all_reduce_sum");
  }
  void all_gather(const Buffer& in, size_t count, Buffer& out) override {
    if (!d_->ci.all_gather) d_->missing("comm all_gather");
    d_->check(d_->ci.all_gather(c_, d_->stream, h(in), count, h(out)), "comm all_gather");
  }
  void broadcast(Buffer& buf, size_t count, int root) override {
    if (!d_->ci.broadcast) d_->missing("comm broadcast");
    d_->check(d_->ci.broadcast(c_, d_->stream, h(buf), count, root), "comm broadcast");
  }
  void send(const Buffer& buf, size_t count, int dst) override {
    if (!d_->ci.send) d_->missing("comm send");
    d_->check(d_->ci.send(c_, d_->stream, h(buf), count, dst), "comm send");
  }
  void recv(Buffer& buf, size_t count, int src) override {
    if (!d_->ci.recv) d_->missing("comm recv");
    d_->check(d_->ci.recv(c_, d_->stream, h(buf), count, src), "comm recv");
  }

 private:
  DevicePtr d_;
  pglb_comm* c_;
  int rank_, size_;
};

class CBackend final : public Backend {
 public:
  explicit CBackend(DevicePtr d) : d_(std::move(d)) {
    features_ = d_->di.features ? d_->di.features(d_->dev) : 0;
  }

  std::string name() const override { return d_->kind; }
  std::string describe() const override {
    const char* s = d_->di.describe ? d_->di.describe(d_->dev) : nullptr;
    return s ? s : d_->kind;
  }
  bool supports(Feature f) const override {
    uint64_t bit = 0;
    switch (f) {
      case Feature::SwapToHost: bit = PGLB_FEATURE_SWAP_TO_HOST; break;
      case Feature::AsyncOps: bit = PGLB_FEATURE_ASYNC_OPS; break;
      case Feature::MixtureOfExperts: bit = PGLB_FEATURE_MIXTURE_OF_EXPERTS; break;
      case Feature::AttentionSinks: bit = PGLB_FEATURE_ATTENTION_SINKS; break;
      case Feature::Deterministic: bit = PGLB_FEATURE_DETERMINISTIC; break;
      case Feature::KvEviction: bit = PGLB_FEATURE_KV_EVICTION; break;
      case Feature::KvGroups: bit = PGLB_FEATURE_KV_GROUPS; break;
      case Feature::LinearAttention: bit = PGLB_FEATURE_LINEAR_ATTENTION; break;
      case Feature::KvVIsK: bit = PGLB_FEATURE_KV_V_IS_K; break;
      case Feature::KvLayerShapes: bit = PGLB_FEATURE_KV_LAYER_SHAPES; break;
      case Feature::NonCausalAttention: bit = PGLB_FEATURE_NON_CAUSAL_ATTENTION; break;
      case Feature::SymmetricWindowAttention: bit = PGLB_FEATURE_SYMMETRIC_WINDOW_ATTENTION; break;
      case Feature::KvBlockIO: bit = PGLB_FEATURE_KV_BLOCK_IO; break;
    }
    return (features_ & bit) != 0;
  }
  void set_deterministic(bool on) override {
    if (!d_->di.set_deterministic || !supports(Feature::Deterministic)) return Backend::set_deterministic(on);
    d_->check(d_->di.set_deterministic(d_->dev, on), "set_deterministic");
    deterministic_ = on;
  }
  bool deterministic() const override { return deterministic_; }

  MemoryInfo memory_info() const override {
    if (!d_->di.memory_info) d_->missing("memory_info");
    pglb_memory_info m{};
    m.struct_size = sizeof m;
    d_->check(d_->di.memory_info(d_->dev, &m), "memory_info");
    return {m.total_bytes, m.free_bytes, m.host_memory != 0};
  }
  BufferPtr alloc(DType type, size_t n) override {
    pglb_buffer* b = nullptr;
    d_->check(d_->di.buffer_alloc(d_->dev, 0, to_c(type), n, &b), "buffer_alloc");
    if (!b) fail("{} backend: buffer_alloc returned no buffer", d_->kind);
    return std::make_unique<CBuffer>(d_, b, type, n);
  }
  void copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) override {
    d_->check(d_->si.copy_from_host(d_->stream, src, h(dst), offset, bytes), "copy_from_host");
  }
  void copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) override {
    d_->check(d_->si.copy_to_host(d_->stream, h(src), offset, bytes, dst), "copy_to_host");
  }
  void synchronize() override { d_->check(d_->si.synchronize(d_->stream), "synchronize"); }

  bool supports_weight(DType t) const override {
    return d_->di.supports_weight && d_->di.supports_weight(d_->dev, to_c(t)) != 0;
  }
  std::unique_ptr<Weight> upload(const TensorData& t) override {
    if (!d_->di.weight_upload) d_->missing("weight_upload");
    if (t.shape.size() > 4) fail("{} backend: tensor '{}' has {} dimensions (at most 4)", d_->kind, t.name, t.shape.size());
    pglb_tensor c{};
    c.struct_size = sizeof c;
    c.name = t.name.c_str();
    c.type = to_c(t.type);
    c.n_dims = static_cast<int32_t>(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) c.shape[i] = t.shape[i];
    c.data = t.data;
    pglb_weight_info info{};
    info.struct_size = sizeof info;
    pglb_weight* w = nullptr;
    const pglb_status st = d_->di.weight_upload(d_->dev, &c, &w, &info);
    if (st != PGLB_OK) {
      const std::string call = "upload of '" + t.name + "'";
      d_->failed(call.c_str(), st);
    }
    auto out = std::make_unique<CWeight>(d_, w);
    out->type = t.type;
    out->held_type = static_cast<DType>(info.held_type);
    out->rows = t.rows();
    out->cols = t.cols();
    out->held_bytes = info.held_bytes;
    out->name = t.name;
    return out;
  }

  void allocate_kv_cache(const KVCacheSpec& spec) override {
    if (!d_->di.kv_allocate) d_->missing("kv_allocate");
    pglb_kv_spec c{};
    c.struct_size = sizeof c;
    c.n_layers = spec.n_layers;
    c.n_kv_heads = spec.n_kv_heads;
    c.head_dim = spec.head_dim;
    c.block_size = spec.block_size;
    c.num_blocks = spec.num_blocks;
    c.dtype = to_c(spec.dtype);
    c.n_model_layers = static_cast<int32_t>(spec.layer_group.size());
    c.layer_group = spec.layer_group.empty() ? nullptr : spec.layer_group.data();
    c.layer_slot = spec.layer_slot.empty() ? nullptr : spec.layer_slot.data();
    if (spec.v_is_k && !supports(Feature::KvVIsK))
      fail("the {} backend cannot read attention values from the keys (a KV cache without V)", d_->kind);
    c.v_is_k = spec.v_is_k ? 1 : 0;
    if (!spec.layer_kv_heads.empty()) {
      if (!supports(Feature::KvLayerShapes))
        fail("the {} backend cannot keep layers of different K/V shapes in one cache (Gemma 4's global layers)",
             d_->kind);
      PAGELLM_CHECK(spec.layer_kv_heads.size() == spec.layer_group.size() &&
                        spec.layer_head_dim.size() == spec.layer_group.size(),
                    "KV cache spec: {} layer shapes for {} layers", spec.layer_kv_heads.size(), spec.layer_group.size());
      c.layer_kv_heads = spec.layer_kv_heads.data();
      c.layer_head_dim = spec.layer_head_dim.data();
    }
    if (!spec.layer_state.empty()) {
      if (!supports(Feature::LinearAttention))
        fail("the {} backend does not keep linear-attention states (Gated DeltaNet layers)", d_->kind);
      PAGELLM_CHECK(spec.layer_group.empty() || spec.layer_group.size() == spec.layer_state.size(),
                    "KV cache spec: {} layer groups but {} layer states", spec.layer_group.size(),
                    spec.layer_state.size());
      c.n_model_layers = static_cast<int32_t>(spec.layer_state.size());
      c.layer_state = spec.layer_state.data();
      const LinearStateSpec& st = spec.state;
      c.n_state_layers = st.n_layers;
      c.state_slots = st.num_slots;
      c.conv_dim = st.conv_dim;
      c.conv_kernel = st.conv_kernel;
      c.n_v_heads = st.n_v_heads;
      c.head_k_dim = st.head_k_dim;
      c.head_v_dim = st.head_v_dim;
    }
    d_->check(d_->di.kv_allocate(d_->dev, &c), "kv_allocate");
    kv_ = spec;
  }
  const KVCacheSpec& kv_cache_spec() const override { return kv_; }
  void copy_blocks(const BlockPairs& src_dst) override {
    if (src_dst.empty()) return;
    if (!d_->si.copy_blocks) d_->missing("copy_blocks");
    const auto p = pairs(src_dst);
    d_->check(d_->si.copy_blocks(d_->stream, p.data(), p.size()), "copy_blocks");
  }
  void copy_states(const BlockPairs& src_dst) override {
    if (src_dst.empty()) return;
    if (!supports(Feature::LinearAttention) || !d_->si.copy_states) return Backend::copy_states(src_dst);
    const auto p = pairs(src_dst);
    d_->check(d_->si.copy_states(d_->stream, p.data(), p.size()), "copy_states");
  }
  void read_kv_blocks(std::span<const int32_t> blocks, uint8_t* dst) override {
    if (!supports(Feature::KvBlockIO) || !d_->si.read_kv_blocks) return Backend::read_kv_blocks(blocks, dst);
    d_->check(d_->si.read_kv_blocks(d_->stream, blocks.data(), blocks.size(), dst), "read_kv_blocks");
  }
  void write_kv_blocks(std::span<const int32_t> blocks, const uint8_t* src) override {
    if (!supports(Feature::KvBlockIO) || !d_->si.write_kv_blocks) return Backend::write_kv_blocks(blocks, src);
    d_->check(d_->si.write_kv_blocks(d_->stream, blocks.data(), blocks.size(), src), "write_kv_blocks");
  }
  void allocate_swap_space(int num_blocks) override {
    if (!supports(Feature::SwapToHost) || !d_->di.swap_allocate) return Backend::allocate_swap_space(num_blocks);
    d_->check(d_->di.swap_allocate(d_->dev, num_blocks), "swap_allocate");
  }
  void swap_out(const BlockPairs& device_to_host) override {
    if (!supports(Feature::SwapToHost) || !d_->si.swap_out) return Backend::swap_out(device_to_host);
    const auto p = pairs(device_to_host);
    d_->check(d_->si.swap_out(d_->stream, p.data(), p.size()), "swap_out");
  }
  void swap_in(const BlockPairs& host_to_device) override {
    if (!supports(Feature::SwapToHost) || !d_->si.swap_in) return Backend::swap_in(host_to_device);
    const auto p = pairs(host_to_device);
    d_->check(d_->si.swap_in(d_->stream, p.data(), p.size()), "swap_in");
  }

  void set_batch(const BatchInfo& b) override {
    if (!d_->si.set_batch) d_->missing("set_batch");
    // Points into `b`, which the caller keeps until the next set_batch.
    seqs_.resize(b.seqs.size());
    group_tables_.resize(b.seqs.size());
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const SeqInfo& s = b.seqs[i];
      pglb_seq& c = seqs_[i];
      group_tables_[i].clear();
      for (const auto& t : s.group_tables) group_tables_[i].push_back(t.data());
      c.struct_size = sizeof c;
      c.q_start = s.q_start;
      c.q_len = s.q_len;
      c.ctx_len = s.ctx_len;
      c.block_table = s.block_table.data();
      c.n_blocks = static_cast<int32_t>(s.block_table.size());
      c.kv_sinks = s.kv_sinks;
      c.kv_evicted_to = s.kv_evicted_to;
      c.group_tables = group_tables_[i].empty() ? nullptr : group_tables_[i].data();
      c.state_slot = s.state_slot;
    }
    group_slots_.clear();
    for (const auto& slots : b.group_slots) group_slots_.push_back(slots.data());
    pglb_batch& c = batch_;  // kept, as the arrays it points to, until the next set_batch
    c = {};
    c.struct_size = sizeof c;
    c.n_tokens = b.n_tokens();
    c.token_ids = b.token_ids.data();
    c.positions = b.positions.data();
    c.slot_mapping = b.slot_mapping.data();
    c.n_seqs = static_cast<int32_t>(seqs_.size());
    c.seqs = seqs_.data();
    c.n_groups = static_cast<int32_t>(b.group_slots.size()) + 1;
    c.group_slot_mappings = group_slots_.empty() ? nullptr : group_slots_.data();
    d_->check(d_->si.set_batch(d_->stream, &c), "set_batch");
  }

  void embed(const Weight& table, float scale, Buffer& out) override {
    pglb_embed_params p{sizeof p, h(table), scale, h(out)};
    enqueue(PGLB_OP_EMBED, &p, "embed");
  }
  void matmul(const Weight& w, const Buffer& x, int64_t n, Buffer& y) override {
    pglb_matmul_params p{sizeof p, h(w), h(x), n, h(y)};
    enqueue(PGLB_OP_MATMUL, &p, "matmul");
  }
  void add_bias(Buffer& y, const Weight& bias, int64_t n) override {
    pglb_add_bias_params p{sizeof p, h(y), h(bias), n};
    enqueue(PGLB_OP_ADD_BIAS, &p, "add_bias");
  }
  void rms_norm(const Buffer& x, const Weight* w, int64_t n_rows, int64_t dim, float eps, Buffer& y) override {
    pglb_rms_norm_params p{sizeof p, h(x), h(w), n_rows, dim, eps, h(y)};
    enqueue(PGLB_OP_RMS_NORM, &p, "rms_norm");
  }
  void rope(Buffer& x, int n_heads, int head_dim, const RopeConfig& cfg) override {
    const pglb_rope_config r = to_c(cfg);
    pglb_rope_params p{sizeof p, h(x), n_heads, head_dim, &r};
    enqueue(PGLB_OP_ROPE, &p, "rope");
  }
  void store_kv(int layer, Buffer& k, const Buffer& v, const RopeConfig* k_rope) override {
    pglb_rope_config r{};
    if (k_rope) r = to_c(*k_rope);
    pglb_store_kv_params p{sizeof p, layer, h(k), h(v), k_rope ? &r : nullptr};
    enqueue(PGLB_OP_STORE_KV, &p, "store_kv");
  }
  pglb_attention_params attention_params(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) {
    return {sizeof(pglb_attention_params), layer, h(q), h(out), cfg.n_head, cfg.n_head_kv, cfg.head_dim,
            cfg.scale, cfg.sliding_window, cfg.softcap, h(cfg.sinks), cfg.non_causal ? 1 : 0,
            /* skip_whole: kv_seqs says it */ 0, cfg.kv_seqs.empty() ? nullptr : cfg.kv_seqs.data()};
  }
  void attention(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) override {
    pglb_attention_params p = attention_params(layer, q, out, cfg);
    enqueue(PGLB_OP_ATTENTION, &p, "attention");
  }
  void attention_kv(const Buffer& q, const Buffer& kv, const KvRowLayout& rows, Buffer& out,
                    const AttentionConfig& cfg) override {
    pglb_attention_params a = attention_params(0, q, out, cfg);  // its layer unused
    pglb_attention_kv_params p{sizeof p, &a, h(kv), rows.row, rows.v_offset, rows.v_dim, rows.context ? 1 : 0};
    enqueue(PGLB_OP_ATTENTION_KV, &p, "attention_kv");
  }
  void gather_kv(int layer, std::span<const uint8_t> seqs, Buffer& out) override {
    pglb_gather_kv_params p{sizeof p, layer, seqs.data(), h(out)};
    enqueue(PGLB_OP_GATHER_KV, &p, "gather_kv");
  }
  void glu(const Buffer& gate, const Buffer& up, int64_t n, Activation act, Buffer& out) override {
    pglb_glu_params p{sizeof p, h(gate), h(up), n, static_cast<pglb_activation>(act), h(out)};
    enqueue(PGLB_OP_GLU, &p, "glu");
  }
  void add(Buffer& y, const Buffer& x, int64_t n) override {
    pglb_add_params p{sizeof p, h(y), h(x), n};
    enqueue(PGLB_OP_ADD, &p, "add");
  }
  void gather_rows(const Buffer& x, int64_t dim, const std::vector<int32_t>& rows, Buffer& out) override {
    pglb_gather_rows_params p{sizeof p, h(x), dim, rows.data(), static_cast<int64_t>(rows.size()), h(out)};
    enqueue(PGLB_OP_GATHER_ROWS, &p, "gather_rows");
  }

  void moe_route(const Buffer& logits, int64_t n, const MoeRouting& r, Buffer& ids, Buffer& weights) override {
    if (!supports(Feature::MixtureOfExperts)) return Backend::moe_route(logits, n, r, ids, weights);
    pglb_moe_route_params p{sizeof p, h(logits), n, r.n_expert, r.k, r.scoring == RouterScoring::Sigmoid,
                            r.normalize, r.scale, h(ids), h(weights), h(r.choice_bias), r.n_group, r.topk_group,
                            r.group_score == GroupScore::Max};
    enqueue(PGLB_OP_MOE_ROUTE, &p, "moe_route");
  }
  void matmul_experts(const std::vector<const Weight*>& experts, const Buffer& x, int64_t n, int k, bool x_per_slot,
                      const Buffer& ids, Buffer& y, const std::vector<const Weight*>& biases) override {
    if (!supports(Feature::MixtureOfExperts))
      return Backend::matmul_experts(experts, x, n, k, x_per_slot, ids, y, biases);
    std::vector<const pglb_weight*> e, b;
    for (const Weight* w : experts) e.push_back(h(w));
    for (const Weight* w : biases) b.push_back(h(w));
    pglb_matmul_experts_params p{sizeof p, e.data(), static_cast<int32_t>(e.size()), h(x), n, k, x_per_slot,
                                 h(ids), h(y), b.empty() ? nullptr : b.data()};
    enqueue(PGLB_OP_MATMUL_EXPERTS, &p, "matmul_experts");
  }
  void lora_matmul(const std::vector<const Weight*>& a, const std::vector<const Weight*>& b, const Buffer& x,
                   int64_t n, const Buffer& slots, Buffer& y, Buffer* t_scratch, Buffer* d_scratch) override {
    if (lora_op_ < 0) lora_op_ = supports_op(op_query(PGLB_OP_LORA_MATMUL)) ? 1 : 0;
    if (lora_op_ == 0) return Backend::lora_matmul(a, b, x, n, slots, y, t_scratch, d_scratch);
    std::vector<const pglb_weight*> ca, cb;
    for (const Weight* w : a) ca.push_back(h(w));
    for (const Weight* w : b) cb.push_back(h(w));
    pglb_lora_matmul_params p{sizeof p, ca.data(), cb.data(), static_cast<int32_t>(ca.size()), h(x), n, h(slots),
                              h(y)};
    enqueue(PGLB_OP_LORA_MATMUL, &p, "lora_matmul");
  }
  void moe_combine(const Buffer& y, const Buffer& weights, int64_t n, int k, int64_t dim, Buffer& out) override {
    if (!supports(Feature::MixtureOfExperts)) return Backend::moe_combine(y, weights, n, k, dim, out);
    pglb_moe_combine_params p{sizeof p, h(y), h(weights), n, k, dim, h(out)};
    enqueue(PGLB_OP_MOE_COMBINE, &p, "moe_combine");
  }
  void scale_rows_sigmoid(Buffer& y, const Buffer& s, int64_t n, int64_t dim) override {
    if (!supports(Feature::MixtureOfExperts)) return Backend::scale_rows_sigmoid(y, s, n, dim);
    pglb_scale_rows_sigmoid_params p{sizeof p, h(y), h(s), n, dim};
    enqueue(PGLB_OP_SCALE_ROWS_SIGMOID, &p, "scale_rows_sigmoid");
  }

  // A device without supports_op is taken to run what the interface's
  // default says (the core ops; MoE by its feature bit; no optional op).
  bool supports_op(const OpQuery& q) const override {
    if (!d_->si.enqueue) return false;
    // A plugin older than these ops may not know to refuse them.
    if ((q.op == PGLB_OP_CAUSAL_CONV1D || q.op == PGLB_OP_GATED_DELTA_RULE) && !supports(Feature::LinearAttention))
      return false;
    if (!d_->di.supports_op) return Backend::supports_op(q);
    return d_->di.supports_op(d_->dev, &q) != 0;
  }
  void causal_conv1d(int layer, const Buffer& x, const Weight& w, const Weight* bias, Buffer& out) override {
    if (!supports(Feature::LinearAttention)) return Backend::causal_conv1d(layer, x, w, bias, out);
    pglb_causal_conv1d_params p{sizeof p, layer, h(x), h(w), bias ? h(*bias) : nullptr, h(out)};
    enqueue(PGLB_OP_CAUSAL_CONV1D, &p, "causal_conv1d");
  }
  void gated_delta_rule(int layer, const Buffer& qkv, const Buffer& a, const Buffer& b, const Weight& ssm_a,
                        const Weight& dt_bias, const GatedDeltaConfig& cfg, Buffer& out) override {
    if (!supports(Feature::LinearAttention))
      return Backend::gated_delta_rule(layer, qkv, a, b, ssm_a, dt_bias, cfg, out);
    pglb_gated_delta_rule_params p{sizeof p,       layer,          h(qkv),         h(a),
                                   h(b),           h(ssm_a),       h(dt_bias),     cfg.n_k_heads,
                                   cfg.n_v_heads,  cfg.head_k_dim, cfg.head_v_dim, cfg.scale,
                                   h(out),         cfg.v_heads_tiled ? 1 : 0};
    enqueue(PGLB_OP_GATED_DELTA_RULE, &p, "gated_delta_rule");
  }
  void layer_norm(const Buffer& x, const Weight* w, const Weight* b, int64_t n_rows, int64_t dim, float eps,
                  Buffer& y) override {
    pglb_layer_norm_params p{sizeof p, h(x), h(w), h(b), n_rows, dim, eps, h(y)};
    enqueue(PGLB_OP_LAYER_NORM, &p, "layer_norm");
  }
  void activation(const Buffer& x, int64_t n, Activation act, Buffer& out) override {
    pglb_activation_params p{sizeof p, h(x), n, static_cast<pglb_activation>(act), h(out)};
    enqueue(PGLB_OP_ACTIVATION, &p, "activation");
  }
  void softcap(Buffer& x, int64_t n, float cap) override {
    pglb_softcap_params p{sizeof p, h(x), n, cap};
    enqueue(PGLB_OP_SOFTCAP, &p, "softcap");
  }
  void sample(const Buffer& logits, int64_t n_vocab, const std::vector<SampleDraw>& draws, Buffer& ids) override {
    pglb_sample_params p{sizeof p, h(logits), n_vocab, draws.data(), static_cast<int64_t>(draws.size()), h(ids)};
    enqueue(PGLB_OP_SAMPLE, &p, "sample");
  }

  bool has_device_comm() const override { return d_->has_comm; }
  std::vector<uint8_t> comm_unique_id() override {
    if (!d_->has_comm) return Backend::comm_unique_id();
    std::vector<uint8_t> id(256);
    size_t n = id.size();
    pglb_status st = d_->ci.unique_id(d_->dev, id.data(), &n);
    if (st == PGLB_INVALID_ARGUMENT && n > id.size()) {  // a larger id: n says how large
      id.resize(n);
      st = d_->ci.unique_id(d_->dev, id.data(), &n);
    }
    d_->check(st, "comm unique_id");
    id.resize(std::min(n, id.size()));
    return id;
  }
  std::unique_ptr<DeviceComm> comm_init(int rank, int size, const std::vector<uint8_t>& id) override {
    if (!d_->has_comm) return Backend::comm_init(rank, size, id);
    pglb_comm* c = nullptr;
    d_->check(d_->ci.init(d_->dev, rank, size, id.data(), id.size(), &c), "comm init");
    return std::make_unique<CComm>(d_, c, rank, size);
  }

  void set_profiling(bool on) override {
    if (d_->di.set_profiling) d_->di.set_profiling(d_->dev, on);
  }
  std::string profile_report() const override {
    const char* s = d_->di.profile_report ? d_->di.profile_report(d_->dev) : nullptr;
    return s ? s : "";
  }

 private:
  void enqueue(pglb_op op, const void* params, const char* call) {
    d_->check(d_->si.enqueue(d_->stream, op, params), call);
  }
  static std::vector<pglb_block_pair> pairs(const BlockPairs& bp) {
    std::vector<pglb_block_pair> out(bp.size());
    for (size_t i = 0; i < bp.size(); ++i) out[i] = {bp[i].first, bp[i].second};
    return out;
  }

  DevicePtr d_;
  uint64_t features_ = 0;
  bool deterministic_ = false;
  int lora_op_ = -1;  // the device has PGLB_OP_LORA_MATMUL (asked once; -1: not yet)
  KVCacheSpec kv_;
  std::vector<pglb_seq> seqs_;
  std::vector<std::vector<const int32_t*>> group_tables_;  // [seq] its groups 1..'s tables
  std::vector<const int64_t*> group_slots_;                // groups 1..'s slot mappings
  pglb_batch batch_{};
};

}  // namespace

void check_registry(const pglb_registry* reg, const std::string& origin) {
  if (!reg) fail("backend plugin '{}' returned no registry", origin);
  if (reg->abi_version != PGLB_ABI_VERSION)
    fail("backend plugin '{}' was built for backend ABI version {}, this pagellm loads version {}: rebuild the plugin "
         "against this pagellm's include/pagellm_backend.h",
         origin, reg->abi_version, PGLB_ABI_VERSION);
  if (reg->struct_size < offsetof(pglb_registry, comm))
    fail("backend plugin '{}': its registry struct ({} bytes) is smaller than ABI version {}'s first release ({} "
         "bytes)",
         origin, reg->struct_size, PGLB_ABI_VERSION, offsetof(pglb_registry, comm));
  if (!reg->kind || !*reg->kind) fail("backend plugin '{}' names no device kind", origin);
  if (!reg->device_open || !reg->device || !reg->stream)
    fail("backend plugin '{}' ({}) has no device_open, device table or stream table", origin, reg->kind);
  const pglb_device_iface di = copy_table(reg->device);
  const pglb_stream_iface si = copy_table(reg->stream);
  if (reg->device->struct_size < offsetof(pglb_device_iface, buffer_free) + sizeof di.buffer_free ||
      reg->stream->struct_size < offsetof(pglb_stream_iface, enqueue) + sizeof si.enqueue)
    fail("backend plugin '{}' ({}): its device or stream table is smaller than ABI version {}'s", origin, reg->kind,
         PGLB_ABI_VERSION);
  const char* missing = !di.close                ? "close"
                        : !di.last_error         ? "last_error"
                        : !di.buffer_alloc       ? "buffer_alloc"
                        : !di.buffer_free        ? "buffer_free"
                        : !di.stream_create      ? "stream_create"
                        : !di.stream_destroy     ? "stream_destroy"
                        : !si.copy_from_host     ? "copy_from_host"
                        : !si.copy_to_host       ? "copy_to_host"
                        : !si.synchronize        ? "synchronize"
                        : !si.enqueue            ? "enqueue"
                                                 : nullptr;
  if (missing) fail("backend plugin '{}' ({}) does not provide {}, which every backend must", origin, reg->kind, missing);
}

int registry_device_count(const pglb_registry* reg) {
  return reg && reg->device_count ? std::max(0, reg->device_count(reg)) : 0;
}

std::unique_ptr<Backend> make_c_backend(const pglb_registry* reg, int index, const BackendOptions& options,
                                        const std::string& origin) {
  check_registry(reg, origin);
  auto d = std::make_shared<Device>();
  d->kind = reg->kind;
  d->origin = origin;
  d->reg = copy_table(reg);
  d->di = copy_table(reg->device);
  d->si = copy_table(reg->stream);
  if (d->reg.comm) {
    d->ci = copy_table(d->reg.comm);
    d->has_comm = d->ci.unique_id && d->ci.init;
  }
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  const pglb_options opts{sizeof(pglb_options), keys.size(), keys.data(), values.data()};
  char error[1024] = {};
  const pglb_status st = reg->device_open(reg, index, &opts, &d->dev, error, sizeof error);
  error[sizeof error - 1] = 0;
  if (st != PGLB_OK || !d->dev)
    fail("{} backend: opening device {} failed ({}): {}", d->kind, index, status_text(st),
         error[0] ? error : "no message");
  d->check(d->di.stream_create(d->dev, &d->stream), "stream_create");
  return std::make_unique<CBackend>(std::move(d));
}

}  // namespace pagellm
