#include "model/arch.h"

#include <cctype>

#include "core/error.h"

namespace pagellm {
namespace {

// Shapes in ne order ([cols, rows]) from the config.
Dims embd_vec(const ModelConfig& c) { return {c.n_embd}; }
Dims head_vec(const ModelConfig& c) { return {c.head_dim}; }
Dims vocab_mat(const ModelConfig& c) { return {c.n_embd, c.n_vocab}; }
Dims rope_vec(const ModelConfig& c) { return {c.rope.n_rot / 2}; }
Dims q_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head} * c.head_dim}; }
Dims kv_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head_kv} * c.head_dim}; }
Dims o_mat(const ModelConfig& c) { return {int64_t{c.n_head} * c.head_dim, c.n_embd}; }
Dims q_vec(const ModelConfig& c) { return {int64_t{c.n_head} * c.head_dim}; }
Dims kv_vec(const ModelConfig& c) { return {int64_t{c.n_head_kv} * c.head_dim}; }
Dims ff_mat(const ModelConfig& c) { return {c.n_embd, c.n_ff}; }
Dims down_mat(const ModelConfig& c) { return {c.n_ff, c.n_embd}; }

TensorSpec vec(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, false};
}
TensorSpec mat(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, true};
}

// token_embd, output_norm, output (absent: tied), rope_freqs (GGUF only).
std::vector<TensorSpec> globals(Transform norm) {
  return {mat("token_embd.weight", "model.embed_tokens.weight", vocab_mat, Slot::TokEmbd),
          vec("output_norm.weight", "model.norm.weight", embd_vec, Slot::OutputNorm, Need::Required, norm),
          mat("output.weight", "lm_head.weight", vocab_mat, Slot::Output, Need::Optional),
          vec("rope_freqs.weight", "", rope_vec, Slot::RopeFreqs, Need::Optional)};
}

// Llama-style layer (Llama, Qwen 2, Qwen 3): one norm before attention, one
// before the FFN (HF calls it post_attention_layernorm).
std::vector<TensorSpec> llama_layer(Transform qk, bool qk_norm) {
  std::vector<TensorSpec> l = {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
      mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q, Need::Required, qk),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, Need::Required, qk),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
      vec("attn_q.bias", "self_attn.q_proj.bias", q_vec, Slot::QBias, Need::IfQkvBias),
      vec("attn_k.bias", "self_attn.k_proj.bias", kv_vec, Slot::KBias, Need::IfQkvBias),
      vec("attn_v.bias", "self_attn.v_proj.bias", kv_vec, Slot::VBias, Need::IfQkvBias),
  };
  if (qk_norm) {
    l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm));
    l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm));
  }
  l.push_back(vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm));
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down));
  return l;
}

// Gemma-style layer: norms before and after both attention and FFN, all of
// them stored as (w - 1) in HF checkpoints.
std::vector<TensorSpec> gemma_layer(bool qk_norm) {
  const Transform n = Transform::NormPlusOne;
  std::vector<TensorSpec> l = {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm, Need::Required, n),
      mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
  };
  if (qk_norm) {
    l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm, n));
    l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm, n));
  }
  l.push_back(vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::PostAttnNorm,
                  Need::IfPostNorms, n));
  l.push_back(vec("ffn_norm.weight", "pre_feedforward_layernorm.weight", embd_vec, Slot::FfnNorm, Need::Required, n));
  l.push_back(vec("post_ffw_norm.weight", "post_feedforward_layernorm.weight", embd_vec, Slot::PostFfnNorm,
                  Need::IfPostNorms, n));
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down));
  return l;
}

ArchInfo family(Arch arch, const char* gguf, const char* model_type, std::vector<HfClass> classes) {
  ArchInfo a;
  a.arch = arch;
  a.gguf_name = gguf;
  a.hf_model_type = model_type;
  a.hf_classes = std::move(classes);
  return a;
}

std::vector<ArchInfo> make_archs() {
  std::vector<ArchInfo> v;
  {
    ArchInfo a = family(Arch::Llama, "llama", "llama",
                        {{"LlamaForCausalLM", HfSwa::None}, {"MistralForCausalLM", HfSwa::EveryLayer}});
    a.gguf_permuted_qk = true;
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::RopePermute, false);
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::Qwen2, "qwen2", "qwen2", {{"Qwen2ForCausalLM", HfSwa::UseFlag}});
    a.qkv_bias = true;
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::None, false);
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::Qwen3, "qwen3", "qwen3", {{"Qwen3ForCausalLM", HfSwa::UseFlag}});
    a.qk_norm = true;
    a.hf.head_dim = 128;
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::None, true);
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::Gemma3, "gemma3", "gemma3_text",
               {{"Gemma3ForCausalLM", HfSwa::Pattern}, {"Gemma3ForConditionalGeneration", HfSwa::Pattern}});
    a.qk_norm = true;
    a.post_norms = true;
    a.act = Activation::GeluTanh;
    a.embd_scale_sqrt = true;
    a.swa_pattern = 6;          // every 6th layer global, the rest a local window
    a.swa_rope_base = 10000.0f;  // local layers: base 10000, unscaled
    a.gguf_sliding_window = 512;
    a.softcaps = true;
    // Gemma3TextConfig's defaults (multimodal text_configs omit what equals them).
    a.hf.vocab_size = 262208;
    a.hf.hidden_size = 2304;
    a.hf.num_hidden_layers = 26;
    a.hf.num_attention_heads = 8;
    a.hf.num_key_value_heads = 4;
    a.hf.intermediate_size = 9216;
    a.hf.head_dim = 256;
    a.hf.max_position_embeddings = 131072;
    a.hf.rope_theta = 1e6f;
    a.hf.tie_word_embeddings = true;
    a.hf.hidden_act = "gelu_pytorch_tanh";
    a.hf.sliding_window = 4096;
    a.hf.query_pre_attn_scalar = 256;
    a.globals = globals(Transform::NormPlusOne);
    a.layer = gemma_layer(true);
    v.push_back(std::move(a));
  }
  return v;
}

}  // namespace

