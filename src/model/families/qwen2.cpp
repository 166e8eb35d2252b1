// Qwen 2 / 2.5: Llama's layer with q/k/v biases.
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

void write_hf(const ModelConfig&, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";  // q/k/v always have biases in Qwen 2
  j["use_sliding_window"] = false;
}

}  // namespace

ArchInfo qwen2() {
  ArchInfo a = entry(Arch::Qwen2, "qwen2", "qwen2", {{"Qwen2ForCausalLM", HfSwa::UseFlag}});
  a.qkv_bias = true;
  a.globals = globals(Transform::None);
  a.layer = llama_layer(Transform::None, false);
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"qwen2.5-0.5b", 151936, 896, 24, 14, 2, 64, 4864, 32768, 1000000.f, 1e-6f, true, 0},
      {"tiny-qwen2", 512, 256, 2, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 0},
  };
  return a;
}

}  // namespace pagellm::family
