// Gemma 3: Gemma 2's layer with q/k norms instead of softcaps; five local
// layers (their own unscaled RoPE base) to each global one. The multimodal
// class's text_config is read as the text model.
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) { write_hf_gemma(c, j, true); }

}  // namespace

ArchInfo gemma3() {
  ArchInfo a = entry(Arch::Gemma3, "gemma3", "gemma3_text",
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
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"gemma3-270m", 262144, 640, 18, 4, 1, 256, 2048, 32768, 1000000.f, 1e-6f, true, 512},
      {"tiny-gemma3", 512, 256, 6, 2, 1, 128, 512, 512, 1000000.f, 1e-6f, true, 32},
  };
  return a;
}

}  // namespace pagellm::family
