// GGUF: the reader, then what loading a model does with the file next
// (config keys, tensor table, vocabulary), each step on its own so that a
// refusal in one still lets the others run.
#include <memory>

#include "common.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "targets.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::fuzz {
namespace {

void walk_metadata(const GGUFFile& f) {
  for (const auto& [key, v] : f.metadata()) {
    (void)v.to_string();
    if (v.type != GGUFType::ARRAY) continue;
    // The typed getters read numeric arrays through their raw pointer.
    if (v.raw) {
      FUZZ_INVARIANT(f.get_float_array(key).size() == v.count);
      FUZZ_INVARIANT(f.get_int_array(key).size() == v.count);
    } else if (v.elem_type == GGUFType::STRING) {
      FUZZ_INVARIANT(f.get_string_array(key).size() == v.count);
    }
  }
}

void walk_tensors(const GGUFFile& f) {
  for (const GGUFTensorInfo& t : f.tensors()) {
    (void)t.shape_string();
    FUZZ_INVARIANT(f.find_tensor(t.name) == &t);
    FUZZ_INVARIANT(t.nbytes == dtype_row_bytes(t.type, t.cols()) * static_cast<size_t>(t.rows()));
    FUZZ_INVARIANT(t.nbytes <= f.file_size());
    // The data lies in the mapping: touching both ends faults otherwise.
    if (t.nbytes > 0) {
      volatile uint8_t ends = t.data[0] ^ t.data[t.nbytes - 1];
      (void)ends;
    }
  }
}

}  // namespace

int gguf(const uint8_t* data, size_t size) {
  static const ScratchDir dir;
  const std::string path = dir.write("model.gguf", data, size);
  // The CLI and the server print any std::exception of loading as one error line.
  constexpr Refusal accept = Refusal::AnyException;
  std::unique_ptr<GGUFFile> f;
  if (refused(accept, [&] { f = GGUFFile::open(path); })) return 0;
  refused(accept, [&] { walk_metadata(*f); });
  walk_tensors(*f);
  refused(accept, [&] {
    const ModelConfig c = config_from_gguf(*f);
    (void)c.describe();
    FUZZ_INVARIANT(gguf_tensor_source(*f)->count() == f->tensors().size());
  });
  refused(accept, [&] {
    const auto tok = Tokenizer::from_gguf(*f);
    const auto ids = tok->encode("Hello world, <s> 12345\n\t  héllo 你好 🙂", true, true);
    for (int32_t id : ids) FUZZ_INVARIANT(id >= 0 && id < tok->vocab_size());
    (void)tok->decode(ids, false);
    (void)tok->decode(ids, true);
  });
  return 0;
}

}  // namespace pagellm::fuzz
