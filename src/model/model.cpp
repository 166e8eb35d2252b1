#include "model/model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "dist/communicator.h"
#include "dist/device_comm.h"
#include "format/gguf.h"
#include "model/tensor_source.h"

namespace pagellm {

Model::Model(const ModelConfig& cfg, Backend& backend, const ModelShard& shard)
    : cfg_(cfg), backend_(backend), shard_(shard), geo_(shard_geometry(cfg, shard)) {
  softcap_on_device_ = cfg_.final_softcap > 0 && !geo_.tp && backend_.supports_op(op_query(PGLB_OP_SOFTCAP));
}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, Backend& backend, const LoadProgress& progress,
                                   const ModelShard& shard) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("model '{}' does not exist", path);
  if (fs::is_directory(path)) {
    const std::string cfg_path = (fs::path(path) / "config.json").string();
    if (!fs::exists(cfg_path)) fail("'{}' is a folder without config.json (expected a Hugging Face model folder)", path);
    const ModelConfig cfg = config_from_hf_json(cfg_path);
    auto src = hf_tensor_source(path, cfg);
    auto m = from_source(cfg, *src, backend, progress, shard);
    m->source_ = std::move(src);
    return m;
  }
  auto gguf = GGUFFile::open(path);
  const ModelConfig cfg = config_from_gguf(*gguf);
  auto src = gguf_tensor_source(*gguf);
  auto m = from_source(cfg, *src, backend, progress, shard);
  m->gguf_ = std::move(gguf);
  m->source_ = std::move(src);
  return m;
}

namespace {

// One expert's tensor where the source stores each expert on its own (HF).
std::string expert_part_name(const std::string& name, int64_t e) { return fmt::format("{}[{}]", name, e); }

// Bytes of weights one token's forward pass reads in layer il: a decode step
// reads each weight once, so this is what a stage's share of a step costs.
// Routed experts count the n_expert_used / n_expert of them a token visits.
int64_t layer_read_bytes(const ModelConfig& c, const TensorSource& src, int il) {
  int64_t total = 0;
  for (const TensorSpec& spec : arch_info(c.arch).layer) {
    const std::string name = layer_tensor_name(spec, il);
    int64_t bytes = 0;
    if (const TensorData* t = src.find(name)) {
      bytes = static_cast<int64_t>(t->bytes());
    } else if (spec.experts) {
      for (int e = 0; e < c.n_expert; ++e)
        if (const TensorData* p = src.find(expert_part_name(name, e))) bytes += static_cast<int64_t>(p->bytes());
    }
    if (spec.experts && c.n_expert > 0) bytes = bytes * c.n_expert_used / c.n_expert;
    total += bytes;
  }
  return total;
}

}  // namespace

std::unique_ptr<Model> Model::from_source(const ModelConfig& cfg, const TensorSource& src, Backend& backend,
                                          const LoadProgress& progress, const ModelShard& requested) {
  ModelShard shard = requested;
  if (shard.pp_size > 1 && shard.balance_stages && shard.layer_partition.empty() && cfg.n_layer >= shard.pp_size) {
    // Every rank reads the same file, so every rank computes the same stages.
    std::vector<int64_t> layer_cost(cfg.n_layer);
    for (int il = 0; il < cfg.n_layer; ++il) layer_cost[il] = layer_read_bytes(cfg, src, il);
    const TensorData* out = src.find("output.weight");
    if (!out) out = src.find("token_embd.weight");  // tied embeddings
    shard.layer_partition = balance_pipeline_stages(layer_cost, out ? static_cast<int64_t>(out->bytes()) : 0, shard.pp_size);
  }
  std::unique_ptr<Model> m(new Model(cfg, backend, shard));
  if (const auto derive = arch_info(cfg.arch).derive_tensors) m->derived_ = derive(cfg, src);
  m->load_weights(m->derived_ ? *m->derived_ : src, progress);
  return m;
}

std::unique_ptr<Weight>& Model::slot(Slot s, int il) {
  switch (s) {
    case Slot::TokEmbd: return tok_embd_;
    case Slot::OutputNorm: return output_norm_;
    case Slot::Output: return output_;
    case Slot::RopeFreqs: return rope_freqs_;
    case Slot::RopeFactorsShort: return rope_short_;
    case Slot::RopeFactorsLong: return rope_long_;
    case Slot::PleTokEmbd: return ple_tok_embd_;
    case Slot::PleModelProj: return ple_model_proj_;
    case Slot::PleProjNorm: return ple_proj_norm_;
    case Slot::TokEmbdNorm: return tok_norm_;
    case Slot::TokEmbdNormBias: return tok_norm_b_;
    default: break;
  }
  AttnWeights& A = layers_.at(il).attn;
  FfnWeights& F = layers_.at(il).ffn;
  switch (s) {
    case Slot::AttnNorm: return A.norm;
    case Slot::AttnNormBias: return A.norm_b;
    case Slot::FfnNormBias: return F.norm_b;
    case Slot::UpBias: return F.up_b;
    case Slot::DownBias: return F.down_b;
    case Slot::Q: return A.wq;
    case Slot::K: return A.wk;
    case Slot::V: return A.wv;
    case Slot::O: return A.wo;
    case Slot::QBias: return A.bq;
    case Slot::KBias: return A.bk;
    case Slot::VBias: return A.bv;
    case Slot::OBias: return A.bo;
    case Slot::AttnSinks: return A.sinks;
    case Slot::QNorm: return A.q_norm;
    case Slot::KNorm: return A.k_norm;
    case Slot::PostAttnNorm: return A.post_norm;
    case Slot::QGate: return A.wq_gate;
    case Slot::MlaQA: return A.q_a;
    case Slot::MlaQANorm: return A.q_a_norm;
    case Slot::MlaKvRope: return A.kv_rope;
    case Slot::MlaKvLatent: return A.kv_latent;
    case Slot::MlaKvNorm: return A.kv_norm;
    case Slot::RouterChoiceBias: return F.router_choice_bias;
    case Slot::LinQkv: return layers_.at(il).lin.qkv;
    case Slot::LinZ: return layers_.at(il).lin.z;
    case Slot::LinBeta: return layers_.at(il).lin.beta;
    case Slot::LinAlpha: return layers_.at(il).lin.alpha;
    case Slot::LinConv: return layers_.at(il).lin.conv;
    case Slot::LinA: return layers_.at(il).lin.ssm_a;
    case Slot::LinDtBias: return layers_.at(il).lin.dt_bias;
    case Slot::LinNorm: return layers_.at(il).lin.norm;
    case Slot::LinOut: return layers_.at(il).lin.out;
    case Slot::PleGate: return layers_.at(il).ple.gate;
    case Slot::PleProj: return layers_.at(il).ple.proj;
    case Slot::PlePostNorm: return layers_.at(il).ple.post_norm;
    case Slot::LayerOutScale: return layers_.at(il).out_scale_w;
    case Slot::RouterInScale: return F.router_in_scale;
    case Slot::PostFfnNorm1: return F.post_norm1;
    case Slot::FfnNorm2: return F.norm2;
    case Slot::PostFfnNorm2: return F.post_norm2;
    case Slot::FfnNorm: return F.norm;
    case Slot::Gate: return F.gate;
    case Slot::Up: return F.up;
    case Slot::Down: return F.down;
    case Slot::PostFfnNorm: return F.post_norm;
    case Slot::Router: return F.router;
    case Slot::RouterBias: return F.router_bias;
    case Slot::GateShexp: return F.gate_shexp;
    case Slot::UpShexp: return F.up_shexp;
    case Slot::DownShexp: return F.down_shexp;
    case Slot::ShexpGate: return F.shexp_gate;
    default: break;
  }
  fail("unknown weight slot {}", static_cast<int>(s));
}

