#include "model/arch.h"

#include <algorithm>
#include <cctype>
#include <string_view>

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
Dims router_mat(const ModelConfig& c) { return {c.n_embd, c.n_expert}; }
Dims ff_exps(const ModelConfig& c) { return {c.n_embd, c.n_ff_exp, c.n_expert}; }
Dims down_exps(const ModelConfig& c) { return {c.n_ff_exp, c.n_embd, c.n_expert}; }
Dims ff_shexp(const ModelConfig& c) { return {c.n_embd, c.n_ff_shexp}; }
Dims down_shexp(const ModelConfig& c) { return {c.n_ff_shexp, c.n_embd}; }
Dims qkv_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head + 2 * c.n_head_kv} * c.head_dim}; }
Dims gate_up_mat(const ModelConfig& c) { return {c.n_embd, int64_t{2} * c.n_ff}; }
Dims head_count_vec(const ModelConfig& c) { return {c.n_head}; }
Dims shexp_gate_mat(const ModelConfig& c) { return {c.n_embd, 1}; }
Dims expert_count_vec(const ModelConfig& c) { return {c.n_expert}; }
Dims ff_exps_bias(const ModelConfig& c) { return {c.n_ff_exp, c.n_expert}; }
Dims down_exps_bias(const ModelConfig& c) { return {c.n_embd, c.n_expert}; }
std::vector<int64_t> qkv_rows(const ModelConfig& c) {
  return {int64_t{c.n_head} * c.head_dim, int64_t{c.n_head_kv} * c.head_dim, int64_t{c.n_head_kv} * c.head_dim};
}
std::vector<int64_t> gate_up_rows(const ModelConfig& c) { return {c.n_ff, c.n_ff}; }

TensorSpec vec(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, false};
}
TensorSpec mat(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, true};
}

TensorSpec experts(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                   Transform tr = Transform::None) {
  TensorSpec t = mat(g, h, shape, s, Need::IfMoe, tr);
  t.experts = true;
  return t;
}

// One bias vector per expert, stacked ([dim, n_expert]).
TensorSpec expert_biases(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                         Transform tr = Transform::None) {
  TensorSpec t = vec(g, h, shape, s, Need::IfMoe, tr);
  t.experts = true;
  return t;
}

// The FFN of a Llama-style layer: dense, or (with experts in the config) a
// router and experts, HF names as Mixtral's (moe_hf: "block_sparse_moe") or
// Qwen-MoE's ("mlp", with a shared expert behind a sigmoid gate).
void add_ffn(std::vector<TensorSpec>& l, const char* moe_hf) {
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate, Need::IfDense));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up, Need::IfDense));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down, Need::IfDense));
  if (!moe_hf) return;
  const bool mixtral = std::string_view(moe_hf) == "block_sparse_moe";
  l.push_back(mat("ffn_gate_inp.weight", mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight", router_mat,
                  Slot::Router, Need::IfMoe));
  l.back().keep_f32 = true;
  l.push_back(experts("ffn_gate_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w1.weight" : "mlp.experts.{}.gate_proj.weight",
                      ff_exps, Slot::GateExps));
  l.push_back(experts("ffn_up_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w3.weight" : "mlp.experts.{}.up_proj.weight",
                      ff_exps, Slot::UpExps));
  l.push_back(experts("ffn_down_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w2.weight" : "mlp.experts.{}.down_proj.weight",
                      down_exps, Slot::DownExps));
  if (mixtral) return;
  // The gate is one row, [n_embd, 1] as llama.cpp's converter writes it (a
  // vector [n_embd] is read the same).
  l.push_back(mat("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", shexp_gate_mat, Slot::ShexpGate,
                  Need::IfSharedExpert));
  l.back().keep_f32 = true;
  l.push_back(mat("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", ff_shexp, Slot::GateShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", ff_shexp, Slot::UpShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", down_shexp, Slot::DownShexp,
                  Need::IfSharedExpert));
}

