#include "engine/score_head.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "core/quant_blocks.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/tensor_source.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

using nlohmann::json;
namespace fs = std::filesystem;

std::vector<float> ScoreHead::probabilities(std::span<const float> pooled) const {
  PAGELLM_CHECK(!layers.empty(), "score head: no layers");
  PAGELLM_CHECK(static_cast<int64_t>(pooled.size()) == input_size(), "score head: a pooled vector of {} values, the "
                "head takes {}", pooled.size(), input_size());
  const std::vector<double> x =
      run_dense_layers(layers, std::vector<double>(pooled.begin(), pooled.end()), "score head");
  std::vector<float> p(x.size());
  if (output == HeadOutput::Identity) {
    for (size_t k = 0; k < x.size(); ++k) p[k] = static_cast<float>(x[k]);
  } else if (output == HeadOutput::Sigmoid) {
    for (size_t k = 0; k < x.size(); ++k) p[k] = static_cast<float>(1.0 / (1.0 + std::exp(-x[k])));
  } else {
    const double top = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (double v : x) sum += std::exp(v - top);
    for (size_t k = 0; k < x.size(); ++k) p[k] = static_cast<float>(std::exp(x[k] - top) / sum);
  }
  return p;
}

namespace {

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size()))
    s.replace(at, what.size(), with);
}

// Rows of a [rows, cols] tensor as F32.
std::vector<float> tensor_rows(const TensorData& t, const std::vector<int64_t>& rows) {
  PAGELLM_CHECK(t.shape.size() <= 2, "score head: tensor {} has {} dimensions", t.name, t.shape.size());
  const int64_t cols = t.cols();
  const size_t row_bytes = dtype_row_bytes(t.type, cols);
  std::vector<float> out(rows.size() * static_cast<size_t>(cols));
  for (size_t k = 0; k < rows.size(); ++k) {
    PAGELLM_CHECK(rows[k] >= 0 && rows[k] < t.rows(), "score head: row {} of tensor {} ({} rows)", rows[k], t.name,
                  t.rows());
    dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(rows[k]) * row_bytes,
                       out.data() + k * static_cast<size_t>(cols), cols);
  }
  return out;
}

std::vector<int64_t> all_rows(const TensorData& t) {
  std::vector<int64_t> rows(static_cast<size_t>(t.rows()));
  for (int64_t r = 0; r < t.rows(); ++r) rows[static_cast<size_t>(r)] = r;
  return rows;
}

DenseLayer dense_from(const TensorData& w, const TensorData* b, HeadActivation act) {
  DenseLayer l;
  l.in = static_cast<int32_t>(w.cols());
  l.out = static_cast<int32_t>(w.rows());
  l.weight = tensor_rows(w, all_rows(w));
  if (b) {
    PAGELLM_CHECK(b->shape.size() == 1 && b->cols() == l.out, "score head: bias {} has {} values for {} outputs",
                  b->name, b->cols(), l.out);
    l.bias = tensor_rows(*b, {0});
  }
  l.activation = act;
  return l;
}

std::optional<ScoreModel> from_gguf(const GGUFFile& gguf, const std::string& format_option, std::string& why) {
  const std::string arch = gguf.get_string("general.architecture", "");
  // llama.cpp's enum llama_pooling_type: 4 is rank (a reranker's). An
  // encoder's sequence classifier (BertForSequenceClassification) is written
  // without it, with its labels: llama-server scores it under --rerank.
  const bool encoder = !gguf.get_bool(arch + ".attention.causal", true);
  const bool classifier = encoder && gguf.find(arch + ".classifier.output_labels") &&
                          gguf.find_tensor("cls.output.weight");
  if (gguf.get_int(arch + ".pooling_type", -1) != 4 && !classifier) {
    why = "the model has no score head (its GGUF's pooling_type is not rank, as llama.cpp's converter writes for "
          "rerankers, nor has it a sequence classifier's labels)";
    return std::nullopt;
  }
  auto tensor = [&](const std::string& name) -> std::optional<TensorData> {
    const GGUFTensorInfo* t = gguf.find_tensor(name);
    if (!t) return std::nullopt;
    return TensorData{t->name, t->type, t->shape, t->data};
  };
  PAGELLM_CHECK(!tensor("cls.norm.weight"), "a rank model with a head norm (cls.norm) is not served yet");
  ScoreModel m;
  // llama.cpp's rank pooling reads the last token of a causal model, else
  // the first, or the mean when <arch>.classifier.pooling_type is mean (1).
  // An encoder's classifier reads its first token through a dense layer and
  // tanh (BERT's pooler, RoBERTa's classifier.dense) before cls.output;
  // llama.cpp b11434's converter drops BERT's pooler, so such a file cannot
  // give the model's scores: refused rather than served wrong.
  PAGELLM_CHECK(!encoder || !tensor("cls.output.weight") || tensor("cls.weight"),
                "'{}': an encoder's classifier without its pooler (cls.weight; llama.cpp's converter leaves BERT's "
                "pooler.dense out): its scores would not be the model's; serve the Hugging Face folder instead",
                gguf.path());
  if (encoder)
    m.pooling = gguf.get_int(arch + ".classifier.pooling_type", 2) == 1 ? PoolingType::Mean : PoolingType::Cls;
  // llama.cpp: the optional pooler dense layer takes tanh, then cls.output.
  if (auto w = tensor("cls.weight")) {
    auto b = tensor("cls.bias");
    m.head.layers.push_back(dense_from(*w, b ? &*b : nullptr, HeadActivation::Tanh));
  }
  if (auto w = tensor("cls.output.weight")) {
    auto b = tensor("cls.output.bias");
    m.head.layers.push_back(dense_from(*w, b ? &*b : nullptr, HeadActivation::None));
  }
  PAGELLM_CHECK(!m.head.layers.empty(), "a rank model without cls.weight or cls.output.weight");
  // Two labels (Qwen3-Reranker's yes, no): llama.cpp's softmax, the first
  // label's probability; one: a sigmoid (vLLM and transformers).
  m.head.output = m.head.num_labels() > 1 ? HeadOutput::Softmax : HeadOutput::Sigmoid;
  if (format_option == "auto") m.format.template_text = gguf.get_string("tokenizer.chat_template.rerank", "");
  return m;
}

