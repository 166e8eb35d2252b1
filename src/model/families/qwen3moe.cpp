// Qwen3-MoE: Qwen 3's attention (q/k norms), then routed experts in every layer.
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig&, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["use_sliding_window"] = false;
}

}  // namespace

ArchInfo qwen3moe() {
  ArchInfo a = entry(Arch::Qwen3Moe, "qwen3moe", "qwen3_moe", {{"Qwen3MoeForCausalLM", HfSwa::UseFlag}});
  a.qk_norm = true;
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // llama.cpp's qwen3moe graph always renormalises
  a.hf.head_dim = 128;
  a.globals = globals(Transform::None);
  a.layer = llama_layer(Transform::None, true, "mlp");
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-qwen3moe", 512, 256, 2, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 0, 8, 3, 256},
  };
  return a;
}

}  // namespace pagellm::family