// token_embd, output_norm, output (absent: tied), and RoPE factors (GGUF
// only; HF configs state them, the HF source serves them under these names).
std::vector<TensorSpec> globals(Transform norm) {
  return {mat("token_embd.weight", "model.embed_tokens.weight", vocab_mat, Slot::TokEmbd),
          vec("output_norm.weight", "model.norm.weight", embd_vec, Slot::OutputNorm, Need::Required, norm),
          mat("output.weight", "lm_head.weight", vocab_mat, Slot::Output, Need::Optional),
          vec("rope_freqs.weight", "", rope_vec, Slot::RopeFreqs, Need::Optional),
          vec("rope_factors_short.weight", "", rope_vec, Slot::RopeFactorsShort, Need::Optional),
          vec("rope_factors_long.weight", "", rope_vec, Slot::RopeFactorsLong, Need::Optional)};
}

// Llama-style layer (Llama, Qwen 2, Qwen 3): one norm before attention, one
// before the FFN (HF calls it post_attention_layernorm).
// The attention block of a Llama-style layer: a norm, q/k/v/o, q/k/v biases.
std::vector<TensorSpec> llama_attention(Transform qk) {
  return {vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
          mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q, Need::Required, qk),
          mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, Need::Required, qk),
          mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V),
          mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
          vec("attn_q.bias", "self_attn.q_proj.bias", q_vec, Slot::QBias, Need::IfQkvBias),
          vec("attn_k.bias", "self_attn.k_proj.bias", kv_vec, Slot::KBias, Need::IfQkvBias),
          vec("attn_v.bias", "self_attn.v_proj.bias", kv_vec, Slot::VBias, Need::IfQkvBias)};
}

std::vector<TensorSpec> llama_layer(Transform qk, bool qk_norm, const char* moe_hf = nullptr) {
  std::vector<TensorSpec> l = llama_attention(qk);
  if (qk_norm) {
    l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm));
    l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm));
  }
  l.push_back(vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm));
  add_ffn(l, moe_hf);
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

// Phi-3: Llama's layer with q/k/v fused into one matrix and gate/up into
// another (gate rows first), in both formats; the loader splits them.
std::vector<TensorSpec> phi3_layer() {
  return {vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
          TensorSpec{"attn_qkv.weight", "self_attn.qkv_proj.weight", qkv_mat, Need::Required, Transform::None,
                     {Slot::Q, Slot::K, Slot::V}, qkv_rows, true},
          mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
          vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm),
          TensorSpec{"ffn_up.weight", "mlp.gate_up_proj.weight", gate_up_mat, Need::Required, Transform::None,
                     {Slot::Gate, Slot::Up}, gate_up_rows, true},
          mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down)};
}