json read_config(const std::string& dir) {
  return read_json_file_bounded((fs::path(dir) / "config.json").string(), kConfigJsonLimits);
}

// A tensor the model's own source does not map (a classifier's score.weight),
// read from the folder's safetensors files by its Hugging Face name.
std::optional<DenseLayer> hf_dense(const std::string& dir, const std::string& name) {
  const SafetensorsIndex index = read_safetensors_index(dir);
  for (const std::string& f : index.files) {
    const std::string path = (fs::path(dir) / f).string();
    SafetensorsFile file(path);
    if (!file.header().contains(name)) continue;
    const SafetensorsEntry e = parse_safetensors_entry(file.header()[name], name, file.data_size(), path);
    check_safetensors_entry_size(e, name, path);
    PAGELLM_CHECK(e.shape.size() == 2, "'{}': {} has {} dimensions, expected 2", path, name, e.shape.size());
    TensorData t{name, safetensors_dtype(e.dtype, path), {e.shape[1], e.shape[0]}, file.data() + e.begin};
    return dense_from(t, nullptr, HeadActivation::None);  // copies: the file may close
  }
  return std::nullopt;
}

std::optional<ScoreModel> from_hf(const std::string& dir, const TensorSource& tensors, const Tokenizer& tok,
                                  const json& overrides, const std::string& format_option, std::string& why) {
  json cfg = read_config(dir);
  for (const auto& [key, value] : overrides.items()) cfg[key] = value;
  std::string arch;
  if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
      cfg["architectures"][0].is_string())
    arch = cfg["architectures"][0].get<std::string>();
  const std::string suffix = "ForSequenceClassification";
  if (arch.size() < suffix.size() || arch.compare(arch.size() - suffix.size(), suffix.size(), suffix) != 0) {
    why = fmt::format("the model has no score head (its architecture is {}; a decoder reranker such as "
                      "Qwen3-Reranker is served with --hf-overrides naming a *ForSequenceClassification "
                      "architecture and classifier_from_token, as in vLLM)", arch.empty() ? "not given" : arch);
    return std::nullopt;
  }
  ScoreModel m;
  const bool qwen3_reranker = cfg.value("is_original_qwen3_reranker", false);
  if (cfg.contains("classifier_from_token")) {
    const json& from = cfg["classifier_from_token"];
    PAGELLM_CHECK(from.is_array() && (from.size() == 1 || from.size() == 2),
                  "classifier_from_token must list one or two tokens (vLLM: [\"no\", \"yes\"])");
    std::vector<int64_t> ids;
    for (const json& t : from) {
      PAGELLM_CHECK(t.is_string(), "classifier_from_token must list token texts");
      const auto id = tok.find_token(t.get<std::string>());
      PAGELLM_CHECK(id.has_value(), "classifier_from_token: '{}' is not a token of the vocabulary",
                    t.get<std::string>());
      ids.push_back(*id);
    }
    // The output matrix, or the embedding it is tied to.
    const TensorData* w = tensors.find("output.weight");
    if (!w) w = tensors.find("token_embd.weight");
    PAGELLM_CHECK(w, "classifier_from_token: the model has no output matrix");
    const std::vector<float> rows = tensor_rows(*w, ids);
    DenseLayer l;
    l.in = static_cast<int32_t>(w->cols());
    l.out = 1;
    l.weight.assign(rows.begin(), rows.begin() + l.in);
    // Two tokens (no, yes): the log-odds of the second, logit_yes - logit_no.
    if (ids.size() == 2)
      for (int32_t i = 0; i < l.in; ++i) l.weight[i] = rows[static_cast<size_t>(l.in + i)] - rows[i];
    m.head.layers.push_back(std::move(l));
  } else if (const TensorData* out = tensors.find("cls.output.weight")) {
    // An encoder cross-encoder (BertForSequenceClassification): the pooler,
    // tanh(dense(first token)), then the classifier, as the model's tensor
    // source names them (cls.weight, cls.output.weight: llama.cpp's names).
    const TensorData* pooler = tensors.find("cls.weight");
    PAGELLM_CHECK(pooler, "'{}': a {} with a classifier but no pooler (cls.weight)", dir, arch);
    m.head.layers.push_back(dense_from(*pooler, tensors.find("cls.bias"), HeadActivation::Tanh));
    m.head.layers.push_back(dense_from(*out, tensors.find("cls.output.bias"), HeadActivation::None));
    PAGELLM_CHECK(m.head.num_labels() == 1, "'{}': the classifier has {} labels; scores come from one-label "
                  "classifiers", dir, m.head.num_labels());
    m.pooling = PoolingType::Cls;
  } else {
    auto score = hf_dense(dir, "score.weight");
    PAGELLM_CHECK(score.has_value(), "'{}': a {} without score.weight (nor classifier_from_token)", dir, arch);
    PAGELLM_CHECK(score->out == 1, "'{}': score.weight has {} labels; scores come from one-label classifiers", dir,
                  score->out);
    m.head.layers.push_back(std::move(*score));
  }
  // One label: a sigmoid, sentence-transformers' CrossEncoder default and
  // vLLM's; a config that names Identity as the cross-encoder's activation
  // (sentence_transformers.activation_fn, or the older
  // sbert_ce_default_activation_function, as ms-marco-MiniLM's does) gets the
  // raw logit, as both then give.
  m.head.output = HeadOutput::Sigmoid;
  std::string activation;
  if (cfg.contains("sentence_transformers") && cfg["sentence_transformers"].is_object())
    activation = cfg["sentence_transformers"].value("activation_fn", std::string());
  if (activation.empty() && cfg.contains("sbert_ce_default_activation_function") &&
      cfg["sbert_ce_default_activation_function"].is_string())
    activation = cfg["sbert_ce_default_activation_function"].get<std::string>();
  if (activation.ends_with(".Identity")) m.head.output = HeadOutput::Identity;
  if (format_option == "auto" && qwen3_reranker) m.format.template_text = qwen3_reranker_template();
  return m;
}

}  // namespace

