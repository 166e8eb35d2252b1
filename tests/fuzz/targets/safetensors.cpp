// model.safetensors: the 8-byte length, the header JSON, the tensor table and
// the name mapping, read as a Llama (untied lm_head) and as a Gemma 3 (tied,
// whose norm weights the reader converts to F32 + 1).
#include <string>
#include <vector>

#include "common.h"
#include "core/dtype.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "targets.h"

namespace pagellm::fuzz {
namespace {

// GGUF names the reader can produce (see gguf_name in tensor_source.cpp).
const std::vector<std::string>& known_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"token_embd.weight", "output_norm.weight", "output.weight"};
    for (const char* base : {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                             "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                             "attn_q_norm.weight", "attn_k_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                             "ffn_down.weight", "ffn_norm.weight", "post_ffw_norm.weight",
                             "post_attention_norm.weight"})
      for (int layer = 0; layer < 2; ++layer) n.push_back("blk." + std::to_string(layer) + "." + base);
    return n;
  }();
  return names;
}

void read_as(const std::string& dir, Arch arch, bool tied) {
  ModelConfig cfg;
  cfg.arch = arch;
  cfg.tie_word_embeddings = tied;
  const auto src = hf_tensor_source(dir, cfg);
  for (const std::string& name : known_names()) {
    const TensorData* t = src->find(name);
    if (!t) continue;
    FUZZ_INVARIANT(!t->shape.empty() && t->shape.size() <= 4 && t->data != nullptr);
    const size_t nbytes = dtype_row_bytes(t->type, t->cols()) * static_cast<size_t>(t->rows());
    // Touch both ends: out of the mapping (or the converted copy) faults or trips ASan.
    if (nbytes > 0) {
      const auto* p = static_cast<const uint8_t*>(t->data);
      volatile uint8_t ends = p[0] ^ p[nbytes - 1];
      (void)ends;
    }
  }
}

}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  static const ScratchDir dir;
  dir.write("model.safetensors", data, size);
  // Loading runs at start-up: the CLI prints any std::exception as one error line.
  refused(Refusal::AnyException, [&] { read_as(dir.path(), Arch::Llama, false); });
  refused(Refusal::AnyException, [&] { read_as(dir.path(), Arch::Gemma3, true); });
  return 0;
}

}  // namespace pagellm::fuzz