// gpt-oss: biased attention with a learned sink per head, then a MoE FFN
// whose router and experts all have biases. Its HF checkpoints stack the
// experts (x @ W layout) and interleave gate and up in one tensor.
std::vector<TensorSpec> gptoss_layer() {
  std::vector<TensorSpec> l = llama_attention(Transform::None);
  std::vector<TensorSpec> rest = {
          vec("attn_output.bias", "self_attn.o_proj.bias", embd_vec, Slot::OBias, Need::IfQkvBias),
          vec("attn_sinks.weight", "self_attn.sinks", head_count_vec, Slot::AttnSinks),
          // The pre-FFN norm (llama.cpp names it post_attention_norm here).
          vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm),
          [] {
            TensorSpec t = mat("ffn_gate_inp.weight", "mlp.router.weight", router_mat, Slot::Router, Need::IfMoe);
            t.keep_f32 = true;
            return t;
          }(),
          vec("ffn_gate_inp.bias", "mlp.router.bias", expert_count_vec, Slot::RouterBias, Need::IfMoe),
          experts("ffn_gate_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::GateExps, Transform::GateUpEven),
          experts("ffn_up_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::UpExps, Transform::GateUpOdd),
          experts("ffn_down_exps.weight", "mlp.experts.down_proj", down_exps, Slot::DownExps, Transform::ExpertsInOut),
          expert_biases("ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", ff_exps_bias, Slot::GateExpsBias,
                        Transform::GateUpEven),
          expert_biases("ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", ff_exps_bias, Slot::UpExpsBias,
                        Transform::GateUpOdd),
          expert_biases("ffn_down_exps.bias", "mlp.experts.down_proj_bias", down_exps_bias, Slot::DownExpsBias)};
  l.insert(l.end(), rest.begin(), rest.end());
  return l;
}

std::vector<ArchInfo> make_archs() {
  std::vector<ArchInfo> v;
  {
    // Mixtral is llama with experts (llama.cpp's files say arch llama too).
    ArchInfo a = family(Arch::Llama, "llama", "llama",
                        {{"LlamaForCausalLM", HfSwa::None},
                         {"MistralForCausalLM", HfSwa::EveryLayer},
                         {"MixtralForCausalLM", HfSwa::EveryLayer}});
    a.gguf_permuted_qk = true;
    a.moe = true;
    a.moe_norm_topk = true;  // Mixtral renormalises its top-2
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::RopePermute, false, "block_sparse_moe");
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
    ArchInfo a = family(Arch::Qwen2Moe, "qwen2moe", "qwen2_moe", {{"Qwen2MoeForCausalLM", HfSwa::UseFlag}});
    a.qkv_bias = true;
    a.moe = a.moe_only = true;
    a.moe_norm_topk = false;  // Qwen2MoeConfig.norm_topk_prob defaults to false
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::None, false, "mlp");
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::Qwen3Moe, "qwen3moe", "qwen3_moe", {{"Qwen3MoeForCausalLM", HfSwa::UseFlag}});
    a.qk_norm = true;
    a.moe = a.moe_only = true;
    a.moe_norm_topk = true;  // llama.cpp's qwen3moe graph always renormalises
    a.hf.head_dim = 128;
    a.globals = globals(Transform::None);
    a.layer = llama_layer(Transform::None, true, "mlp");
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::Gemma2, "gemma2", "gemma2", {{"Gemma2ForCausalLM", HfSwa::Pattern}});
    a.post_norms = true;
    a.act = Activation::GeluTanh;
    a.embd_scale_sqrt = true;
    a.swa_pattern = 2;  // even layers local, odd layers global; one RoPE for both
    a.gguf_sliding_window = 4096;
    a.softcaps = true;
    // Gemma2Config's defaults.
    a.hf.vocab_size = 256000;
    a.hf.hidden_size = 2304;
    a.hf.num_hidden_layers = 26;
    a.hf.num_attention_heads = 8;
    a.hf.num_key_value_heads = 4;
    a.hf.intermediate_size = 9216;
    a.hf.head_dim = 256;
    a.hf.max_position_embeddings = 8192;
    a.hf.tie_word_embeddings = true;
    a.hf.hidden_act = "gelu_pytorch_tanh";
    a.hf.sliding_window = 4096;
    a.hf.query_pre_attn_scalar = 256;
    a.hf.attn_logit_softcapping = 50.0f;
    a.hf.final_logit_softcapping = 30.0f;
    a.globals = globals(Transform::NormPlusOne);
    a.layer = gemma_layer(false);
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
  {
    ArchInfo a = family(Arch::Phi3, "phi3", "phi3", {{"Phi3ForCausalLM", HfSwa::EveryLayer}});
    a.swa_every_layer = true;
    a.partial_rotary = true;
    // Phi3Config's defaults.
    a.hf.vocab_size = 32064;
    a.hf.hidden_size = 3072;
    a.hf.intermediate_size = 8192;
    a.hf.num_hidden_layers = 32;
    a.hf.num_attention_heads = 32;
    a.hf.max_position_embeddings = 4096;
    a.hf.rms_norm_eps = 1e-5f;
    a.globals = globals(Transform::None);
    a.layer = phi3_layer();
    v.push_back(std::move(a));
  }
  {
    ArchInfo a = family(Arch::GptOss, "gpt-oss", "gpt_oss", {{"GptOssForCausalLM", HfSwa::Pattern}});
    a.qkv_bias = true;  // and the output projection's
    a.act = Activation::SwigluOai;
    a.swa_pattern = 2;  // even layers a local window, odd layers global; one RoPE for both
    a.gguf_sliding_window = 128;
    a.attn_sinks = true;
    a.moe = a.moe_only = true;
    a.moe_norm_topk = true;  // softmax over the chosen experts' logits: the same weights
    // GptOssConfig's defaults.
    a.hf.vocab_size = 201088;
    a.hf.hidden_size = 2880;
    a.hf.intermediate_size = 2880;
    a.hf.num_hidden_layers = 36;
    a.hf.num_attention_heads = 64;
    a.hf.num_key_value_heads = 8;
    a.hf.head_dim = 64;
    a.hf.max_position_embeddings = 131072;
    a.hf.rope_theta = 150000.0f;
    a.hf.rms_norm_eps = 1e-5f;
    a.hf.sliding_window = 128;
    a.hf.rope_parameters =
        R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
            "original_max_position_embeddings": 4096})";
    a.globals = globals(Transform::None);
    a.layer = gptoss_layer();
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

