// Every family's table entry, one function per file in this folder. The
// registry (model/arch.cpp, all_archs) calls them in this order, which is
// the order of error messages listing the supported families.
#pragma once

#include "model/arch.h"

namespace pagellm::family {

ArchInfo llama();     // llama.cpp, Mistral, Mixtral (llama with experts)
ArchInfo qwen2();
ArchInfo qwen3();
ArchInfo qwen2moe();
ArchInfo qwen3moe();
ArchInfo gemma2();
ArchInfo gemma3();
ArchInfo gemma_embedding();  // EmbeddingGemma: Gemma 3 with bidirectional attention (in gemma3.cpp)
ArchInfo gemma4();
ArchInfo bert();
ArchInfo xlm_roberta();  // XLM-RoBERTa / RoBERTa: BERT's layers, offset positions (in bert.cpp)
ArchInfo phi3();
ArchInfo gptoss();
ArchInfo qwen35();    // Qwen3.5 dense: Gated DeltaNet and gated attention layers
ArchInfo qwen35moe(); // Qwen3.5-MoE: the same layers with routed and shared experts
ArchInfo deepseek2(); // DeepSeek V2 / V3 (Kimi K2): MLA, shared and routed experts
ArchInfo glm4moe();   // GLM-4.5 / 4.6: GQA attention, DeepSeek V3's experts
ArchInfo qwen3next(); // Qwen3-Next: Qwen3.5-MoE's layers, fused linear projections (in qwen35.cpp)

}  // namespace pagellm::family