std::vector<std::unique_ptr<Weight>>& Model::expert_slot(Slot s, int il) {
  FfnWeights& F = layers_.at(il).ffn;
  switch (s) {
    case Slot::GateExps: return F.gate_exps;
    case Slot::UpExps: return F.up_exps;
    case Slot::DownExps: return F.down_exps;
    case Slot::GateExpsBias: return F.gate_exps_b;
    case Slot::UpExpsBias: return F.up_exps_b;
    case Slot::DownExpsBias: return F.down_exps_b;
    case Slot::MlaQAbsorb: return layers_.at(il).attn.q_absorb;
    case Slot::MlaOAbsorb: return layers_.at(il).attn.o_absorb;
    case Slot::MlaKvExpand: return layers_.at(il).attn.kv_expand;
    default: break;
  }
  fail("weight slot {} does not hold experts", static_cast<int>(s));
}

namespace {

// Shapes equal up to trailing 1s: a one-row matrix is [n] in GGUF, [n, 1] in HF.
bool same_shape(std::vector<int64_t> a, std::vector<int64_t> b) {
  while (a.size() > 1 && a.back() == 1) a.pop_back();
  while (b.size() > 1 && b.back() == 1) b.pop_back();
  return a == b;
}

// Part k of a tensor whose parts alternate every head (TensorSpec::
// split_per_head): each head's k-th run of rows, gathered in their type.
TensorData per_head_part(const TensorData& t, const std::vector<int64_t>& parts, size_t k, int n_head,
                         std::vector<AlignedBuffer>& storage) {
  const size_t row_bytes = dtype_row_bytes(t.type, t.cols());
  int64_t per_head = 0, before = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    per_head += parts[i] / n_head;
    if (i < k) before += parts[i] / n_head;
  }
  const int64_t run = parts[k] / n_head;
  AlignedBuffer& buf = storage.emplace_back(allocate_aligned(static_cast<size_t>(parts[k]) * row_bytes));
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int h = 0; h < n_head; ++h)
    std::memcpy(buf.get() + static_cast<size_t>(h * run) * row_bytes,
                src + static_cast<size_t>(h * per_head + before) * row_bytes, static_cast<size_t>(run) * row_bytes);
  TensorData out = t;
  out.shape = {t.cols(), parts[k]};
  out.data = buf.get();
  return out;
}

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s;
  for (auto v : d) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

}  // namespace

