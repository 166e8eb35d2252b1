// Llama, Mistral and Mixtral: Mixtral is llama with experts (llama.cpp's
// files say arch llama too), written as MixtralForCausalLM by the HF writer.
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  if (!c.moe()) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
}

// Llama 3.1's scaling with an original context short enough that the tiny
// model's 32 frequencies fall in all three bands (kept, interpolated, divided).
void llama3_rope(ModelConfig& c) { c.rope_llama3 = {8.0f, 1.0f, 4.0f, 256}; }

}  // namespace

ArchInfo llama() {
  ArchInfo a = entry(Arch::Llama, "llama", "llama",
                     {{"LlamaForCausalLM", HfSwa::None},
                      {"MistralForCausalLM", HfSwa::EveryLayer},
                      {"MixtralForCausalLM", HfSwa::EveryLayer}});
  a.gguf_permuted_qk = true;
  a.moe = true;
  a.moe_norm_topk = true;  // Mixtral renormalises its top-2
  a.gguf_expert_ff_key = false;  // Mixtral-style files: the expert FFN is feed_forward_length
  a.hf_moe_class = "MixtralForCausalLM";
  a.hf_moe_model_type = "mixtral";
  a.hf_moe_keys = HfMoeKeys::LocalExperts;
  a.hf_moe_name = "Mixtral";
  a.globals = globals(Transform::None);
  a.layer = llama_layer(Transform::RopePermute, false, "block_sparse_moe");
  a.write_hf = write_hf;
  // Fields: name, vocab, embd, layers, heads, kv heads, head dim, ffn, ctx, RoPE base, norm eps, tied,
  // window [, experts, used, expert ffn, shared ffn, extras].
  a.dummy_shapes = {
      {"tinyllama-1.1b", 32000, 2048, 22, 32, 4, 64, 5632, 2048, 10000.f, 1e-5f, false, 0},
      {"llama-3.2-1b", 128256, 2048, 16, 32, 8, 64, 8192, 8192, 500000.f, 1e-5f, true, 0},
      {"tiny-llama", 512, 256, 2, 4, 2, 64, 512, 512, 10000.f, 1e-5f, false, 0},
      // Mixture of experts. Mixtral-style files are llama with experts (the
      // expert FFN is feed_forward_length); olmoe-1b-7b is OLMoE's sizes in
      // that form, which llama.cpp loads as it loads Mixtral.
      {"olmoe-1b-7b", 50304, 2048, 16, 16, 16, 128, 1024, 4096, 10000.f, 1e-5f, false, 0, 64, 8, 1024},
      {"tiny-mixtral", 512, 256, 2, 4, 2, 64, 256, 512, 1000000.f, 1e-5f, false, 0, 4, 2, 256},
      {"tiny-llama3", 512, 256, 2, 4, 2, 64, 512, 512, 10000.f, 1e-5f, false, 0, 0, 0, 0, 0, llama3_rope},
  };
  return a;
}

}  // namespace pagellm::family
