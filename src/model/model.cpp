#include "model/model.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tensor_source.h"

namespace pagellm {

Model::Model(const ModelConfig& cfg, Backend& backend) : cfg_(cfg), backend_(backend) {}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, Backend& backend, const LoadProgress& progress) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("model '{}' does not exist", path);
  if (fs::is_directory(path)) {
    const std::string cfg_path = (fs::path(path) / "config.json").string();
    if (!fs::exists(cfg_path)) fail("'{}' is a folder without config.json (expected a Hugging Face model folder)", path);
    const ModelConfig cfg = config_from_hf_json(cfg_path);
    auto src = hf_tensor_source(path, cfg);
    auto m = from_source(cfg, *src, backend, progress);
    m->source_ = std::move(src);
    return m;
  }
  auto gguf = GGUFFile::open(path);
  const ModelConfig cfg = config_from_gguf(*gguf);
  auto src = gguf_tensor_source(*gguf);
  auto m = from_source(cfg, *src, backend, progress);
  m->gguf_ = std::move(gguf);
  m->source_ = std::move(src);
  return m;
}

std::unique_ptr<Model> Model::from_source(const ModelConfig& cfg, const TensorSource& src, Backend& backend,
                                          const LoadProgress& progress) {
  std::unique_ptr<Model> m(new Model(cfg, backend));
  m->load_weights(src, progress);
  return m;
}