void Model::load_weights(const TensorSource& src, const LoadProgress& progress) {
  const ModelConfig& c = cfg_;
  const ArchInfo& arch = arch_info(c.arch);
  size_t total = 0, done = 0;
  if (c.moe() && !backend_.supports(Feature::MixtureOfExperts))
    fail("the {} backend does not run Mixture-of-Experts models ({} has {} experts per layer); use --device cpu",
         backend_.name(), arch.gguf_name, c.n_expert);
  if (arch.attn_sinks && !backend_.supports(Feature::AttentionSinks))
    fail("the {} backend does not support attention sinks, which {} uses; use --device cpu", backend_.name(),
         arch.gguf_name);
  // Every op a forward pass runs, asked before anything is uploaded (a
  // plugin may implement a subset: the model is refused now, by op name).
  for (pglb_op op : {PGLB_OP_EMBED, PGLB_OP_RMS_NORM, PGLB_OP_ROPE, PGLB_OP_STORE_KV, PGLB_OP_ATTENTION, PGLB_OP_GLU,
                     PGLB_OP_ADD, PGLB_OP_GATHER_ROWS}) {
    if (!backend_.supports_op(op_query(op, {{DType::F32, {c.n_embd, 1}}})))
      fail("the {} backend cannot run the {} op, which every {} forward pass needs", backend_.name(), op_name(op),
           arch.gguf_name);
  }
  if (c.non_causal && !backend_.supports(Feature::NonCausalAttention))
    fail("the {} backend does not support non-causal (bidirectional) attention, which the encoder {} uses; use "
         "--device cpu", backend_.name(), arch.gguf_name);
  if (c.non_causal && c.sliding_window > 0 && !backend_.supports(Feature::SymmetricWindowAttention))
    fail("the {} backend does not support bidirectional sliding-window attention, which {} uses; use --device cpu",
         backend_.name(), arch.gguf_name);
  for (pglb_op op : arch.extra_ops)
    if (!backend_.supports_op(op_query(op)))
      fail("the {} backend cannot run the {} op, which every {} forward pass needs; use --device cpu", backend_.name(),
           op_name(op), arch.gguf_name);
  if (c.non_causal)
    PAGELLM_CHECK(!geo_.tp && shard_.pp_size == 1, "encoders ({}) do not run under tensor or pipeline parallelism yet",
                  arch.gguf_name);
  if (c.n_linear_layers() > 0) {
    if (!backend_.supports(Feature::LinearAttention) || !backend_.supports(Feature::KvGroups))
      fail("the {} backend does not run linear-attention (Gated DeltaNet) layers, which {} has; use --device cpu",
           backend_.name(), arch.gguf_name);
    for (pglb_op op : {PGLB_OP_CAUSAL_CONV1D, PGLB_OP_GATED_DELTA_RULE})
      if (!backend_.supports_op(op_query(op)))
        fail("the {} backend cannot run the {} op, which {}'s linear-attention layers need", backend_.name(),
             op_name(op), arch.gguf_name);
  }
  if (c.is_mla()) {
    // The per-head absorbed products are expert-grouped products.
    if (!backend_.supports(Feature::MixtureOfExperts) || !backend_.supports_op(op_query(PGLB_OP_MATMUL_EXPERTS)))
      fail("the {} backend cannot run multi-head latent attention (it needs matmul_experts), which {} uses; use "
           "--device cpu", backend_.name(), arch.gguf_name);
  }
  if (c.moe())
    for (pglb_op op : {PGLB_OP_MOE_ROUTE, PGLB_OP_MATMUL_EXPERTS, PGLB_OP_MOE_COMBINE})
      if (!backend_.supports_op(op_query(op)))
        fail("the {} backend cannot run the {} op, which {}'s Mixture-of-Experts layers need", backend_.name(),
             op_name(op), arch.gguf_name);
  layers_.resize(c.n_layer);
  for (int pass = 0; pass < 2; ++pass) {
    // Pass 0 checks and counts the tensors (for progress), pass 1 uploads them.
    // An expert tensor is one stacked GGUF tensor or one tensor per expert
    // ("<name>[e]", as the HF source names them); either way each expert is
    // uploaded as its own matrix.
    auto get_experts = [&](const TensorSpec& spec, const std::string& name, int il, const ModelConfig& lc) {
      const Dims shape = spec.shape(lc);  // [cols, rows, n_expert] or [cols, n_expert]
      const Dims one_shape(shape.begin(), shape.end() - 1);
      const int64_t n_expert = shape.back();
      std::vector<TensorData> parts;
      const bool any = src.find(name) || src.find(name + "[0]");
      if (!any && !tensor_required(spec, c, il)) return;
      if (const TensorData* t = src.find(name)) {
        if (t->shape != shape)
          fail("tensor '{}' has shape [{}], expected [{}]", name, dims_text(t->shape), dims_text(shape));
        for (int64_t e = 0; e < n_expert; ++e) parts.push_back(expert_slice(*t, e));
      } else {
        for (int64_t e = 0; e < n_expert; ++e) {
          const std::string one = expert_part_name(name, e);
          const TensorData* p = src.find(one);
          if (!p) {
            if (!tensor_required(spec, c, il)) return;
            fail("model is missing tensor '{}' (expert {} of {}; architecture {} with {} experts)",
                 e == 0 ? name : one, e, n_expert, arch.gguf_name, c.n_expert);
          }
          if (p->shape != one_shape)
            fail("tensor '{}' has shape [{}], expected [{}]", one, dims_text(p->shape), dims_text(one_shape));
          parts.push_back(*p);
        }
      }
      if (pass == 0) {
        if (spec.matrix && !backend_.supports_weight(parts[0].type))
          fail("tensor '{}' has type {}, which the {} backend does not support", name, dtype_name(parts[0].type),
               backend_.name());
        total += parts.size();
        return;
      }
      auto& ws = expert_slot(spec.slots[0], il);
      ws.clear();
      TensorCut cut = tensor_cut(spec.slots[0], geo_.for_layer(il), shard_.tp_rank, lc.head_dim);
      if (cut.kind == TensorCut::None) return;
      if (cut.kind == TensorCut::Stack) {  // this rank's heads' matrices, each whole
        PAGELLM_CHECK(cut.begin >= 0 && cut.begin + cut.count <= static_cast<int64_t>(parts.size()),
                      "tensor '{}': matrices [{}, {}) outside its {}", name, cut.begin, cut.begin + cut.count,
                      parts.size());
        parts = std::vector<TensorData>(parts.begin() + cut.begin, parts.begin() + cut.begin + cut.count);
        cut = {};
      }
      for (const TensorData& whole : parts) {
        const TensorData p = cut_tensor(whole, cut, shard_storage_);
        const size_t bytes = p.bytes();
        weight_bytes_ += bytes;
        // MLA's per-head matrices are stacked like experts, but every token reads them all.
        const Slot s0 = spec.slots[0];
        if (s0 != Slot::MlaQAbsorb && s0 != Slot::MlaOAbsorb && s0 != Slot::MlaKvExpand) expert_bytes_ += bytes;
        ws.push_back(backend_.upload(p));
        held_weight_bytes_ += ws.back()->held_bytes;
        if (progress) progress(++done, total);
      }
    };
    auto get = [&](const TensorSpec& spec, const std::string& name, int il, const ModelConfig& lc) {
      if (!tensor_in_layer(spec, c, il)) return;  // another kind of layer's tensor (Qwen3.5)
      if (spec.experts) return get_experts(spec, name, il, lc);
      const TensorData* t = src.find(name);
      if (!t) {
        if (tensor_required(spec, c, il)) fail("model is missing tensor '{}'", name);
        return;
      }
      const Dims shape = spec.shape(lc);
      std::vector<int64_t> parts{t->rows()};
      if (spec.split_rows) parts = spec.split_rows(lc);
      if (pass == 0) {
        // Checked before anything is uploaded, so a bad file fails fast.
        // Only a one-row matrix may drop its trailing 1: a vector slot (a norm)
        // given [n, 1] would be uploaded as a matrix, which norms cannot read.
        if (spec.matrix ? !same_shape(t->shape, shape) : t->shape != shape)
          fail("tensor '{}' has shape [{}], expected [{}]", name, dims_text(t->shape), dims_text(shape));
        if (t->shape.size() > 1 && !backend_.supports_weight(t->type))
          fail("tensor '{}' has type {}, which the {} backend does not support", name, dtype_name(t->type),
               backend_.name());
        int64_t rows = 0;
        for (int64_t r : parts) rows += r;
        const int heads = spec.split_heads ? spec.split_heads(lc) : lc.n_head;
        PAGELLM_CHECK(rows == t->rows() && parts.size() == spec.slots.size() &&
                          (!spec.split_per_head || (heads > 0 && rows % heads == 0)),
                      "tensor '{}': {} rows do not split into the parts the architecture expects", name, t->rows());
        if (spec.slots[0] != Slot::Unused) total += parts.size();
        return;
      }
      if (spec.slots[0] == Slot::Unused) return;  // read only to derive others (checked above)
      if (spec.slots[0] == Slot::PosEmbd || spec.slots[0] == Slot::TokTypes) {
        // Kept on the host as F32 (Model::add_positions).
        const int64_t rows = t->rows(), cols = t->cols();
        std::vector<float>& dst = spec.slots[0] == Slot::TokTypes ? type_table_ : pos_table_;
        dst.resize(static_cast<size_t>(rows * cols));
        const size_t rb = dtype_row_bytes(t->type, cols);
        for (int64_t r = 0; r < rows; ++r)
          dequantize_row_ref(t->type, static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * rb,
                             dst.data() + r * cols, cols);
        weight_bytes_ += t->bytes();
        return;
      }
      const size_t row_bytes = dtype_row_bytes(t->type, t->cols());
      // A fused tensor is uploaded as one Weight per row range.
      int64_t row0 = 0;
      for (size_t k = 0; k < spec.slots.size(); ++k) {
        TensorData part = *t;
        if (spec.split_per_head) {
          part = per_head_part(*t, parts, k, spec.split_heads ? spec.split_heads(lc) : lc.n_head, shard_storage_);
        } else if (spec.slots.size() > 1) {
          part.shape = {t->cols(), parts[k]};
          part.data = static_cast<const uint8_t*>(t->data) + static_cast<size_t>(row0) * row_bytes;
        }
        if (!spec.matrix && part.shape.size() == 2) part.shape = {part.cols() * part.rows()};  // conv taps: one vector
        row0 += parts[k];
        const TensorCut cut = tensor_cut(spec.slots[k], geo_.for_layer(il), shard_.tp_rank, lc.head_dim);
        if (cut.kind == TensorCut::None) continue;
        part = cut_tensor(part, cut, shard_storage_);
        if (spec.slots.size() == 1 && spec.matrix && part.shape.size() == 1)
          part.shape = {part.cols(), 1};  // a one-row matrix stored as a vector
        const size_t bytes = part.bytes();
        weight_bytes_ += bytes;
        if (spec.slots[k] == Slot::TokEmbd) tok_embd_bytes_ = bytes;
        auto& w = slot(spec.slots[k], il);
        w = backend_.upload(part);
        if (spec.slots[k] == Slot::LayerOutScale) {
          // Applied as a host scalar (Backend::scale).
          PAGELLM_CHECK(part.shape == std::vector<int64_t>{1}, "tensor '{}' is not one value", name);
          dequantize_row_ref(part.type, part.data, &layers_[static_cast<size_t>(il)].out_scale, 1);
        }
        held_weight_bytes_ += w->held_bytes;
        if (progress) progress(++done, total);
      }
    };
    // A pipeline stage maps only its layers, the embedding table when it is
    // the first (or the last, when the output matrix is that table), and the
    // output norm and matrix when it is the last.
    for (const TensorSpec& spec : arch.globals) {
      const Slot s0 = spec.slots[0];
      if (s0 == Slot::TokEmbd && !geo_.first_stage && !(geo_.last_stage && !src.find("output.weight"))) continue;
      if ((s0 == Slot::Output || s0 == Slot::OutputNorm) && !geo_.last_stage) continue;
      // Per-layer inputs are computed on the first stage (per_layer_inputs()).
      if ((s0 == Slot::PleTokEmbd || s0 == Slot::PleModelProj || s0 == Slot::PleProjNorm) && !geo_.first_stage) continue;
      get(spec, spec.gguf, 0, c);
    }
    for (int il = geo_.layer_begin; il < geo_.layer_end; ++il) {
      const ModelConfig lc = c.layer_view(il);  // its own head and FFN sizes
      for (const TensorSpec& spec : arch.layer) get(spec, layer_tensor_name(spec, il), il, lc);
    }
  }
  PAGELLM_CHECK(!rope_short_ == !rope_long_, "LongRoPE needs both rope_factors_short.weight and "
                "rope_factors_long.weight; the model has only one");
  PAGELLM_CHECK(!(rope_long_ && rope_freqs_), "the model has both rope_freqs.weight and LongRoPE factors");
  PAGELLM_CHECK(type_table_.empty() || !pos_table_.empty(), "the model has a token-type table but no position table");
  set_context_length(c.n_ctx_train);
  for (LayerWeights& L : layers_) {
    for (auto [from, to] : {std::pair{&L.attn.q_absorb, &L.attn.q_absorb_view}, {&L.attn.o_absorb, &L.attn.o_absorb_view},
                            {&L.attn.kv_expand, &L.attn.kv_expand_view}}) {
      to->clear();
      for (const auto& w : *from) to->push_back(w.get());
    }
    FfnWeights& F = L.ffn;
    for (auto [from, to] : {std::pair{&F.gate_exps, &F.gate_view}, {&F.up_exps, &F.up_view}, {&F.down_exps, &F.down_view},
                            {&F.gate_exps_b, &F.gate_b_view}, {&F.up_exps_b, &F.up_b_view},
                            {&F.down_exps_b, &F.down_b_view}}) {
      to->clear();
      for (const auto& w : *from) to->push_back(w.get());
    }
  }
}

