// Qwen 3: Llama's layer with per-head q/k norms, no biases.
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

ArchInfo qwen3() {
  // Qwen3ForSequenceClassification: the same layers under a score head
  // (engine/score_head.h reads its score.weight; --task score).
  ArchInfo a = entry(Arch::Qwen3, "qwen3", "qwen3",
                     {{"Qwen3ForCausalLM", HfSwa::UseFlag}, {"Qwen3ForSequenceClassification", HfSwa::UseFlag}});
  a.qk_norm = true;
  a.hf.head_dim = 128;
  a.globals = globals(Transform::None);
  a.layer = llama_layer(Transform::None, true);
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-qwen3", 512, 256, 2, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 0},
      {"tiny-qwen3-yarn", 512, 256, 2, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 0, 0, 0, 0, 0, dummy_yarn_x4},
      // Qwen3-Reranker's layers, small enough that the rerank fixtures keep
      // llama.cpp's converted GGUF (tools/gen_rerank_fixtures.py).
      {"tiny-qwen3-reranker", 512, 64, 2, 2, 1, 32, 128, 512, 1000000.f, 1e-6f, true, 0},
      // Qwen3-Embedding-0.6B's shape (the embedding benchmark, tools/bench_embeddings.py).
      {"qwen3-embedding-0.6b", 151669, 1024, 28, 16, 8, 128, 3072, 32768, 1000000.f, 1e-6f, true, 0},
  };
  return a;
}

}  // namespace pagellm::family
