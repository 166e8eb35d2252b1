// Qwen2-MoE: Qwen 2's attention, then routed experts plus a shared expert
// behind a sigmoid gate in every layer.
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig&, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["use_sliding_window"] = false;
}

}  // namespace

ArchInfo qwen2moe() {
  ArchInfo a = entry(Arch::Qwen2Moe, "qwen2moe", "qwen2_moe", {{"Qwen2MoeForCausalLM", HfSwa::UseFlag}});
  a.qkv_bias = true;
  a.moe = a.moe_only = true;
  a.moe_norm_topk = false;  // Qwen2MoeConfig.norm_topk_prob defaults to false
  a.globals = globals(Transform::None);
  a.layer = llama_layer(Transform::None, false, "mlp");
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-qwen2moe", 512, 256, 2, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, false, 0, 8, 2, 256, 512},
  };
  return a;
}

}  // namespace pagellm::family