const TensorData* Model::file_tensor(const std::string& gguf_name) const {
  if (derived_)
    if (const TensorData* t = derived_->find(gguf_name)) return t;
  return source_ ? source_->find(gguf_name) : nullptr;
}

void Model::set_context_length(int n_ctx) {
  context_len_ = n_ctx;
  const Weight* f = rope_freqs_.get();
  if (rope_long_) f = n_ctx > cfg_.rope.n_ctx_orig ? rope_long_.get() : rope_short_.get();
  cfg_.rope.freq_factors = f;
  // Sliding-window layers share the global RoPE unless the family gives them their own.
  if (arch_info(cfg_.arch).swa_rope_base <= 0) cfg_.rope_swa.freq_factors = f;
}

std::vector<int32_t> Model::kv_layer_windows() const {
  std::vector<int32_t> w;
  // An encoder's sliding layers keep every key: its whole prompt is one
  // step, and a window reaching forward needs keys past the query anyway.
  for (int l = 0; l < cfg_.n_layer; ++l)
    if (!cfg_.layer_reuses_kv(l)) w.push_back(cfg_.is_swa[l] && !cfg_.non_causal ? cfg_.sliding_window : 0);
  return w;
}

KVCacheSpec Model::kv_cache_spec(int block_size, int num_blocks, DType dtype, const KvGroupPlan* groups,
                                  int state_slots) const {
  KVCacheSpec kv;
  kv.n_layers = geo_.layer_end - geo_.layer_begin;
  if (cfg_.n_linear_layers() > 0) {
    // Linear-attention layers keep a state slot per sequence and no K/V: the
    // full-attention layers fill a block's slots in order (one group).
    PAGELLM_CHECK(!groups || !groups->grouped(), "KV-cache groups with linear-attention layers are not supported");
    const ModelConfig::LinearAttn& la = geo_.lin;  // this rank's heads
    kv.state = {0, state_slots, static_cast<int>(la.conv_dim()), la.conv_kernel, la.n_v_heads, la.head_k_dim,
                la.head_v_dim};
    int32_t full = 0;
    for (int il = geo_.layer_begin; il < geo_.layer_end; ++il) {
      const bool linear = cfg_.layer_is_linear(il);
      kv.layer_group.push_back(0);
      kv.layer_slot.push_back(linear ? 0 : full);
      kv.layer_state.push_back(linear ? kv.state.n_layers : -1);
      if (linear) ++kv.state.n_layers;
      else ++full;
    }
    kv.n_layers = std::max(full, 1);  // a stage of linear layers only still has a (small) pool
    if (kv.state.n_layers == 0) {
      kv.state = {};
      kv.layer_state.clear();
    }
  } else {
    // The stage's cache layers: its layers that keep their own K/V (a layer
    // that reuses another's attends over that one's, which must be here too).
    const int begin = cfg_.cache_layers_before(geo_.layer_begin), end = cfg_.cache_layers_before(geo_.layer_end);
    for (int il = geo_.layer_begin; il < geo_.layer_end; ++il)
      PAGELLM_CHECK(!cfg_.layer_reuses_kv(il) || geo_.has_layer(cfg_.kv_source[static_cast<size_t>(il)]),
                    "layer {} reuses the K/V of layer {}, which another pipeline stage holds", il,
                    cfg_.kv_source[static_cast<size_t>(il)]);
    kv.n_layers = end - begin;
    if (groups && groups->grouped()) {
      kv.layer_group.assign(groups->layer_group.begin() + begin, groups->layer_group.begin() + end);
      kv.layer_slot = stage_kv_slots(*groups, begin, end, kv.n_layers);
    }
  }
  kv.n_kv_heads = geo_.n_head_kv;
  kv.head_dim = cfg_.head_dim;
  if (!cfg_.layers_alike()) {
    // Each cache layer's own shape, and its place spelled out even in one group.
    const int begin = cfg_.cache_layers_before(geo_.layer_begin), end = cfg_.cache_layers_before(geo_.layer_end);
    if (kv.layer_group.empty()) {
      kv.layer_group.assign(static_cast<size_t>(end - begin), 0);
      for (int l = 0; l < end - begin; ++l) kv.layer_slot.push_back(l);
    }
    for (int il = geo_.layer_begin; il < geo_.layer_end; ++il) {
      if (cfg_.layer_reuses_kv(il)) continue;
      kv.layer_kv_heads.push_back(geo_.kv_heads(il));
      kv.layer_head_dim.push_back(cfg_.layer_head_dim(il));
    }
  }
  // An MLA latent is its own value: stored once where the backend can read values from the keys.
  kv.v_is_k = cfg_.is_mla() && backend_.supports(Feature::KvVIsK);
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  kv.dtype = dtype;
  return kv;
}

