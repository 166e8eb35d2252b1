// Random-weight models of real shapes, like vLLM's dummy loader: benchmarks
// run TinyLlama-sized models without multi-GB downloads, and tests run tiny
// models of every architecture. Values are seeded per tensor name and row and
// drawn with integer-only arithmetic, so the same (shape, type, seed) gives the
// same bytes on every machine; write_dummy_gguf() saves them so another engine
// can load the very same weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/tensor_source.h"

namespace pagellm {

class GGUFFile;
class GGUFWriter;
class ThreadPool;

struct DummySpec {
  std::string shape = "tiny-llama";  // see dummy_shape_names()
  DType wtype = DType::F32;           // type of the weight matrices (norms stay F32)
  uint64_t seed = 0;
};

std::vector<std::string> dummy_shape_names();
// The config of a named shape; n_vocab comes from the vocabulary used.
ModelConfig dummy_config(const std::string& shape, int n_vocab);
// The weight type a matrix with `cols` inputs gets: K-quants need rows that
// are multiples of 256 and fall back like llama.cpp's quantizer does.
DType dummy_tensor_type(DType wanted, int64_t cols);

// Generates every tensor of the model in memory (owned by the source).
std::unique_ptr<TensorSource> make_dummy_source(const ModelConfig& cfg, const DummySpec& spec, ThreadPool& pool);

// Writes a complete GGUF (architecture keys, vocabulary, tensors). The
// vocabulary's tokenizer.* keys are copied from `vocab` when given; otherwise
// a synthetic SentencePiece vocabulary (specials, 256 byte tokens, fillers).
void write_dummy_gguf(const std::string& path, const DummySpec& spec, const GGUFFile* vocab, ThreadPool& pool);

// Adds the synthetic SentencePiece vocabulary's tokenizer.* keys (<unk>, <s>,
// </s>, 256 byte tokens, then fillers up to n_vocab >= 260) to `w`.
void add_synthetic_vocab(GGUFWriter& w, int n_vocab);
// Vocabulary size of `vocab` (token count), or the shape's natural size.
int dummy_vocab_size(const std::string& shape, const GGUFFile* vocab);

}  // namespace pagellm
