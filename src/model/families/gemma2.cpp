// Gemma 2: Gemma's layer (norms around attention and FFN, GELU), local and
// global layers alternating, logit softcapping.
#include <cmath>

#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

// GGUF has no query_pre_attn_scalar: llama.cpp takes it as head_dim except
// for Gemma 2 27B (46 layers), whose queries are scaled by n_embd / n_head.
void read_gguf(const GGUFFile&, ModelConfig& c) {
  if (c.n_layer == 46) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) { write_hf_gemma(c, j, false); }

// Caps far below Gemma 2's 50 / 30, so that they bind on random weights.
void low_caps(ModelConfig& c) {
  c.attn_softcap = 5.0f;
  c.final_softcap = 3.0f;
}

}  // namespace

ArchInfo gemma2() {
  ArchInfo a = entry(Arch::Gemma2, "gemma2", "gemma2", {{"Gemma2ForCausalLM", HfSwa::Pattern}});
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
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-gemma2", 512, 256, 4, 2, 1, 128, 512, 512, 10000.f, 1e-6f, true, 32, 0, 0, 0, 0, low_caps},
  };
  return a;
}

}  // namespace pagellm::family
