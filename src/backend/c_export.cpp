#include "backend/c_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"

namespace pagellm {

namespace {

struct Exported {
  pglb_registry reg{};
  ExportedBackend spec;
};

// What a pglb_device is here. Buffers and weights are the backend's own
// objects (a pglb_buffer* is a Buffer*, a pglb_weight* a Weight*).
struct XDevice {
  const Exported* ex = nullptr;
  std::unique_ptr<Backend> be;
  std::string error, describe, report;
  BatchInfo batch;  // set_batch's copy: the C caller's arrays are not ours to keep
};
struct XStream {
  XDevice* d;
};
struct XEvent {};  // the backend has one in-order queue: an event is "everything so far"
struct XComm {
  XDevice* d;
  std::unique_ptr<DeviceComm> c;
};

XDevice* dev(pglb_device* d) { return reinterpret_cast<XDevice*>(d); }
XDevice* dev(pglb_stream* s) { return reinterpret_cast<XStream*>(s)->d; }
XComm* comm(pglb_comm* c) { return reinterpret_cast<XComm*>(c); }

// A struct as this side knows it: the caller's bytes up to its struct_size, zeros after.
template <class T>
T read_struct(const void* p, const char* what) {
  if (!p) fail("{}: a null parameter struct", what);
  T out{};
  const size_t n = *static_cast<const size_t*>(p);
  std::memcpy(&out, p, std::min(n, sizeof(T)));
  return out;
}

// No exception leaves a function of the tables: each becomes a status and the
// device's last_error, with the message text kept.
template <class F>
pglb_status guarded(XDevice* d, F&& f) {
  try {
    f();
    return PGLB_OK;
  } catch (const std::bad_alloc&) {
    if (d) d->error = "out of memory";
    return PGLB_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    if (d) d->error = e.what();
    return PGLB_ERROR;
  } catch (...) {
    if (d) d->error = "unknown error";
    return PGLB_ERROR;
  }
}

Buffer& buf(pglb_buffer* b, const char* what) {
  if (!b) fail("{}: a null buffer", what);
  return *reinterpret_cast<Buffer*>(b);
}
const Buffer& buf(const pglb_buffer* b, const char* what) {
  if (!b) fail("{}: a null buffer", what);
  return *reinterpret_cast<const Buffer*>(b);
}
const Weight* weight_or_null(const pglb_weight* w) { return reinterpret_cast<const Weight*>(w); }
const Weight& weight(const pglb_weight* w, const char* what) {
  if (!w) fail("{}: a null weight", what);
  return *weight_or_null(w);
}

RopeConfig rope_of(const pglb_rope_config* p) {
  const auto c = read_struct<pglb_rope_config>(p, "rope config");
  RopeConfig r;
  r.n_rot = c.n_rot;
  r.freq_base = c.freq_base;
  r.freq_scale = c.freq_scale;
  r.neox = c.neox != 0;
  r.freq_factors = weight_or_null(c.freq_factors);
  r.ext_factor = c.ext_factor;
  r.attn_factor = c.attn_factor;
  r.beta_fast = c.beta_fast;
  r.beta_slow = c.beta_slow;
  r.n_ctx_orig = c.n_ctx_orig;
  r.yarn_truncate = c.yarn_truncate != 0;
  return r;
}

BlockPairs pairs_of(const pglb_block_pair* p, size_t n) {
  if (n && !p) fail("block pairs: a null array of {} pairs", n);
  BlockPairs out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {p[i].src, p[i].dst};
  return out;
}

// The host's flags per sequence of the batch (null: none given).
std::span<const uint8_t> seq_flags(const uint8_t* flags, size_t n_seqs) {
  return flags ? std::span<const uint8_t>(flags, n_seqs) : std::span<const uint8_t>();
}

// skip_whole (older hosts) becomes the same flags: the sequences whole in the step.
AttentionConfig attention_config(const pglb_attention_params& p, const BatchInfo& batch,
                                 std::vector<uint8_t>& whole) {
  AttentionConfig c;
  c.n_head = p.n_head;
  c.n_head_kv = p.n_head_kv;
  c.head_dim = p.head_dim;
  c.scale = p.scale;
  c.sliding_window = p.sliding_window;
  c.softcap = p.softcap;
  c.sinks = weight_or_null(p.sinks);
  c.non_causal = p.non_causal != 0;
  c.kv_seqs = seq_flags(p.kv_seqs, batch.seqs.size());
  if (!p.kv_seqs && p.skip_whole) {
    whole.clear();
    for (const SeqInfo& s : batch.seqs) whole.push_back(s.ctx_len == s.q_len ? 1 : 0);
    c.kv_seqs = whole;
  }
  return c;
}

void run_op(Backend& be, const BatchInfo& batch, pglb_op op, const void* params) {
  std::vector<uint8_t> whole;
  switch (op) {
    case PGLB_OP_EMBED: {
      const auto p = read_struct<pglb_embed_params>(params, "embed");
      return be.embed(weight(p.table, "embed"), p.scale, buf(p.out, "embed"));
    }
    case PGLB_OP_MATMUL: {
      const auto p = read_struct<pglb_matmul_params>(params, "matmul");
      return be.matmul(weight(p.w, "matmul"), buf(p.x, "matmul"), p.n, buf(p.y, "matmul"));
    }
    case PGLB_OP_ADD_BIAS: {
      const auto p = read_struct<pglb_add_bias_params>(params, "add_bias");
      return be.add_bias(buf(p.y, "add_bias"), weight(p.bias, "add_bias"), p.n);
    }
    case PGLB_OP_RMS_NORM: {
      const auto p = read_struct<pglb_rms_norm_params>(params, "rms_norm");
      return be.rms_norm(buf(p.x, "rms_norm"), weight_or_null(p.w), p.n_rows, p.dim, p.eps, buf(p.y, "rms_norm"));
    }
    case PGLB_OP_ROPE: {
      const auto p = read_struct<pglb_rope_params>(params, "rope");
      return be.rope(buf(p.x, "rope"), p.n_heads, p.head_dim, rope_of(p.rope));
    }
    case PGLB_OP_STORE_KV: {
      const auto p = read_struct<pglb_store_kv_params>(params, "store_kv");
      RopeConfig r;
      if (p.k_rope) r = rope_of(p.k_rope);
      return be.store_kv(p.layer, buf(p.k, "store_kv"), buf(p.v, "store_kv"), p.k_rope ? &r : nullptr);
    }
    case PGLB_OP_ATTENTION: {
      const auto p = read_struct<pglb_attention_params>(params, "attention");
      return be.attention(p.layer, buf(p.q, "attention"), buf(p.out, "attention"), attention_config(p, batch, whole));
    }
    case PGLB_OP_ATTENTION_KV: {
      const auto p = read_struct<pglb_attention_kv_params>(params, "attention_kv");
      if (!p.attn) fail("attention_kv: no attention parameters");
      const auto a = read_struct<pglb_attention_params>(p.attn, "attention_kv");
      const KvRowLayout rows{p.kv_row, p.v_offset, p.v_dim, p.context != 0};
      return be.attention_kv(buf(a.q, "attention_kv"), buf(p.kv, "attention_kv"), rows, buf(a.out, "attention_kv"),
                             attention_config(a, batch, whole));
    }
    case PGLB_OP_GATHER_KV: {
      const auto p = read_struct<pglb_gather_kv_params>(params, "gather_kv");
      if (!p.seqs) fail("gather_kv: no sequence flags");
      return be.gather_kv(p.layer, seq_flags(p.seqs, batch.seqs.size()), buf(p.out, "gather_kv"));
    }
    case PGLB_OP_GLU: {
      const auto p = read_struct<pglb_glu_params>(params, "glu");
      if (p.act < PGLB_ACT_SILU || p.act > PGLB_ACT_SIGMOID) fail("glu: unknown activation {}", int(p.act));
      return be.glu(buf(p.gate, "glu"), buf(p.up, "glu"), p.n, static_cast<Activation>(p.act), buf(p.out, "glu"));
    }
    case PGLB_OP_ADD: {
      const auto p = read_struct<pglb_add_params>(params, "add");
      return be.add(buf(p.y, "add"), buf(p.x, "add"), p.n);
    }
    case PGLB_OP_GATHER_ROWS: {
      const auto p = read_struct<pglb_gather_rows_params>(params, "gather_rows");
      if (p.n_rows < 0 || (p.n_rows && !p.rows)) fail("gather_rows: no row indices");
      const std::vector<int32_t> rows(p.rows, p.rows + p.n_rows);
      return be.gather_rows(buf(p.x, "gather_rows"), p.dim, rows, buf(p.out, "gather_rows"));
    }
    case PGLB_OP_MOE_ROUTE: {
      const auto p = read_struct<pglb_moe_route_params>(params, "moe_route");
      MoeRouting r;
      r.n_expert = p.n_expert;
      r.k = p.k;
      r.scoring = p.sigmoid ? RouterScoring::Sigmoid : RouterScoring::Softmax;
      r.normalize = p.normalize != 0;
      r.scale = p.scale;
      r.choice_bias = weight_or_null(p.choice_bias);
      if (p.n_group > 0) r.n_group = p.n_group;
      if (p.topk_group > 0) r.topk_group = p.topk_group;
      r.group_score = p.group_score_max ? GroupScore::Max : GroupScore::Top2Sum;
      return be.moe_route(buf(p.logits, "moe_route"), p.n, r, buf(p.ids, "moe_route"), buf(p.weights, "moe_route"));
    }
    case PGLB_OP_MATMUL_EXPERTS: {
      const auto p = read_struct<pglb_matmul_experts_params>(params, "matmul_experts");
      if (p.n_experts < 0 || (p.n_experts && !p.experts)) fail("matmul_experts: no experts");
      std::vector<const Weight*> experts, biases;
      for (int32_t e = 0; e < p.n_experts; ++e) experts.push_back(weight_or_null(p.experts[e]));
      if (p.biases)
        for (int32_t e = 0; e < p.n_experts; ++e) biases.push_back(weight_or_null(p.biases[e]));
      return be.matmul_experts(experts, buf(p.x, "matmul_experts"), p.n, p.k, p.x_per_slot != 0,
                               buf(p.ids, "matmul_experts"), buf(p.y, "matmul_experts"), biases);
    }
    case PGLB_OP_MOE_COMBINE: {
      const auto p = read_struct<pglb_moe_combine_params>(params, "moe_combine");
      return be.moe_combine(buf(p.y, "moe_combine"), buf(p.weights, "moe_combine"), p.n, p.k, p.dim,
                            buf(p.out, "moe_combine"));
    }
    case PGLB_OP_SCALE_ROWS_SIGMOID: {
      const auto p = read_struct<pglb_scale_rows_sigmoid_params>(params, "scale_rows_sigmoid");
      return be.scale_rows_sigmoid(buf(p.y, "scale_rows_sigmoid"), buf(p.s, "scale_rows_sigmoid"), p.n, p.dim);
    }
    case PGLB_OP_CAUSAL_CONV1D: {
      const auto p = read_struct<pglb_causal_conv1d_params>(params, "causal_conv1d");
      return be.causal_conv1d(p.layer, buf(p.x, "causal_conv1d"), weight(p.w, "causal_conv1d"),
                              weight_or_null(p.bias), buf(p.out, "causal_conv1d"));
    }
    case PGLB_OP_GATED_DELTA_RULE: {
      const auto p = read_struct<pglb_gated_delta_rule_params>(params, "gated_delta_rule");
      const GatedDeltaConfig cfg{p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim, p.scale, p.v_heads_tiled != 0};
      return be.gated_delta_rule(p.layer, buf(p.qkv, "gated_delta_rule"), buf(p.a, "gated_delta_rule"),
                                 buf(p.b, "gated_delta_rule"), weight(p.ssm_a, "gated_delta_rule"),
                                 weight(p.dt_bias, "gated_delta_rule"), cfg, buf(p.out, "gated_delta_rule"));
    }
    case PGLB_OP_LAYER_NORM: {
      const auto p = read_struct<pglb_layer_norm_params>(params, "layer_norm");
      return be.layer_norm(buf(p.x, "layer_norm"), weight_or_null(p.w), weight_or_null(p.b), p.n_rows, p.dim, p.eps,
                           buf(p.y, "layer_norm"));
    }
    case PGLB_OP_ACTIVATION: {
      const auto p = read_struct<pglb_activation_params>(params, "activation");
      if (p.act != PGLB_ACT_SILU && p.act != PGLB_ACT_GELU_TANH && p.act != PGLB_ACT_GELU_ERF &&
          p.act != PGLB_ACT_SIGMOID)
        fail("activation: unsupported activation {}", int(p.act));
      return be.activation(buf(p.x, "activation"), p.n, static_cast<Activation>(p.act), buf(p.out, "activation"));
    }
    case PGLB_OP_LORA_MATMUL: {
      const auto p = read_struct<pglb_lora_matmul_params>(params, "lora_matmul");
      if (p.n_slots < 1 || !p.a || !p.b) fail("lora_matmul: {} slots", p.n_slots);
      std::vector<const Weight*> a, b;
      for (int32_t s = 0; s < p.n_slots; ++s) {
        a.push_back(&weight(p.a[s], "lora_matmul"));
        b.push_back(&weight(p.b[s], "lora_matmul"));
      }
      return be.lora_matmul(a, b, buf(p.x, "lora_matmul"), p.n, buf(p.slots, "lora_matmul"), buf(p.y, "lora_matmul"),
                            nullptr, nullptr);
    }
    case PGLB_OP_SOFTCAP: {
      const auto p = read_struct<pglb_softcap_params>(params, "softcap");
      return be.softcap(buf(p.x, "softcap"), p.n, p.cap);
    }
    case PGLB_OP_SAMPLE: {
      const auto p = read_struct<pglb_sample_params>(params, "sample");
      if (p.n_draws < 0 || (p.n_draws && !p.draws)) fail("sample: no draws");
      const std::vector<SampleDraw> draws(p.draws, p.draws + p.n_draws);
      return be.sample(buf(p.logits, "sample"), p.n_vocab, draws, buf(p.ids, "sample"));
    }
    default:
      fail("the {} backend has no op {}", be.name(), static_cast<int>(op));
  }
}

// ---- the device table

void x_close(pglb_device* d) { delete dev(d); }
const char* x_describe(pglb_device* d) {
  XDevice* x = dev(d);
  if (guarded(x, [&] { x->describe = x->be->describe(); }) != PGLB_OK) x->describe = x->ex->spec.kind;
  return x->describe.c_str();
}
const char* x_last_error(pglb_device* d) { return dev(d)->error.c_str(); }
pglb_status x_memory_info(pglb_device* d, pglb_memory_info* out) {
  return guarded(dev(d), [&] {
    if (!out) fail("memory_info: no output struct");
    const MemoryInfo m = dev(d)->be->memory_info();
    pglb_memory_info c{};
    c.struct_size = std::min(out->struct_size, sizeof c);
    c.total_bytes = m.total_bytes;
    c.free_bytes = m.free_bytes;
    c.host_memory = m.host_memory;
    std::memcpy(out, &c, c.struct_size);
  });
}
uint64_t x_features(pglb_device* d) {
  uint64_t bits = 0;
  guarded(dev(d), [&] {
    const Backend& be = *dev(d)->be;
    if (be.supports(Feature::SwapToHost)) bits |= PGLB_FEATURE_SWAP_TO_HOST;
    if (be.supports(Feature::AsyncOps)) bits |= PGLB_FEATURE_ASYNC_OPS;
    if (be.supports(Feature::MixtureOfExperts)) bits |= PGLB_FEATURE_MIXTURE_OF_EXPERTS;
    if (be.supports(Feature::AttentionSinks)) bits |= PGLB_FEATURE_ATTENTION_SINKS;
    if (be.supports(Feature::Deterministic)) bits |= PGLB_FEATURE_DETERMINISTIC;
    if (be.supports(Feature::KvEviction)) bits |= PGLB_FEATURE_KV_EVICTION;
    if (be.supports(Feature::KvGroups)) bits |= PGLB_FEATURE_KV_GROUPS;
    if (be.supports(Feature::LinearAttention)) bits |= PGLB_FEATURE_LINEAR_ATTENTION;
    if (be.supports(Feature::KvVIsK)) bits |= PGLB_FEATURE_KV_V_IS_K;
    if (be.supports(Feature::KvLayerShapes)) bits |= PGLB_FEATURE_KV_LAYER_SHAPES;
    if (be.supports(Feature::NonCausalAttention)) bits |= PGLB_FEATURE_NON_CAUSAL_ATTENTION;
    if (be.supports(Feature::SymmetricWindowAttention)) bits |= PGLB_FEATURE_SYMMETRIC_WINDOW_ATTENTION;
    if (be.supports(Feature::KvBlockIO)) bits |= PGLB_FEATURE_KV_BLOCK_IO;
  });
  return bits;
}
pglb_status x_set_deterministic(pglb_device* d, int32_t on) {
  return guarded(dev(d), [&] { dev(d)->be->set_deterministic(on != 0); });
}
int32_t x_supports_op(pglb_device* d, const pglb_op_query* q) {
  bool yes = false;
  guarded(dev(d), [&] { yes = dev(d)->be->supports_op(read_struct<pglb_op_query>(q, "supports_op")); });
  return yes;
}
int32_t x_supports_weight(pglb_device* d, pglb_dtype t) {
  bool yes = false;
  guarded(dev(d), [&] { yes = dev(d)->be->supports_weight(static_cast<DType>(t)); });
  return yes;
}
pglb_status x_weight_upload(pglb_device* d, const pglb_tensor* t, pglb_weight** out, pglb_weight_info* info) {
  return guarded(dev(d), [&] {
    if (!out) fail("weight_upload: no output handle");
    const auto c = read_struct<pglb_tensor>(t, "weight_upload");
    if (c.n_dims < 0 || c.n_dims > 4) fail("weight_upload: tensor with {} dimensions", c.n_dims);
    TensorData td{c.name ? c.name : "", static_cast<DType>(c.type), {c.shape, c.shape + c.n_dims}, c.data};
    std::unique_ptr<Weight> w = dev(d)->be->upload(td);
    if (info) {
      pglb_weight_info i{};
      i.struct_size = std::min(info->struct_size, sizeof i);
      i.held_type = static_cast<pglb_dtype>(w->held_type);
      i.held_bytes = w->held_bytes;
      std::memcpy(info, &i, i.struct_size);
    }
    *out = reinterpret_cast<pglb_weight*>(w.release());
  });
}
void x_weight_free(pglb_device* d, pglb_weight* w) {
  guarded(dev(d), [&] { delete reinterpret_cast<Weight*>(w); });
}
int32_t x_buffer_type_count(pglb_device*) { return 1; }
pglb_status x_buffer_type_info(pglb_device* d, int32_t type, pglb_buffer_type_info* out) {
  return guarded(dev(d), [&] {
    if (type != 0) fail("buffer type {}: the {} backend has one (0)", type, dev(d)->ex->spec.kind);
    if (!out) fail("buffer_type_info: no output struct");
    pglb_buffer_type_info i{};
    i.struct_size = std::min(out->struct_size, sizeof i);
    i.name = dev(d)->ex->spec.kind.c_str();
    i.is_host = dev(d)->be->memory_info().host_memory;
    i.alignment = 64;
    i.max_size = 0;
    std::memcpy(out, &i, i.struct_size);
  });
}
pglb_status x_buffer_alloc(pglb_device* d, int32_t type, pglb_dtype dtype, size_t count, pglb_buffer** out) {
  return guarded(dev(d), [&] {
    if (type != 0) fail("buffer type {}: the {} backend has one (0)", type, dev(d)->ex->spec.kind);
    if (!out) fail("buffer_alloc: no output handle");
    *out = reinterpret_cast<pglb_buffer*>(dev(d)->be->alloc(static_cast<DType>(dtype), count).release());
  });
}
void x_buffer_free(pglb_device* d, pglb_buffer* b) {
  guarded(dev(d), [&] { delete reinterpret_cast<Buffer*>(b); });
}
pglb_status x_kv_allocate(pglb_device* d, const pglb_kv_spec* spec) {
  return guarded(dev(d), [&] {
    const auto c = read_struct<pglb_kv_spec>(spec, "kv_allocate");
    KVCacheSpec s;
    s.n_layers = c.n_layers;
    s.n_kv_heads = c.n_kv_heads;
    s.head_dim = c.head_dim;
    s.block_size = c.block_size;
    s.num_blocks = c.num_blocks;
    s.dtype = static_cast<DType>(c.dtype);
    s.v_is_k = c.v_is_k != 0;
    if (c.n_model_layers < 0 || (c.n_model_layers > 0 && !c.layer_state && (!c.layer_group || !c.layer_slot)))
      fail("kv_allocate: {} model layers without their groups and slots", c.n_model_layers);
    if (c.n_model_layers > 0 && c.layer_state) {
      s.layer_state.assign(c.layer_state, c.layer_state + c.n_model_layers);
      s.state = {c.n_state_layers, c.state_slots, c.conv_dim, c.conv_kernel, c.n_v_heads, c.head_k_dim, c.head_v_dim};
    }
    if (c.n_model_layers > 0 && c.layer_group && c.layer_slot) {
      s.layer_group.assign(c.layer_group, c.layer_group + c.n_model_layers);
      s.layer_slot.assign(c.layer_slot, c.layer_slot + c.n_model_layers);
      if (c.layer_kv_heads && c.layer_head_dim) {
        s.layer_kv_heads.assign(c.layer_kv_heads, c.layer_kv_heads + c.n_model_layers);
        s.layer_head_dim.assign(c.layer_head_dim, c.layer_head_dim + c.n_model_layers);
      }
    }
    dev(d)->be->allocate_kv_cache(s);
  });
}
pglb_status x_swap_allocate(pglb_device* d, int32_t num_blocks) {
  return guarded(dev(d), [&] { dev(d)->be->allocate_swap_space(num_blocks); });
}
pglb_status x_stream_create(pglb_device* d, pglb_stream** out) {
  return guarded(dev(d), [&] {
    if (!out) fail("stream_create: no output handle");
    *out = reinterpret_cast<pglb_stream*>(new XStream{dev(d)});
  });
}
void x_stream_destroy(pglb_device*, pglb_stream* s) { delete reinterpret_cast<XStream*>(s); }
pglb_status x_event_create(pglb_device* d, pglb_event** out) {
  return guarded(dev(d), [&] {
    if (!out) fail("event_create: no output handle");
    *out = reinterpret_cast<pglb_event*>(new XEvent);
  });
}
pglb_status x_event_synchronize(pglb_device* d, pglb_event*) {
  return guarded(dev(d), [&] { dev(d)->be->synchronize(); });
}
void x_event_destroy(pglb_device*, pglb_event* e) { delete reinterpret_cast<XEvent*>(e); }
void x_set_profiling(pglb_device* d, int32_t on) {
  guarded(dev(d), [&] { dev(d)->be->set_profiling(on != 0); });
}
const char* x_profile_report(pglb_device* d) {
  XDevice* x = dev(d);
  if (guarded(x, [&] { x->report = x->be->profile_report(); }) != PGLB_OK) x->report.clear();
  return x->report.c_str();
}

// ---- the stream table

pglb_status s_copy_from_host(pglb_stream* s, const void* src, pglb_buffer* dst, size_t offset, size_t bytes) {
  return guarded(dev(s), [&] { dev(s)->be->copy_from_host(src, buf(dst, "copy_from_host"), offset, bytes); });
}
pglb_status s_copy_to_host(pglb_stream* s, const pglb_buffer* src, size_t offset, size_t bytes, void* dst) {
  return guarded(dev(s), [&] { dev(s)->be->copy_to_host(buf(src, "copy_to_host"), offset, bytes, dst); });
}
pglb_status s_synchronize(pglb_stream* s) {
  return guarded(dev(s), [&] { dev(s)->be->synchronize(); });
}
pglb_status s_set_batch(pglb_stream* s, const pglb_batch* batch) {
  XDevice* d = dev(s);
  return guarded(d, [&] {
    const auto c = read_struct<pglb_batch>(batch, "set_batch");
    if (c.n_tokens < 0 || c.n_seqs < 0) fail("set_batch: negative counts");
    if (c.n_tokens && (!c.token_ids || !c.positions || !c.slot_mapping)) fail("set_batch: missing token arrays");
    if (c.n_seqs && !c.seqs) fail("set_batch: missing sequences");
    BatchInfo& b = d->batch;
    b.token_ids.assign(c.token_ids, c.token_ids + c.n_tokens);
    b.positions.assign(c.positions, c.positions + c.n_tokens);
    b.slot_mapping.assign(c.slot_mapping, c.slot_mapping + c.n_tokens);
    if (c.n_groups < 0 || (c.n_groups > 1 && !c.group_slot_mappings))
      fail("set_batch: {} KV-cache groups without their slot mappings", c.n_groups);
    const int32_t n_groups = std::max(c.n_groups, 1);
    b.group_slots.resize(static_cast<size_t>(n_groups - 1));
    for (int32_t g = 1; g < n_groups; ++g) {
      const int64_t* slots = c.group_slot_mappings[g - 1];
      if (c.n_tokens && !slots) fail("set_batch: KV-cache group {} has no slot mapping", g);
      b.group_slots[g - 1].assign(slots, slots + c.n_tokens);
    }
    b.seqs.resize(static_cast<size_t>(c.n_seqs));
    for (int32_t i = 0; i < c.n_seqs; ++i) {
      const auto q = read_struct<pglb_seq>(&c.seqs[i], "set_batch");
      SeqInfo& o = b.seqs[i];
      o.q_start = q.q_start;
      o.q_len = q.q_len;
      o.ctx_len = q.ctx_len;
      if (q.n_blocks < 0 || (q.n_blocks && !q.block_table)) fail("set_batch: sequence {} has no block table", i);
      o.block_table.assign(q.block_table, q.block_table + q.n_blocks);
      o.kv_sinks = q.kv_sinks;
      o.kv_evicted_to = q.kv_evicted_to;
      o.state_slot = q.state_slot;
      o.group_tables.resize(static_cast<size_t>(n_groups - 1));
      if (n_groups > 1 && !q.group_tables) fail("set_batch: sequence {} has no KV-cache group tables", i);
      for (int32_t g = 1; g < n_groups; ++g) {
        const int32_t* t = q.group_tables[g - 1];
        if (q.n_blocks && !t) fail("set_batch: sequence {} has no table for KV-cache group {}", i, g);
        o.group_tables[g - 1].assign(t, t + q.n_blocks);
      }
    }
    d->be->set_batch(b);
  });
}
pglb_status s_enqueue(pglb_stream* s, pglb_op op, const void* params) {
  return guarded(dev(s), [&] { run_op(*dev(s)->be, dev(s)->batch, op, params); });
}
pglb_status s_copy_blocks(pglb_stream* s, const pglb_block_pair* p, size_t n) {
  return guarded(dev(s), [&] { dev(s)->be->copy_blocks(pairs_of(p, n)); });
}
pglb_status s_swap_out(pglb_stream* s, const pglb_block_pair* p, size_t n) {
  return guarded(dev(s), [&] { dev(s)->be->swap_out(pairs_of(p, n)); });
}
pglb_status s_swap_in(pglb_stream* s, const pglb_block_pair* p, size_t n) {
  return guarded(dev(s), [&] { dev(s)->be->swap_in(pairs_of(p, n)); });
}
pglb_status s_copy_states(pglb_stream* s, const pglb_block_pair* p, size_t n) {
  return guarded(dev(s), [&] { dev(s)->be->copy_states(pairs_of(p, n)); });
}
pglb_status s_read_kv_blocks(pglb_stream* s, const int32_t* blocks, size_t n, void* dst) {
  return guarded(dev(s), [&] { dev(s)->be->read_kv_blocks({blocks, n}, static_cast<uint8_t*>(dst)); });
}
pglb_status s_write_kv_blocks(pglb_stream* s, const int32_t* blocks, size_t n, const void* src) {
  return guarded(dev(s), [&] { dev(s)->be->write_kv_blocks({blocks, n}, static_cast<const uint8_t*>(src)); });
}
pglb_status s_event_record(pglb_stream*, pglb_event*) { return PGLB_OK; }
pglb_status s_event_wait(pglb_stream*, pglb_event*) { return PGLB_OK; }  // one queue: already in order

// ---- the communicator table

pglb_status c_unique_id(pglb_device* d, void* id, size_t* id_bytes) {
  XDevice* x = dev(d);
  std::vector<uint8_t> u;
  const pglb_status st = guarded(x, [&] {
    if (!id_bytes || (*id_bytes && !id)) fail("comm unique_id: no room for the id");
    u = x->be->comm_unique_id();
  });
  if (st != PGLB_OK) return st;
  if (*id_bytes < u.size()) {  // the caller may retry with *id_bytes
    x->error = "comm unique_id: the id takes " + std::to_string(u.size()) + " bytes, " + std::to_string(*id_bytes) +
               " given";
    *id_bytes = u.size();
    return PGLB_INVALID_ARGUMENT;
  }
  if (!u.empty()) std::memcpy(id, u.data(), u.size());
  *id_bytes = u.size();
  return PGLB_OK;
}
pglb_status c_init(pglb_device* d, int32_t rank, int32_t size, const void* id, size_t id_bytes, pglb_comm** out) {
  return guarded(dev(d), [&] {
    if (!out) fail("comm init: no output handle");
    const auto* p = static_cast<const uint8_t*>(id);
    std::vector<uint8_t> u(p, p + (p ? id_bytes : 0));
    auto x = std::make_unique<XComm>(XComm{dev(d), dev(d)->be->comm_init(rank, size, u)});
    *out = reinterpret_cast<pglb_comm*>(x.release());
  });
}
void c_destroy(pglb_comm* c) {
  XComm* x = comm(c);
  guarded(x->d, [&] { delete x; });
}
pglb_status c_all_reduce_sum(pglb_comm* c, pglb_stream*, pglb_buffer* b, size_t offset, size_t count) {
  return guarded(comm(c)->d, [&] { comm(c)->c->all_reduce_sum(buf(b, "all_reduce_sum"), offset, count); });
}
pglb_status c_all_gather(pglb_comm* c, pglb_stream*, const pglb_buffer* in, size_t count, pglb_buffer* out) {
  return guarded(comm(c)->d, [&] { comm(c)->c->all_gather(buf(in, "all_gather"), count, buf(out, "all_gather")); });
}
pglb_status c_broadcast(pglb_comm* c, pglb_stream*, pglb_buffer* b, size_t count, int32_t root) {
  return guarded(comm(c)->d, [&] { comm(c)->c->broadcast(buf(b, "broadcast"), count, root); });
}
pglb_status c_send(pglb_comm* c, pglb_stream*, const pglb_buffer* b, size_t count, int32_t dst) {
  return guarded(comm(c)->d, [&] { comm(c)->c->send(buf(b, "send"), count, dst); });
}
pglb_status c_recv(pglb_comm* c, pglb_stream*, pglb_buffer* b, size_t count, int32_t src) {
  return guarded(comm(c)->d, [&] { comm(c)->c->recv(buf(b, "recv"), count, src); });
}

// ---- the registry

int32_t r_device_count(const pglb_registry* reg) {
  const Exported* ex = static_cast<const Exported*>(reg->context);
  int32_t n = 0;
  guarded(nullptr, [&] { n = ex->spec.device_count ? ex->spec.device_count() : 1; });
  return n;
}
pglb_status r_device_open(const pglb_registry* reg, int32_t index, const pglb_options* options, pglb_device** out,
                          char* error, size_t error_len) {
  const Exported* ex = static_cast<const Exported*>(reg->context);
  auto d = std::make_unique<XDevice>();
  d->ex = ex;
  const pglb_status st = guarded(d.get(), [&] {
    if (!out) fail("device_open: no output handle");
    BackendOptions o;
    if (options) {
      const auto c = read_struct<pglb_options>(options, "device_open");
      for (size_t i = 0; i < c.count; ++i)
        if (c.keys[i] && c.values[i]) o[c.keys[i]] = c.values[i];
    }
    d->be = ex->spec.create(index, o);
    if (!d->be) fail("the {} backend made no device {}", ex->spec.kind, index);
  });
  if (st != PGLB_OK) {
    if (error && error_len) std::snprintf(error, error_len, "%s", d->error.c_str());
    return st;
  }
  *out = reinterpret_cast<pglb_device*>(d.release());
  return PGLB_OK;
}

constexpr pglb_device_iface kDeviceTable = {
    sizeof(pglb_device_iface), x_close, x_describe, x_last_error, x_memory_info, x_features, x_set_deterministic,
    x_supports_op, x_supports_weight, x_weight_upload, x_weight_free, x_buffer_type_count, x_buffer_type_info,
    x_buffer_alloc, x_buffer_free, x_kv_allocate, x_swap_allocate, x_stream_create, x_stream_destroy,
    x_event_create, x_event_synchronize, x_event_destroy, x_set_profiling, x_profile_report};
constexpr pglb_stream_iface kStreamTable = {
    sizeof(pglb_stream_iface), s_copy_from_host, s_copy_to_host, s_synchronize, s_set_batch, s_enqueue,
    s_copy_blocks, s_swap_out, s_swap_in, s_event_record, s_event_wait, s_copy_states, s_read_kv_blocks,
    s_write_kv_blocks};
constexpr pglb_comm_iface kCommTable = {sizeof(pglb_comm_iface), c_unique_id, c_init, c_destroy, c_all_reduce_sum,
                                        c_all_gather, c_broadcast, c_send, c_recv};

}  // namespace

const pglb_registry* export_backend(ExportedBackend spec) {
  PAGELLM_CHECK(spec.create, "export_backend: the {} backend has no create function", spec.kind);
  auto* ex = new Exported;  // lives for the program, as a plugin's registry does
  {
    // Held from a global, so leak checkers see the registries as reachable.
    static std::mutex mu;
    static auto* kept = new std::vector<Exported*>;
    std::lock_guard lock(mu);
    kept->push_back(ex);
  }
  ex->spec = std::move(spec);
  pglb_registry& r = ex->reg;
  r.struct_size = sizeof r;
  r.abi_version = PGLB_ABI_VERSION;
  r.kind = ex->spec.kind.c_str();
  r.description = ex->spec.description.c_str();
  r.device_count = r_device_count;
  r.device_open = r_device_open;
  r.device = &kDeviceTable;
  r.stream = &kStreamTable;
  r.comm = ex->spec.device_comm ? &kCommTable : nullptr;
  r.context = ex;
  return &r;
}

}  // namespace pagellm
