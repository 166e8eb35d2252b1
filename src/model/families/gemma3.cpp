// Gemma 3: Gemma 2's layer with q/k norms instead of softcaps; five local
// layers (their own unscaled RoPE base) to each global one. The multimodal
// class's text_config is read as the text model.
//
// EmbeddingGemma is the same layer stack with bidirectional attention
// (Gemma3TextModel, use_bidirectional_attention: true; llama.cpp's
// gemma-embedding): the full layers see the whole input, the sliding layers
// a symmetric window (ModelConfig::attention_window). Its mean pooling and
// dense projections are sentence-transformers modules (engine/pooling.h).
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  write_hf_gemma(c, j, true);
  if (c.non_causal) j["use_bidirectional_attention"] = true;
}

// What both entries share.
void gemma3_layers(ArchInfo& a) {
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
}

}  // namespace

ArchInfo gemma3() {
  ArchInfo a = entry(Arch::Gemma3, "gemma3", "gemma3_text",
                     {{"Gemma3ForCausalLM", HfSwa::Pattern}, {"Gemma3ForConditionalGeneration", HfSwa::Pattern}});
  gemma3_layers(a);
  a.dummy_shapes = {
      {"gemma3-270m", 262144, 640, 18, 4, 1, 256, 2048, 32768, 1000000.f, 1e-6f, true, 512},
      {"tiny-gemma3", 512, 256, 6, 2, 1, 128, 512, 512, 1000000.f, 1e-6f, true, 32},
  };
  return a;
}

ArchInfo gemma_embedding() {
  ArchInfo a = entry(Arch::GemmaEmbedding, "gemma-embedding", "gemma3_text", {{"Gemma3TextModel", HfSwa::Pattern}});
  gemma3_layers(a);
  a.non_causal = true;
  // A base model's names: "layers.N.", "embed_tokens.weight", "norm.weight";
  // files saved from a task class carry "model." first, which is dropped.
  a.hf_layers = "layers.";
  a.hf_base_prefix = "model.";
  for (TensorSpec& t : a.globals)
    if (std::string_view(t.hf).starts_with("model.")) t.hf += std::string_view("model.").size();
  a.dummy_shapes = {
      {"embeddinggemma-300m", 262144, 768, 24, 3, 1, 256, 1152, 2048, 1000000.f, 1e-6f, true, 512},
      // A window of 8 (each local query sees 4 keys either side) against
      // inputs of 1 to 40 tokens.
      {"tiny-embeddinggemma", 512, 256, 6, 2, 1, 128, 512, 512, 1000000.f, 1e-6f, true, 8},
  };
  return a;
}

}  // namespace pagellm::family