// Each activation buffer and its values per token of the step (per_row
// false: per sampled row), so allocation and the size estimate agree.
std::vector<Model::BufferShape> Model::buffer_shapes() const {
  const ModelConfig& c = cfg_;
  const ShardGeometry& g = geo_;
  // Layers of their own shapes (Gemma 4's global ones): the largest.
  const int64_t qd = static_cast<int64_t>(g.n_head) * c.max_head_dim();
  int64_t kd = static_cast<int64_t>(g.n_head_kv) * c.head_dim, dense_ff = g.n_ff;
  for (int il = 0; il < c.n_layer && !c.layers_alike(); ++il) {
    kd = std::max(kd, int64_t{g.kv_heads(il)} * c.layer_head_dim(il));
    dense_ff = std::max(dense_ff, g.ff_units(il));
  }
  // The dense FFN (leading dense layers of a MoE model too, Gemma 4's MLP beside its experts) or the shared expert.
  const int64_t ff = c.moe() ? std::max<int64_t>(g.n_ff_shexp, c.n_dense_lead > 0 || c.moe_dense_ffn ? dense_ff : 0) : dense_ff;
  const ModelConfig::Mla& mla = c.mla;
  const bool is_mla = c.is_mla();
  const int64_t mla_q =
      is_mla ? g.n_head * std::max({mla.q_head_dim(), mla.latent_dim(), mla.q_head_dim() + mla.v_head_dim}) : 0;
  const int64_t k = c.moe() ? c.n_expert_used : 0, shared = c.n_ff_shexp > 0 ? 1 : 0;
  const bool lin = c.n_linear_layers() > 0;
  const ModelConfig::LinearAttn& la = g.lin;
  return {{&Buffers::x, c.n_embd, true},   {&Buffers::h, c.n_embd, true},     {&Buffers::q, std::max(qd, mla_q), true},
          {&Buffers::k, kd, true},         {&Buffers::v, kd, true},           {&Buffers::attn, qd, true},
          {&Buffers::o, c.n_embd, true},   {&Buffers::gate, ff, true},        {&Buffers::up, ff, true},
          {&Buffers::sel, c.n_embd, false}, {&Buffers::logits, g.n_vocab, false},
          {&Buffers::sampled, 1, false, DType::I32},
          {&Buffers::router, c.n_expert, true}, {&Buffers::ids, k, true, DType::I32},
          {&Buffers::route_w, k, true},    {&Buffers::eg, k * g.n_ff_exp, true}, {&Buffers::eu, k * g.n_ff_exp, true},
          {&Buffers::ed, k * c.n_embd, true}, {&Buffers::sh, shared * c.n_embd, true}, {&Buffers::sg, shared, true},
          {&Buffers::qgate, c.attn_out_gate ? qd : 0, true},
          {&Buffers::lin_qkv, lin ? la.conv_dim() : 0, true}, {&Buffers::lin_conv, lin ? la.conv_dim() : 0, true},
          {&Buffers::lin_z, lin ? la.value_dim() : 0, true},  {&Buffers::lin_a, lin ? la.n_v_heads : 0, true},
          {&Buffers::lin_b, lin ? la.n_v_heads : 0, true},    {&Buffers::lin_out, lin ? la.value_dim() : 0, true},
          {&Buffers::mla_qa, is_mla ? mla.q_lora_rank : 0, true}, {&Buffers::mla_kv, is_mla ? mla.latent_dim() : 0, true},
          {&Buffers::mla_kv2, is_mla ? mla.latent_dim() : 0, true}, {&Buffers::mla_q, mla_q, true},
          {&Buffers::mla_o, is_mla ? static_cast<int64_t>(g.n_head) * mla.v_head_dim : 0, true},
          {&Buffers::mla_heads, is_mla ? g.n_head : 0, true, DType::I32},
          {&Buffers::ple, int64_t{c.n_layer} * c.n_embd_per_layer, true},
          {&Buffers::ple_tok, int64_t{c.n_layer} * c.n_embd_per_layer, true},
          {&Buffers::ple_layer, c.n_embd_per_layer, true}, {&Buffers::ple_gate, c.n_embd_per_layer, true},
          {&Buffers::lora_ids, lora_ ? 1 : 0, true, DType::I32},
          {&Buffers::lora_t, lora_ ? lora_->max_rank() : 0, true},
          {&Buffers::lora_d, lora_ ? lora_->max_out() : 0, true}};
}

size_t Model::activation_bytes(int64_t n, int64_t m) const {
  int64_t values = mla_context_cap() * mla_context_row_values();  // 0 without MLA
  for (const BufferShape& b : buffer_shapes()) values += b.values * (b.per_token ? n : m);
  return static_cast<size_t>(values) * sizeof(float);  // I32 ids are as large
}

void Model::release_buffers() {
  buf_ = Buffers{};
  std::vector<float>().swap(host_);
  std::vector<float>().swap(gather_);
  std::vector<float>().swap(local_logits_);
}

void Model::ensure_buffers(int64_t n, int64_t m) {
  const bool grow_tokens = n > buf_.cap_tokens, grow_rows = m > buf_.cap_logits;
  if (!grow_tokens && !grow_rows) return;  // every step but the first few
  for (const BufferShape& b : buffer_shapes()) {
    if (!(b.per_token ? grow_tokens : grow_rows) || b.values == 0) continue;
    BufferPtr& p = buf_.*b.member;
    p.reset();  // the old one goes first: device memory is tight
    p = backend_.alloc(b.type, static_cast<size_t>(b.values * (b.per_token ? n : m)));
  }
  if (grow_tokens && buf_.mla_heads) fill_head_routes(*buf_.mla_heads, n);
  if (grow_tokens) buf_.cap_tokens = n;
  if (grow_rows) buf_.cap_logits = m;
}