void Model::load_weights(const TensorSource& src, const LoadProgress& progress) {
  const ModelConfig& c = cfg_;
  const int64_t hd = c.head_dim;
  size_t total = 0, done = 0;
  for (int pass = 0; pass < 2; ++pass) {
    // Pass 0 counts the tensors (for progress), pass 1 uploads them.
    auto get = [&](const std::string& name, std::vector<int64_t> shape, bool required) -> std::unique_ptr<Weight> {
      const TensorData* t = src.find(name);
      if (!t) {
        if (required) fail("model is missing tensor '{}'", name);
        return nullptr;
      }
      if (pass == 0) {
        // Checked before anything is uploaded, so a bad file fails fast.
        if (t->shape != shape) {
          std::string want, got;
          for (auto d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
          for (auto d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
          fail("tensor '{}' has shape [{}], expected [{}]", name, got, want);
        }
        if (t->shape.size() > 1 && !backend_.supports_weight(t->type))
          fail("tensor '{}' has type {}, which the {} backend does not support", name, dtype_name(t->type),
               backend_.name());
        ++total;
        return nullptr;
      }
      const size_t bytes = dtype_row_bytes(t->type, t->cols()) * static_cast<size_t>(t->rows());
      weight_bytes_ += bytes;
      if (name == "token_embd.weight") tok_embd_bytes_ = bytes;
      auto w = backend_.upload(*t);
      held_weight_bytes_ += w->held_bytes;
      if (progress) progress(++done, total);
      return w;
    };
    tok_embd_ = get("token_embd.weight", {c.n_embd, c.n_vocab}, true);
    output_norm_ = get("output_norm.weight", {c.n_embd}, true);
    output_ = get("output.weight", {c.n_embd, c.n_vocab}, false);
    rope_freqs_ = get("rope_freqs.weight", {c.rope.n_rot / 2}, false);
    layers_.resize(c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) {
      LayerWeights& L = layers_[il];
      const std::string p = "blk." + std::to_string(il) + ".";
      L.attn_norm = get(p + "attn_norm.weight", {c.n_embd}, true);
      L.wq = get(p + "attn_q.weight", {c.n_embd, c.n_head * hd}, true);
      L.wk = get(p + "attn_k.weight", {c.n_embd, c.n_head_kv * hd}, true);
      L.wv = get(p + "attn_v.weight", {c.n_embd, c.n_head_kv * hd}, true);
      L.wo = get(p + "attn_output.weight", {c.n_head * hd, c.n_embd}, true);
      L.bq = get(p + "attn_q.bias", {c.n_head * hd}, c.qkv_bias);
      L.bk = get(p + "attn_k.bias", {c.n_head_kv * hd}, c.qkv_bias);
      L.bv = get(p + "attn_v.bias", {c.n_head_kv * hd}, c.qkv_bias);
      L.q_norm = get(p + "attn_q_norm.weight", {hd}, c.qk_norm);
      L.k_norm = get(p + "attn_k_norm.weight", {hd}, c.qk_norm);
      L.post_attn_norm = get(p + "post_attention_norm.weight", {c.n_embd}, c.post_norms);
      L.ffn_norm = get(p + "ffn_norm.weight", {c.n_embd}, true);
      L.ffn_gate = get(p + "ffn_gate.weight", {c.n_embd, c.n_ff}, true);
      L.ffn_up = get(p + "ffn_up.weight", {c.n_embd, c.n_ff}, true);
      L.ffn_down = get(p + "ffn_down.weight", {c.n_ff, c.n_embd}, true);
      L.post_ffn_norm = get(p + "post_ffw_norm.weight", {c.n_embd}, c.post_norms);
    }
  }
  cfg_.rope.freq_factors = rope_freqs_.get();
}

KVCacheSpec Model::kv_cache_spec(int block_size, int num_blocks, DType dtype) const {
  KVCacheSpec kv;
  kv.n_layers = cfg_.n_layer;
  kv.n_kv_heads = cfg_.n_head_kv;
  kv.head_dim = cfg_.head_dim;
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  kv.dtype = dtype;
  return kv;
}

// Each activation buffer and its values per token of the step (per_row
// false: per sampled row), so allocation and the size estimate agree.
std::vector<Model::BufferShape> Model::buffer_shapes() const {
  const ModelConfig& c = cfg_;
  const int64_t qd = static_cast<int64_t>(c.n_head) * c.head_dim, kd = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  return {{&Buffers::x, c.n_embd, true},   {&Buffers::h, c.n_embd, true},     {&Buffers::q, qd, true},
          {&Buffers::k, kd, true},         {&Buffers::v, kd, true},           {&Buffers::attn, qd, true},
          {&Buffers::o, c.n_embd, true},   {&Buffers::gate, c.n_ff, true},    {&Buffers::up, c.n_ff, true},
          {&Buffers::sel, c.n_embd, false}, {&Buffers::logits, c.n_vocab, false}};
}

size_t Model::activation_bytes(int64_t n, int64_t m) const {
  int64_t values = 0;
  for (const BufferShape& b : buffer_shapes()) values += b.values * (b.per_token ? n : m);
  return static_cast<size_t>(values) * sizeof(float);
}

void Model::ensure_buffers(int64_t n, int64_t m) {
  const bool grow_tokens = n > buf_.cap_tokens, grow_rows = m > buf_.cap_logits;
  if (!grow_tokens && !grow_rows) return;  // every step but the first few
  for (const BufferShape& b : buffer_shapes()) {
    if (!(b.per_token ? grow_tokens : grow_rows)) continue;
    BufferPtr& p = buf_.*b.member;
    p.reset();  // the old one goes first: device memory is tight
    p = backend_.alloc(DType::F32, static_cast<size_t>(b.values * (b.per_token ? n : m)));
  }
  if (grow_tokens) buf_.cap_tokens = n;
  if (grow_rows) buf_.cap_logits = m;
}

// One transformer block over all n tokens of the step.
void Model::layer(int il, int64_t n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = layers_[il];
  Backend& be = backend_;
  const int hd = c.head_dim;
  const bool swa = c.is_swa[il];

  // Attention: x -> norm -> q, k, v -> (q/k norm) -> rope -> cache -> attend -> o.
  be.rms_norm(*buf_.x, L.attn_norm.get(), n, c.n_embd, c.norm_eps, *buf_.h);
  be.matmul(*L.wq, *buf_.h, n, *buf_.q);
  be.matmul(*L.wk, *buf_.h, n, *buf_.k);
  be.matmul(*L.wv, *buf_.h, n, *buf_.v);
  if (L.bq) {
    be.add_bias(*buf_.q, *L.bq, n);
    be.add_bias(*buf_.k, *L.bk, n);
    be.add_bias(*buf_.v, *L.bv, n);
  }
  if (L.q_norm) {
    be.rms_norm(*buf_.q, L.q_norm.get(), n * c.n_head, hd, c.norm_eps, *buf_.q);
    be.rms_norm(*buf_.k, L.k_norm.get(), n * c.n_head_kv, hd, c.norm_eps, *buf_.k);
  }
  const RopeConfig& rope = swa ? c.rope_swa : c.rope;
  be.rope(*buf_.q, c.n_head, hd, rope);
  be.store_kv(il, *buf_.k, *buf_.v, &rope);  // k rotated as it is written
  AttentionConfig ac;
  ac.n_head = c.n_head;
  ac.n_head_kv = c.n_head_kv;
  ac.head_dim = hd;
  ac.scale = c.attn_scale;
  ac.sliding_window = swa ? c.sliding_window : 0;
  ac.softcap = c.attn_softcap;
  be.attention(il, *buf_.q, *buf_.attn, ac);
  be.matmul(*L.wo, *buf_.attn, n, *buf_.o);
  if (L.post_attn_norm) be.rms_norm(*buf_.o, L.post_attn_norm.get(), n, c.n_embd, c.norm_eps, *buf_.o);
  be.add(*buf_.x, *buf_.o, n * c.n_embd);

  // Feed-forward: x -> norm -> act(gate) * up -> down.
  be.rms_norm(*buf_.x, L.ffn_norm.get(), n, c.n_embd, c.norm_eps, *buf_.h);
  be.matmul(*L.ffn_gate, *buf_.h, n, *buf_.gate);
  be.matmul(*L.ffn_up, *buf_.h, n, *buf_.up);
  be.glu(*buf_.gate, *buf_.up, n * c.n_ff, c.act, *buf_.gate);
  be.matmul(*L.ffn_down, *buf_.gate, n, *buf_.o);
  if (L.post_ffn_norm) be.rms_norm(*buf_.o, L.post_ffn_norm.get(), n, c.n_embd, c.norm_eps, *buf_.o);
  be.add(*buf_.x, *buf_.o, n * c.n_embd);
}

void Model::forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t m = static_cast<int64_t>(logits_rows.size());
  PAGELLM_CHECK(n > 0, "empty batch");
  for (int32_t r : logits_rows) PAGELLM_CHECK(r >= 0 && r < n, "logits row {} outside the batch", r);
  ensure_buffers(n, std::max<int64_t>(m, 1));
  Backend& be = backend_;
  be.set_batch(batch);
  be.embed(*tok_embd_, cfg_.embd_scale, *buf_.x);
  for (int il = 0; il < cfg_.n_layer; ++il) layer(il, n);
  if (m == 0) {
    be.synchronize();  // the batch's metadata and the KV writes are the caller's again
    return;
  }
  // Only the rows that sample need the final norm and the (large) output matmul.
  be.gather_rows(*buf_.x, cfg_.n_embd, logits_rows, *buf_.sel);
  be.rms_norm(*buf_.sel, output_norm_.get(), m, cfg_.n_embd, cfg_.norm_eps, *buf_.sel);
  be.matmul(output_ ? *output_ : *tok_embd_, *buf_.sel, m, *buf_.logits);
  be.copy_to_host(*buf_.logits, 0, static_cast<size_t>(m * cfg_.n_vocab) * sizeof(float), logits);
  be.synchronize();  // the one wait of a step: the host needs the logits
  if (cfg_.final_softcap > 0) {
    const float cap = cfg_.final_softcap;
    for (int64_t i = 0; i < m * cfg_.n_vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

}  // namespace pagellm