const std::vector<float>* config_rope_factors(const ModelConfig& c, Slot s) {
  switch (s) {
    case Slot::RopeFreqs: return &c.rope_freq_factors;
    case Slot::RopeFactorsShort: return &c.rope_factors_short;
    case Slot::RopeFactorsLong: return &c.rope_factors_long;
    default: return nullptr;
  }
}

bool tensor_required(const TensorSpec& t, const ModelConfig& c) {
  switch (t.need) {
    case Need::Required: return true;
    case Need::Optional: return false;
    case Need::IfQkvBias: return c.qkv_bias;
    case Need::IfQkNorm: return c.qk_norm;
    case Need::IfPostNorms: return c.post_norms;
    case Need::IfDense: return !c.moe();
    case Need::IfMoe: return c.moe();
    case Need::IfSharedExpert: return c.n_ff_shexp > 0;
  }
  return true;
}

std::string layer_tensor_name(const TensorSpec& t, int il) { return "blk." + std::to_string(il) + "." + t.gguf; }

std::vector<HfTensor> hf_tensors(const ArchInfo& a, const std::string& hf_name) {
  std::vector<HfTensor> found;
  std::string n = hf_name;
  // Multimodal checkpoints nest the language model.
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (n.starts_with(p)) n = "model." + n.substr(std::string(p).size());
  if (n == "language_model.lm_head.weight") n = "lm_head.weight";
  static const std::string layers = "model.layers.";
  if (n.starts_with(layers)) {
    size_t i = layers.size();
    while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) ++i;
    if (i == layers.size() || i >= n.size() || n[i] != '.') return found;
    const std::string index = n.substr(layers.size(), i - layers.size());
    const std::string rest = n.substr(i + 1);
    for (const TensorSpec& t : a.layer) {
      const std::string_view pattern = t.hf;
      const size_t at = pattern.find("{}");
      if (!t.experts || at == std::string_view::npos) {
        if (rest == t.hf) found.push_back(HfTensor{"blk." + index + "." + t.gguf, &t});
        continue;
      }
      // "mlp.experts.{}.up_proj.weight": the digits in place of {} name the expert.
      const std::string_view head = pattern.substr(0, at), tail = pattern.substr(at + 2);
      if (rest.size() <= head.size() + tail.size() || !rest.starts_with(head) || !rest.ends_with(tail)) continue;
      const std::string e = rest.substr(head.size(), rest.size() - head.size() - tail.size());
      if (e.size() > 6 || !std::all_of(e.begin(), e.end(), [](unsigned char ch) { return std::isdigit(ch); }))
        continue;
      found.push_back(HfTensor{"blk." + index + "." + t.gguf + "[" + std::to_string(std::stoi(e)) + "]", &t});
    }
    return found;
  }
  for (const TensorSpec& t : a.globals)
    if (*t.hf && n == t.hf) found.push_back(HfTensor{t.gguf, &t});
  return found;
}

std::optional<HfTensor> hf_tensor(const ArchInfo& a, const std::string& hf_name) {
  std::vector<HfTensor> found = hf_tensors(a, hf_name);
  if (found.empty()) return std::nullopt;
  return found.front();
}

}  // namespace pagellm