const std::string& qwen3_reranker_template() {
  static const std::string t =
      "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
      "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
      "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: "
      "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return t;
}

std::vector<int32_t> ScoreFormat::tokens(const Tokenizer& tok, const std::string& query,
                                         const std::string& document) const {
  if (template_text.empty()) return tok.encode_pair(query, document);
  // One substitution pass each, as llama-server does: a query that contains
  // "{document}" is replaced too.
  std::string text = template_text;
  replace_all(text, "{query}", query);
  replace_all(text, "{document}", document);
  return tok.encode(text, false, true);
}

std::optional<ScoreModel> find_score_model(const std::string& model_path, const GGUFFile* gguf,
                                           const TensorSource& tensors, const Tokenizer& tokenizer,
                                           const json& overrides, const std::string& format_option,
                                           std::string& why) {
  PAGELLM_CHECK(overrides.is_object(), "--hf-overrides must be a JSON object");
  for (const auto& [key, value] : overrides.items())
    PAGELLM_CHECK(key == "architectures" || key == "classifier_from_token" || key == "is_original_qwen3_reranker",
                  "--hf-overrides: '{}' is not served (architectures, classifier_from_token and "
                  "is_original_qwen3_reranker are)", key);
  std::optional<ScoreModel> m;
  std::error_code ec;
  if (gguf) {
    PAGELLM_CHECK(overrides.empty(), "--hf-overrides applies to Hugging Face folders, not to a GGUF file");
    m = from_gguf(*gguf, format_option, why);
  } else if (fs::is_directory(model_path, ec)) {
    try {
      m = from_hf(model_path, tensors, tokenizer, overrides, format_option, why);
    } catch (const json::exception& e) {  // a field of the wrong type
      throw Error(fmt::format("{}: config.json with --hf-overrides: {}", model_path, e.what()));
    }
  } else {
    why = "the model has no score head";
  }
  if (!m) return m;
  if (format_option == "qwen3-reranker") {
    m->format.template_text = qwen3_reranker_template();
  } else if (format_option == "raw") {
    m->format.template_text.clear();
  } else if (format_option != "auto") {  // a file
    std::ifstream in(format_option, std::ios::binary);
    PAGELLM_CHECK(in.good(), "--score-template '{}': not auto, raw or qwen3-reranker, and no readable file",
                  format_option);
    m->format.template_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (!m->format.template_text.empty())
    PAGELLM_CHECK(m->format.template_text.find("{query}") != std::string::npos &&
                      m->format.template_text.find("{document}") != std::string::npos,
                  "a score template must contain {{query}} and {{document}}");
  return m;
}

}  // namespace pagellm
