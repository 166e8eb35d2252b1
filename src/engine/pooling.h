// Pooling (embedding requests): one vector per input from the model's final
// hidden states (after the output norm, what the output matrix would
// multiply), taken at the last prompt position, the first, or averaged over
// all of them, then through the model's dense projections if it has any
// (EmbeddingGemma), then L2-normalised when the model says so. The scheduler and
// runner only learn which rows are wanted (scheduler/sequence.h's PoolRows);
// this file holds the arithmetic and where a model's pooling comes from.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "scheduler/sequence.h"

namespace pagellm {

class GGUFFile;

// What a server exposes (--task): generation, embeddings, or scores; pooling
// (vLLM's --runner pooling): embed or score, as the model is.
enum class ServeTask : uint8_t { Generate, Embed, Score, Pooling };
inline constexpr EnumName<ServeTask> kServeTaskNames[] = {{"generate", ServeTask::Generate},
                                                          {"embed", ServeTask::Embed},
                                                          {"score", ServeTask::Score},
                                                          {"pooling", ServeTask::Pooling}};

enum class PoolingType : uint8_t { Last, Mean, Cls };
inline constexpr EnumName<PoolingType> kPoolingTypeNames[] = {
    {"last", PoolingType::Last}, {"mean", PoolingType::Mean}, {"cls", PoolingType::Cls}};

enum class HeadActivation : uint8_t { None, Tanh, Gelu, Relu };

// y = act(W x + b): W is [out, in] row-major, b empty or [out]. A
// sentence-transformers Dense module after the pooling (EmbeddingGemma's
// 2_Dense and 3_Dense; llama.cpp's dense_2 / dense_3 tensors), or a layer of
// a score head (engine/score_head.h).
struct DenseLayer {
  int32_t in = 0, out = 0;
  std::vector<float> weight;
  std::vector<float> bias;
  HeadActivation activation = HeadActivation::None;
};

// x through each layer in turn, in double precision. Throws Error naming
// `what` when a layer does not take what the one before gives.
std::vector<double> run_dense_layers(const std::vector<DenseLayer>& layers, std::vector<double> x, const char* what);

struct PoolingSpec {
  PoolingType type = PoolingType::Last;
  bool normalize = true;
  std::vector<DenseLayer> dense;  // applied in order to the pooled vector

  // The length of the vectors it gives for a model of hidden size n_embd.
  int32_t output_size(int32_t n_embd) const { return dense.empty() ? n_embd : dense.back().out; }
};

// A pooled vector through the spec's dense layers (in double, on the host:
// a few small matrices per input), then normalised if the spec says so.
// Throws Error when the sizes do not chain.
std::vector<float> finish_embedding(const PoolingSpec& spec, std::vector<float> pooled);

// The hidden rows a pooling type needs from the runner.
PoolRows pool_rows(PoolingType type);

// Accumulates one input's pooled vector as its prompt's chunks come back.
class Pooler {
 public:
  Pooler() = default;
  Pooler(PoolingType type, int32_t dim) : type_(type), dim_(dim), sum_(static_cast<size_t>(dim), 0.0) {}
  // rows: [count, dim], the final hidden states of prompt positions
  // first_pos .. first_pos + count - 1. A chunk from position 0 starts over
  // (a sequence recomputed after preemption).
  void add(const float* rows, int32_t first_pos, int32_t count);
  // The pooled vector of a prompt of num_tokens tokens, normalised if asked.
  // Throws Error when the rows it needs never came.
  std::vector<float> result(int32_t num_tokens, bool normalize) const;

 private:
  PoolingType type_ = PoolingType::Last;
  int32_t dim_ = 0;
  std::vector<double> sum_;  // Mean: the sum so far; Last / Cls: the row
  int32_t rows_ = 0;         // positions added (Mean), or 1 once the row came
  int32_t last_pos_ = -1;    // the last position added
};

// x / ||x||_2 in place (a zero vector stays zero).
void l2_normalize(std::span<float> x);

// Matryoshka dimensions (OpenAI's `dimensions`): the first n values,
// normalised again when the model normalises.
std::vector<float> truncate_embedding(std::vector<float> v, int32_t n, bool normalize);

// The model's pooling as sentence-transformers or llama.cpp would apply it:
// a folder's modules.json / 1_Pooling/config.json / Dense modules (their
// config.json and model.safetensors) / Normalize module, or a GGUF file's
// <arch>.pooling_type (normalised, as llama.cpp's server does) and its
// dense_2 / dense_3 tensors (llama.cpp's converter with
// --sentence-transformers-dense-modules);
// else last-token pooling, normalised (vLLM's default for decoder models).
// Throws Error naming what it cannot serve (a reranker's rank pooling: its
// scores are engine/score_head.h's; a sentence-transformers mode other than
// last / mean / cls).
PoolingSpec model_pooling(const std::string& model_path, const GGUFFile* gguf);

}  // namespace pagellm