void Model::to_host(const Buffer& buf, int64_t values, float* dst) {
  backend_.copy_to_host(buf, 0, static_cast<size_t>(values) * sizeof(float), dst);
  backend_.synchronize();
}

void Model::from_host(const float* src, Buffer& buf, int64_t values) {
  backend_.copy_from_host(src, buf, 0, static_cast<size_t>(values) * sizeof(float));
  backend_.synchronize();  // src may be reused (and move) right after
}

void Model::set_tp_communicator(dist::Communicator* comm) {
  tp_comm_ = comm;
  tp_device_comm_ = comm ? dist::make_device_comm(backend_, *comm) : nullptr;
}

void Model::all_reduce(Buffer& buf, int64_t values) {
  if (!geo_.tp) return;
  PAGELLM_CHECK(tp_device_comm_ && tp_device_comm_->size() == shard_.tp_size,
                "tensor parallel model without its communicator");
  tp_device_comm_->all_reduce_sum(buf, 0, static_cast<size_t>(values));
}

void Model::forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows, float* logits) {
  begin_pass(batch, static_cast<int64_t>(logits_rows.size()));
  embed();
  run_layers();
  compute_logits(logits_rows, logits);
}

void Model::begin_pass(const BatchInfo& batch, int64_t m) {
  n_ = batch.n_tokens();
  PAGELLM_CHECK(n_ > 0, "empty batch");
  if (!pos_table_.empty()) positions_ = batch.positions;
  find_segments(batch);
  ensure_buffers(n_, std::max<int64_t>(m, 1));
  lora_pass_ = false;
  plan_mla(batch);
  if (lora_) {
    lora_row_slots_.assign(static_cast<size_t>(n_), 0);
    for (const SeqInfo& s : batch.seqs) {
      PAGELLM_CHECK(s.lora_slot >= 0 && s.lora_slot <= lora_->max_loras(), "LoRA slot {} of {}", s.lora_slot,
                    lora_->max_loras());
      if (s.lora_slot == 0) continue;
      lora_pass_ = true;
      std::fill_n(lora_row_slots_.begin() + s.q_start, s.q_len, s.lora_slot);
    }
    if (lora_pass_) {
      backend_.copy_from_host(lora_row_slots_.data(), *buf_.lora_ids, 0, lora_row_slots_.size() * sizeof(int32_t));
      lora_->set_row_slots(buf_.lora_ids.get());
    }
  }
  if (!geo_.tp) {
    backend_.set_batch(batch);
    return;
  }
  // Vocabulary-parallel embedding: each rank looks up the tokens in its slice
  // of the table (local ids), the others' rows are zeroed before the sum.
  tp_batch_ = batch;
  local_ids_.resize(tp_batch_.token_ids.size());
  for (size_t i = 0; i < local_ids_.size(); ++i) {
    const int64_t id = tp_batch_.token_ids[i];
    PAGELLM_CHECK(id >= 0 && id < cfg_.n_vocab, "token id {} outside the vocabulary ({})", id, cfg_.n_vocab);
    const bool mine = id >= geo_.vocab_begin && id < geo_.vocab_begin + geo_.n_vocab;
    local_ids_[i] = mine ? static_cast<int32_t>(id - geo_.vocab_begin) : -1;
    tp_batch_.token_ids[i] = std::max(local_ids_[i], 0);
  }
  backend_.set_batch(tp_batch_);
}

// MLA's forms. Per pair of tokens the expanded form costs 320 multiply-adds
// per head against the absorbed form's 1152; per token it expands, it costs
// what the absorbed query and output products do (~184K per head). So it
// serves a prompt, or a prompt chunk after cached keys (whose every key it
// expands again), of about 450 tokens or more; a step of whole prompts
// only, at any length (it then runs no absorbed products at all). It
// changes a row's bits against the absorbed form, so not in deterministic
// mode (a row must not depend on what else the step holds).
void Model::plan_mla(const BatchInfo& batch) {
  constexpr int32_t kMinExpandedTokens = 512;
  mla_plan_ = MlaPlan{};
  if (!cfg_.is_mla()) return;
  if (attention_kv_ < 0) attention_kv_ = backend_.supports_op(op_query(PGLB_OP_ATTENTION_KV)) ? 1 : 0;
  if (gather_kv_ < 0) gather_kv_ = backend_.supports_op(op_query(PGLB_OP_GATHER_KV)) ? 1 : 0;
  if (attention_kv_ != 1 || backend_.deterministic()) return;
  const size_t n_seqs = batch.seqs.size();
  std::vector<uint8_t>& ex = mla_plan_.expanded;
  ex.assign(n_seqs, 0);
  const auto whole = [](const SeqInfo& s) { return s.ctx_len == s.q_len; };
  if (std::all_of(batch.seqs.begin(), batch.seqs.end(), whole)) {
    std::fill(ex.begin(), ex.end(), 1);
    mla_plan_.form = MlaForm::Expanded;
    return;
  }
  // Long prompts and chunks; with cached keys among them, every key of each
  // (from the cache) must fit the context buffers, in batch order.
  const auto long_one = [&](const SeqInfo& s) { return s.q_len >= kMinExpandedTokens; };
  const bool context = gather_kv_ == 1 && std::any_of(batch.seqs.begin(), batch.seqs.end(), [&](const SeqInfo& s) {
    return long_one(s) && !whole(s) && s.kv_evicted_to <= s.kv_sinks && s.ctx_len <= mla_context_cap();
  });
  int64_t rows = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const SeqInfo& s = batch.seqs[i];
    if (!long_one(s)) continue;
    if (!context) {
      ex[i] = whole(s) ? 1 : 0;
      continue;
    }
    if (s.kv_evicted_to > s.kv_sinks || rows + s.ctx_len > mla_context_cap()) continue;
    ex[i] = 1;
    rows += s.ctx_len;
  }
  const auto marked = std::count(ex.begin(), ex.end(), uint8_t{1});
  if (marked == 0) {
    ex.clear();
    return;
  }
  mla_plan_.form = marked == static_cast<std::ptrdiff_t>(n_seqs) ? MlaForm::Expanded : MlaForm::Both;
  mla_plan_.context = context;
  mla_plan_.context_rows = rows;
  if (context) ensure_mla_context_buffers();
}

// The expanded form's keys after cached keys: one row per key of the
// expanded sequences, up to ~256 MiB of them (and no more than one sequence
// can hold); a chunk whose context does not fit stays absorbed.
int64_t Model::mla_context_row_values() const {
  const ModelConfig::Mla& m = cfg_.mla;
  return m.latent_dim() + int64_t{geo_.n_head} * (m.q_head_dim() + m.v_head_dim + 1);
}

int64_t Model::mla_context_cap() const {
  if (!cfg_.is_mla()) return 0;
  constexpr int64_t kContextBytes = int64_t{256} << 20;
  return std::min<int64_t>(std::max(context_len_, 1), kContextBytes / (mla_context_row_values() * 4));
}

