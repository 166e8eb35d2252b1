// model.safetensors: the 8-byte length, the header JSON, the tensor table and
// the name mapping, read as a Llama / Mixtral (untied lm_head), as a Gemma 3
// (tied, whose norm weights the reader converts to F32 + 1), as a
// Qwen2-MoE (one tensor per expert, a shared expert) and as a gpt-oss
// (stacked experts, transposed and split into F32 copies).
#include <string>
#include <vector>

#include "common.h"
#include "core/dtype.h"
#include "model/arch.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "targets.h"

namespace pagellm::fuzz {
namespace {

// GGUF names the reader can produce for a family (its architecture table),
// for two layers and the first experts.
std::vector<std::string> known_names(Arch arch) {
  const ArchInfo& a = arch_info(arch);
  std::vector<std::string> n;
  for (const TensorSpec& t : a.globals) n.push_back(t.gguf);
  for (int layer = 0; layer < 2; ++layer)
    for (const TensorSpec& t : a.layer) {
      const std::string name = layer_tensor_name(t, layer);
      n.push_back(name);  // stacked experts keep the plain name
      if (t.experts)
        for (int e = 0; e < 4; ++e) n.push_back(name + "[" + std::to_string(e) + "]");
    }
  return n;
}

void read_as(const std::string& dir, Arch arch, bool tied) {
  ModelConfig cfg;
  cfg.arch = arch;
  cfg.tie_word_embeddings = tied;
  const auto src = hf_tensor_source(dir, cfg);
  static const std::vector<std::string> names[] = {known_names(Arch::Llama), known_names(Arch::Gemma3),
                                                   known_names(Arch::Qwen2Moe), known_names(Arch::GptOss)};
  const std::vector<std::string>& known =
      names[arch == Arch::Llama ? 0 : arch == Arch::Gemma3 ? 1 : arch == Arch::Qwen2Moe ? 2 : 3];
  for (const std::string& name : known) {
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
  refused(Refusal::AnyException, [&] { read_as(dir.path(), Arch::Qwen2Moe, false); });
  refused(Refusal::AnyException, [&] { read_as(dir.path(), Arch::GptOss, false); });
  return 0;
}

}  // namespace pagellm::fuzz
