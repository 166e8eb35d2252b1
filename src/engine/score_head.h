// Score heads (score / rerank requests): a pooled final hidden state goes
// through a few small dense layers on the host, then a sigmoid (one label)
// or a softmax (several); the score is one label's probability. The weights
// are dequantized to F32 once at load: a head is a few rows of hidden size,
// so running it on the host costs nothing next to the forward pass.
//
// What builds one:
//  - a GGUF whose <arch>.pooling_type is llama.cpp's rank: cls.weight /
//    cls.bias (a dense layer with tanh, encoder rerankers) and
//    cls.output.weight / cls.output.bias; Qwen3-Reranker's converter writes
//    cls.output as the lm_head rows of "yes" and "no", so the softmax's first
//    label is P(yes) = sigmoid(logit_yes - logit_no);
//  - a Hugging Face folder said to be a sequence classifier the way vLLM
//    users say it (--hf-overrides '{"architectures":
//    ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no",
//    "yes"], "is_original_qwen3_reranker": true}'): one row, lm_head[yes] -
//    lm_head[no], then a sigmoid (vLLM's conversion).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "engine/pooling.h"

namespace pagellm {

class GGUFFile;
class TensorSource;
class Tokenizer;

// Turns the last layer's outputs into probabilities (Identity: the raw
// logits, for a cross-encoder whose config asks for them).
enum class HeadOutput : uint8_t { Sigmoid, Softmax, Identity };

struct ScoreHead {
  std::vector<DenseLayer> layers;
  HeadOutput output = HeadOutput::Sigmoid;
  int32_t score_label = 0;  // the output that is the score

  int32_t input_size() const { return layers.empty() ? 0 : layers.front().in; }
  int32_t num_labels() const { return layers.empty() ? 0 : layers.back().out; }
  // The probabilities of every label for one pooled vector (throws Error
  // when its size is not input_size()).
  std::vector<float> probabilities(std::span<const float> pooled) const;
  float score(std::span<const float> pooled) const { return probabilities(pooled).at(score_label); }
};

// How query / document pairs become one prompt (score_format):
//  auto: the model's own (a GGUF's tokenizer.chat_template.rerank as
//        llama-server applies it; Qwen3-Reranker's for a folder whose
//        overrides say is_original_qwen3_reranker); else raw;
//  raw: the tokenizer's text pair (Tokenizer::encode_pair: BERT's [CLS] q
//       [SEP] d [SEP]; a decoder's query tokens then the document's, as vLLM);
//  qwen3-reranker: Qwen3-Reranker's prompt with its default instruction;
//  a file's path: its text, with {query} and {document} in it.
struct ScoreFormat {
  std::string template_text;  // empty: raw
  // The prompt of one pair, tokenized: a template's text with special tokens
  // parsed and nothing added (llama-server's way); raw: the tokenizer's pair.
  std::vector<int32_t> tokens(const Tokenizer& tok, const std::string& query, const std::string& document) const;
};

// Qwen3-Reranker's prompt (its model card's; what llama.cpp's converter
// stores as the rerank template).
const std::string& qwen3_reranker_template();

struct ScoreModel {
  ScoreHead head;
  ScoreFormat format;
  // The row the head reads: a causal model's last token; an encoder's first
  // (or the mean, as a GGUF's <arch>.classifier.pooling_type may say).
  PoolingType pooling = PoolingType::Last;
};

// The score head of a model and how its pairs are formatted, or nullopt when
// the model has none (then `why` says so). `overrides`: --hf-overrides (a JSON
// object, possibly empty); `format_option`: --score-template. Throws Error for
// a head it finds and cannot build (a missing tensor, an unknown token).
std::optional<ScoreModel> find_score_model(const std::string& model_path, const GGUFFile* gguf,
                                           const TensorSource& tensors, const Tokenizer& tokenizer,
                                           const nlohmann::json& overrides, const std::string& format_option,
                                           std::string& why);

}  // namespace pagellm