void Model::ensure_mla_context_buffers() {
  const int64_t cap = mla_context_cap(), heads = geo_.n_head;
  if (buf_.cap_context >= cap) return;
  const ModelConfig::Mla& m = cfg_.mla;
  buf_.mla_ctx = backend_.alloc(DType::F32, static_cast<size_t>(cap * m.latent_dim()));
  buf_.mla_ctx_kv = backend_.alloc(DType::F32, static_cast<size_t>(cap * heads * (m.q_head_dim() + m.v_head_dim)));
  buf_.mla_ctx_heads = backend_.alloc(DType::I32, static_cast<size_t>(cap * heads));
  fill_head_routes(*buf_.mla_ctx_heads, cap);
  buf_.cap_context = cap;
}

// Row t of the per-head products' routes is 0 .. n_head - 1: head h's slot uses head h's matrices.
void Model::fill_head_routes(Buffer& ids, int64_t rows) {
  std::vector<int32_t> heads(static_cast<size_t>(rows * geo_.n_head));
  for (size_t i = 0; i < heads.size(); ++i) heads[i] = static_cast<int32_t>(i % static_cast<size_t>(geo_.n_head));
  backend_.copy_from_host(heads.data(), ids, 0, heads.size() * sizeof(int32_t));
  backend_.synchronize();
}

void Model::embed() {
  backend_.embed(*tok_embd_, cfg_.embd_scale, *buf_.x);
  if (cfg_.n_embd_per_layer > 0) per_layer_inputs();
  if (!pos_table_.empty()) add_positions();
  if (!geo_.tp) return;
  // A token's rows are whole on the rank that holds it (its embedding, and
  // what was computed from it alone: positions, per-layer inputs); the others
  // zero theirs before the sum.
  sum_token_owners(*buf_.x, cfg_.n_embd);
  if (cfg_.n_embd_per_layer > 0) sum_token_owners(*buf_.ple, int64_t{cfg_.n_layer} * cfg_.n_embd_per_layer);
}

void Model::sum_token_owners(Buffer& buf, int64_t width) {
  host_.resize(static_cast<size_t>(n_ * width));
  to_host(buf, n_ * width, host_.data());
  for (int64_t i = 0; i < n_; ++i)
    if (local_ids_[static_cast<size_t>(i)] < 0) std::fill_n(host_.data() + i * width, width, 0.0f);
  tp_comm_->all_reduce_sum(host_.data(), host_.size());
  from_host(host_.data(), buf, n_ * width);
}

// Each token's type (segment): 0, or 1 after the first separator of its
// sequence, as BERT's tokenizer marks a pair ([CLS] a [SEP] b [SEP]: b and
// its [SEP] are type 1). Derived here rather than carried with the request:
// an encoder computes each prompt whole in one step (whole-prompt
// sequences), so every sequence of the batch starts at its position 0 and
// its first separator is in view. A single text has no token after its
// [SEP], so it stays type 0, as the tokenizer gives it.
void Model::find_segments(const BatchInfo& batch) {
  segments_.clear();
  if (type_table_.size() < 2 * static_cast<size_t>(cfg_.n_embd) || segment_separator_ < 0) return;
  segments_.assign(static_cast<size_t>(n_), 0);
  for (const SeqInfo& s : batch.seqs) {
    PAGELLM_CHECK(s.q_start >= 0 && s.q_len >= 0 && s.q_start + s.q_len <= n_, "a sequence outside the batch");
    if (s.q_len == 0) continue;
    PAGELLM_CHECK(batch.positions[static_cast<size_t>(s.q_start)] == 0,
                  "an encoder with token types computes each prompt whole (a sequence starts at position {})",
                  batch.positions[static_cast<size_t>(s.q_start)]);
    int32_t segment = 0;
    for (int32_t i = s.q_start; i < s.q_start + s.q_len; ++i) {
      segments_[static_cast<size_t>(i)] = segment;
      if (batch.token_ids[static_cast<size_t>(i)] == segment_separator_) segment = 1;
    }
  }
}

// An encoder's input: token embedding + position row + token-type row, then
// the embeddings' LayerNorm.
void Model::add_positions() {
  const int64_t d = cfg_.n_embd, rows = static_cast<int64_t>(pos_table_.size()) / d;
  host_.resize(static_cast<size_t>(n_ * d));
  for (int64_t i = 0; i < n_; ++i) {
    const int32_t pos = positions_[static_cast<size_t>(i)];
    PAGELLM_CHECK(pos >= 0 && pos < rows, "position {} is outside the model's {} learned positions", pos, rows);
    float* dst = host_.data() + i * d;
    std::copy_n(pos_table_.data() + pos * d, d, dst);
    if (type_table_.empty()) continue;
    const int64_t type = segments_.empty() ? 0 : segments_[static_cast<size_t>(i)];
    const float* row = type_table_.data() + type * d;
    for (int64_t k = 0; k < d; ++k) dst[k] += row[k];
  }
  from_host(host_.data(), *buf_.h, n_ * d);
  backend_.add(*buf_.x, *buf_.h, n_ * d);
  if (tok_norm_) backend_.layer_norm(*buf_.x, tok_norm_.get(), tok_norm_b_.get(), n_, d, cfg_.norm_eps, *buf_.x);
}

// Gemma 4's per-layer inputs, all layers' at once: (norm(proj(x) / sqrt(d))
// + table[token] * sqrt(P)) / sqrt(2) per layer, x the input embedding. The
// 1 / sqrt(d) is the projection norm's epsilon times d instead; the
// 1 / sqrt(2) is left out and the layers' branch norms (which alone see
// it) double their epsilon.
void Model::per_layer_inputs() {
  const int64_t P = cfg_.n_embd_per_layer, rows = n_ * cfg_.n_layer;
  backend_.matmul(*ple_model_proj_, *buf_.x, n_, *buf_.ple);
  backend_.rms_norm(*buf_.ple, ple_proj_norm_.get(), rows, P, cfg_.norm_eps * static_cast<float>(cfg_.n_embd),
                    *buf_.ple);
  backend_.embed(*ple_tok_embd_, std::sqrt(static_cast<float>(P)), *buf_.ple_tok);
  backend_.add(*buf_.ple, *buf_.ple_tok, rows * P);
}

void Model::run_layers() {
  LayerPass pass{cfg_, geo_, backend_, buf_, layers_,
                 [this](Buffer& buf, int64_t values) { all_reduce(buf, values); }};
  if (lora_pass_) pass.lora = &lora_->pass();
  if (cfg_.is_mla()) pass.mla = &mla_plan_;
  // The family's own layer, or the shared decoder layer (model/blocks.h).
  const auto layer = arch_info(cfg_.arch).layer_forward;
  for (int il = geo_.layer_begin; il < geo_.layer_end; ++il) (layer ? layer : decoder_layer)(pass, il, n_);
}

void Model::hidden_to_host(float* out) { to_host(*buf_.x, n_ * cfg_.n_embd, out); }