const std::vector<SizeParam>& size_params() {
  using L = ModelSizeLimits;
  using C = ModelConfig;
  using H = HfDefaults;
  // n_vocab comes last: GGUF files may give it only as token_embd.weight's rows.
  static const std::vector<SizeParam> p = {
      {&C::n_embd, "n_embd", "embedding_length", "hidden_size", L::kEmbd, std::nullopt, &H::hidden_size},
      {&C::n_layer, "n_layer", "block_count", "num_hidden_layers", L::kLayers, std::nullopt, &H::num_hidden_layers},
      {&C::n_ff, "n_ff", "feed_forward_length", "intermediate_size", L::kFeedForward, std::nullopt,
       &H::intermediate_size},
      {&C::n_head, "n_head", "attention.head_count", "num_attention_heads", L::kHeads, std::nullopt,
       &H::num_attention_heads},
      {&C::n_head_kv, "n_head_kv", "attention.head_count_kv", "num_key_value_heads", L::kHeads, std::nullopt,
       &H::num_key_value_heads, Derived::HeadCount},
      {&C::n_ctx_train, "n_ctx_train", "context_length", "max_position_embeddings", L::kContext, 2048,
       &H::max_position_embeddings},
      {&C::head_dim, "head_dim", "attention.key_length", "head_dim", L::kHeadDim, std::nullopt, &H::head_dim,
       Derived::EmbdOverHeads},
      {&C::n_vocab, "n_vocab", "vocab_size", "vocab_size", L::kVocab, std::nullopt, &H::vocab_size},
  };
  return p;
}

const std::vector<ArchInfo>& all_archs() {
  static const std::vector<ArchInfo> archs = make_archs();
  return archs;
}

const ArchInfo& arch_info(Arch a) {
  for (const ArchInfo& i : all_archs())
    if (i.arch == a) return i;
  fail("architecture {} has no table entry", static_cast<int>(a));
}

const char* arch_name(Arch a) { return arch_info(a).gguf_name; }

const ArchInfo* arch_by_gguf_name(const std::string& name) {
  for (const ArchInfo& i : all_archs())
    if (name == i.gguf_name) return &i;
  return nullptr;
}

const ArchInfo* arch_by_hf_class(const std::string& cls, HfSwa* swa) {
  for (const ArchInfo& i : all_archs())
    for (const HfClass& h : i.hf_classes)
      if (cls == h.name) {
        if (swa) *swa = h.swa;
        return &i;
      }
  return nullptr;
}

std::string supported_gguf_names() {
  std::string s;
  for (const ArchInfo& i : all_archs()) s += (s.empty() ? "" : ", ") + std::string(i.gguf_name);
  return s;
}

std::string supported_hf_classes() {
  std::string s;
  for (const ArchInfo& i : all_archs())
    for (const HfClass& h : i.hf_classes) s += (s.empty() ? "" : ", ") + std::string(h.name);
  return s;
}

bool tensor_required(const TensorSpec& t, const ModelConfig& c) {
  switch (t.need) {
    case Need::Required: return true;
    case Need::Optional: return false;
    case Need::IfQkvBias: return c.qkv_bias;
    case Need::IfQkNorm: return c.qk_norm;
    case Need::IfPostNorms: return c.post_norms;
  }
  return true;
}

std::string layer_tensor_name(const TensorSpec& t, int il) { return "blk." + std::to_string(il) + "." + t.gguf; }

std::optional<HfTensor> hf_tensor(const ArchInfo& a, const std::string& hf_name) {
  std::string n = hf_name;
  // Multimodal checkpoints nest the language model.
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (n.starts_with(p)) n = "model." + n.substr(std::string(p).size());
  if (n == "language_model.lm_head.weight") n = "lm_head.weight";
  static const std::string layers = "model.layers.";
  if (n.starts_with(layers)) {
    size_t i = layers.size();
    while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) ++i;
    if (i == layers.size() || i >= n.size() || n[i] != '.') return std::nullopt;
    const std::string index = n.substr(layers.size(), i - layers.size());
    const std::string rest = n.substr(i + 1);
    for (const TensorSpec& t : a.layer)
      if (rest == t.hf) return HfTensor{"blk." + index + "." + t.gguf, &t};
    return std::nullopt;
  }
  for (const TensorSpec& t : a.globals)
    if (*t.hf && n == t.hf) return HfTensor{t.gguf, &t};
  return std::nullopt;
}

}  // namespace pagellm