void Model::hidden_from_host(const float* in) { from_host(in, *buf_.x, n_ * cfg_.n_embd); }

void Model::compute_logits(const std::vector<int32_t>& logits_rows, float* logits) {
  compute_logits(logits_rows);
  read_logits(logits);
}

void Model::compute_logits(const std::vector<int32_t>& logits_rows) {
  const int64_t n = n_;
  const int64_t m = static_cast<int64_t>(logits_rows.size());
  Backend& be = backend_;
  for (int32_t r : logits_rows) PAGELLM_CHECK(r >= 0 && r < n, "logits row {} outside the batch", r);
  logits_rows_ = m;
  if (m == 0) {
    be.synchronize();  // the batch's metadata and the KV writes are the caller's again
    return;
  }
  // Only the rows that sample need the final norm and the (large) output matmul.
  be.gather_rows(*buf_.x, cfg_.n_embd, logits_rows, *buf_.sel);
  be.rms_norm(*buf_.sel, output_norm_.get(), m, cfg_.n_embd, cfg_.norm_eps, *buf_.sel);
  be.matmul(output_ ? *output_ : *tok_embd_, *buf_.sel, m, *buf_.logits);
  if (softcap_on_device_) be.softcap(*buf_.logits, m * cfg_.n_vocab, cfg_.final_softcap);
}

void Model::read_logits(float* logits) {
  const int64_t m = logits_rows_, V = cfg_.n_vocab;
  if (m == 0) return;
  if (!geo_.tp) {
    to_host(*buf_.logits, m * V, logits);  // the one wait of a step: the host needs the logits
  } else {
    // Vocabulary-parallel output: each rank's columns, padded to the same
    // width, gathered and laid out as [m, n_vocab].
    const int64_t local = geo_.n_vocab, stride = geo_.vocab_stride, ranks = shard_.tp_size;
    local_logits_.resize(static_cast<size_t>(m * local));
    to_host(*buf_.logits, m * local, local_logits_.data());
    host_.assign(static_cast<size_t>(m * stride), 0.0f);
    for (int64_t i = 0; i < m; ++i) std::copy_n(local_logits_.data() + i * local, local, host_.data() + i * stride);
    gather_.resize(static_cast<size_t>(ranks * m * stride));
    tp_comm_->all_gather(host_.data(), host_.size(), gather_.data());
    for (int64_t q = 0; q < ranks; ++q) {
      const int64_t begin = std::min(V, q * stride), cols = std::min(V, begin + stride) - begin;
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(gather_.data() + (q * m + i) * stride, cols, logits + i * V + begin);
    }
  }
  if (cfg_.final_softcap > 0 && !softcap_on_device_) {
    const float cap = cfg_.final_softcap;
    for (int64_t i = 0; i < m * V; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

void Model::final_hidden(const std::vector<int32_t>& rows, float* out) {
  if (rows.empty()) return;
  const int64_t d = cfg_.n_embd;
  for (int32_t r : rows) PAGELLM_CHECK(r >= 0 && r < n_, "hidden row {} outside the batch", r);
  // Every row at once (no gather buffer sized for them): a norm and a copy
  // of [n, n_embd] are small next to the pass itself.
  // (An encoder has no final norm: its last layer ends with one.)
  if (output_norm_) backend_.rms_norm(*buf_.x, output_norm_.get(), n_, d, cfg_.norm_eps, *buf_.x);
  host_.resize(static_cast<size_t>(n_ * d));
  to_host(*buf_.x, n_ * d, host_.data());
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(host_.data() + rows[i] * d, d, out + static_cast<int64_t>(i) * d);
}

bool Model::can_sample_on_device() const {
  if (geo_.tp || shard_.pp_size > 1) return false;
  if (cfg_.final_softcap > 0 && !softcap_on_device_) return false;
  return backend_.supports_op(op_query(PGLB_OP_SAMPLE, {{DType::F32, {cfg_.n_vocab, 1}}}));
}

void Model::sample_on_device(const std::vector<SampleDraw>& draws, int32_t* ids) {
  PAGELLM_CHECK(static_cast<int64_t>(draws.size()) <= logits_rows_, "{} device draws from {} logits rows",
                draws.size(), logits_rows_);
  if (draws.empty()) return;
  backend_.sample(*buf_.logits, cfg_.n_vocab, draws, *buf_.sampled);
  backend_.copy_to_host(*buf_.sampled, 0, draws.size() * sizeof(int32_t), ids);
  backend_.synchronize();
}

void Model::enable_lora(int32_t max_loras, int32_t max_rank, std::optional<DType> dtype) {
  const ArchInfo& arch = arch_info(cfg_.arch);
  // Families with a layer of their own (MLA, encoders, Gemma 4) would skip the adapters silently.
  PAGELLM_CHECK(!arch.layer_forward || arch.layer_forward == hybrid_decoder_layer || arch.layer_applies_lora,
                "LoRA adapters are not served for {} models yet", arch.gguf_name);
  PAGELLM_CHECK(!geo_.tp && geo_.layer_begin == 0 && geo_.layer_end == cfg_.n_layer,
                "LoRA adapters are not served under tensor or pipeline parallelism yet");
  PAGELLM_CHECK(backend_.supports(Feature::MixtureOfExperts),
                "LoRA adapters need the backend's grouped products (matmul_experts), which {} lacks",
                backend_.name());
  // As vLLM's lora_dtype auto: the model's own precision (quantized models: F16).
  const Weight* q = layers_.empty() ? nullptr : layers_[static_cast<size_t>(geo_.layer_begin)].attn.wq.get();
  const DType type = dtype.value_or(q && q->type == DType::F32 ? DType::F32 : DType::F16);
  lora_ = std::make_unique<LoraSlots>(backend_, lora_shapes(), max_loras, max_rank, type);
  buf_ = Buffers{};  // the next pass allocates the LoRA scratch too
}

void Model::set_lora_slot(int32_t slot, const LoraAdapter* adapter) {
  PAGELLM_CHECK(lora_, "LoRA is not enabled on this model");
  lora_->set(slot, adapter);
}

LoraSlots::Shapes Model::lora_shapes() const {
  LoraSlots::Shapes shapes(static_cast<size_t>(cfg_.n_layer));
  for (int il = geo_.layer_begin; il < geo_.layer_end; ++il) {
    const AttnWeights& A = layers_[static_cast<size_t>(il)].attn;
    const FfnWeights& F = layers_[static_cast<size_t>(il)].ffn;
    const Weight* w[kLoraTargets] = {A.wq.get(),   A.wk.get(), A.wv.get(),   A.wo.get(),
                                     F.gate.get(), F.up.get(), F.down.get(), A.wq_gate.get()};
    for (int t = 0; t < kLoraTargets; ++t)
      if (w[t]) shapes[static_cast<size_t>(il)][static_cast<size_t>(t)] = {w[t]->rows, w[t]->cols};
  }
  return shapes;
}

}  // namespace pagellm
