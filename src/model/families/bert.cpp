// BERT (encoder embedders: BertModel, and the encoder of
// BertForSequenceClassification): learned absolute positions and a
// token-type row (type 0) added to the token embeddings, a LayerNorm over
// their sum, then post-LayerNorm layers: bidirectional attention with biases,
// x = norm(x + attention), x = norm(x + down(gelu(up(x)))). No output matrix:
// the last layer's output is the hidden state pooling reads. GGUF: llama.cpp's
// "bert" architecture as its converter writes it.
//
// XLM-RoBERTa and RoBERTa (XLMRobertaModel, bge-m3, multilingual-e5;
// XLMRobertaForSequenceClassification, bge-reranker-v2-m3) are the same
// layers under other names: position ids start past the padding row
// (padding_idx + 1 + i), every token is type 0, and the classifier reads the
// first token through dense + tanh, then out_proj. Their HF checkpoints load
// as their own family (the position table's first padding_idx + 1 rows
// dropped at load); llama.cpp's converter writes them as "bert" with those
// rows already dropped, so their GGUF files load as BERT.
#include "core/error.h"
#include "format/gguf.h"
#include "model/blocks.h"
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

Dims pos_mat(const ModelConfig& c) { return {c.n_embd, c.n_ctx_train}; }
Dims types_mat(const ModelConfig& c) { return {c.n_embd, c.n_token_types}; }
Dims ff_vec(const ModelConfig& c) { return {c.n_ff}; }
Dims embd_sq(const ModelConfig& c) { return {c.n_embd, c.n_embd}; }
Dims cls_mat(const ModelConfig& c) { return {c.n_embd, c.n_cls_out}; }
Dims cls_vec(const ModelConfig& c) { return {c.n_cls_out}; }

std::vector<TensorSpec> bert_globals() {
  return {mat("token_embd.weight", "embeddings.word_embeddings.weight", vocab_mat, Slot::TokEmbd),
          mat("position_embd.weight", "embeddings.position_embeddings.weight", pos_mat, Slot::PosEmbd),
          mat("token_types.weight", "embeddings.token_type_embeddings.weight", types_mat, Slot::TokTypes),
          vec("token_embd_norm.weight", "embeddings.LayerNorm.weight", embd_vec, Slot::TokEmbdNorm),
          vec("token_embd_norm.bias", "embeddings.LayerNorm.bias", embd_vec, Slot::TokEmbdNormBias),
          // BertForSequenceClassification's head (pooler: tanh(dense(CLS)), then
          // the classifier): checked and kept in the file, read by name by the
          // score head (engine/score_head.cpp, which refuses a classifier
          // without its pooler: llama.cpp b11434's converter leaves BERT's
          // pooler.dense out, and such a file still serves embeddings); not
          // uploaded.
          mat("cls.weight", "pooler.dense.weight", embd_sq, Slot::Unused, Need::Optional),
          vec("cls.bias", "pooler.dense.bias", embd_vec, Slot::Unused, Need::Optional),
          mat("cls.output.weight", "classifier.weight", cls_mat, Slot::Unused, Need::IfClassifier),
          vec("cls.output.bias", "classifier.bias", cls_vec, Slot::Unused, Need::Optional)};
}

// RoBERTa's names: the same embeddings (the position table offset, one
// token type read), and the classification head RobertaClassificationHead:
// dense + tanh on the first token, then out_proj, into the slots llama.cpp's
// converter gives them (cls, cls.output).
std::vector<TensorSpec> roberta_globals() {
  return {mat("token_embd.weight", "embeddings.word_embeddings.weight", vocab_mat, Slot::TokEmbd),
          mat("position_embd.weight", "embeddings.position_embeddings.weight", pos_mat, Slot::PosEmbd,
              Need::Required, Transform::PositionOffset),
          mat("token_types.weight", "embeddings.token_type_embeddings.weight", types_mat, Slot::TokTypes,
              Need::Required, Transform::FirstRowOnly),
          vec("token_embd_norm.weight", "embeddings.LayerNorm.weight", embd_vec, Slot::TokEmbdNorm),
          vec("token_embd_norm.bias", "embeddings.LayerNorm.bias", embd_vec, Slot::TokEmbdNormBias),
          mat("cls.weight", "classifier.dense.weight", embd_sq, Slot::Unused, Need::IfClassifier),
          vec("cls.bias", "classifier.dense.bias", embd_vec, Slot::Unused, Need::IfClassifier),
          mat("cls.output.weight", "classifier.out_proj.weight", cls_mat, Slot::Unused, Need::IfClassifier),
          vec("cls.output.bias", "classifier.out_proj.bias", cls_vec, Slot::Unused, Need::IfClassifier)};
}

std::vector<TensorSpec> bert_layer_tensors() {
  return {mat("attn_q.weight", "attention.self.query.weight", q_mat, Slot::Q),
          vec("attn_q.bias", "attention.self.query.bias", q_vec, Slot::QBias),
          mat("attn_k.weight", "attention.self.key.weight", kv_mat, Slot::K),
          vec("attn_k.bias", "attention.self.key.bias", kv_vec, Slot::KBias),
          mat("attn_v.weight", "attention.self.value.weight", kv_mat, Slot::V),
          vec("attn_v.bias", "attention.self.value.bias", kv_vec, Slot::VBias),
          mat("attn_output.weight", "attention.output.dense.weight", o_mat, Slot::O),
          vec("attn_output.bias", "attention.output.dense.bias", embd_vec, Slot::OBias),
          vec("attn_output_norm.weight", "attention.output.LayerNorm.weight", embd_vec, Slot::AttnNorm),
          vec("attn_output_norm.bias", "attention.output.LayerNorm.bias", embd_vec, Slot::AttnNormBias),
          mat("ffn_up.weight", "intermediate.dense.weight", ff_mat, Slot::Up),
          vec("ffn_up.bias", "intermediate.dense.bias", ff_vec, Slot::UpBias),
          mat("ffn_down.weight", "output.dense.weight", down_mat, Slot::Down),
          vec("ffn_down.bias", "output.dense.bias", embd_vec, Slot::DownBias),
          vec("layer_output_norm.weight", "output.LayerNorm.weight", embd_vec, Slot::FfnNorm),
          vec("layer_output_norm.bias", "output.LayerNorm.bias", embd_vec, Slot::FfnNormBias)};
}

// One post-LayerNorm encoder layer over the residual stream x.
void bert_layer(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const AttnWeights& A = p.layers[il].attn;
  const FfnWeights& F = p.layers[il].ffn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const int64_t d = c.n_embd;
  const int kv_layer = il - p.geo.layer_begin;
  be.matmul(*A.wq, *buf.x, n, *buf.q);
  be.matmul(*A.wk, *buf.x, n, *buf.k);
  be.matmul(*A.wv, *buf.x, n, *buf.v);
  be.add_bias(*buf.q, *A.bq, n);
  be.add_bias(*buf.k, *A.bk, n);
  be.add_bias(*buf.v, *A.bv, n);
  be.store_kv(kv_layer, *buf.k, *buf.v);  // no RoPE: positions came with the embeddings
  AttentionConfig ac;
  ac.n_head = p.geo.n_head;
  ac.n_head_kv = p.geo.n_head_kv;
  ac.head_dim = c.head_dim;
  ac.scale = c.attn_scale;
  ac.non_causal = true;
  be.attention(kv_layer, *buf.q, *buf.attn, ac);
  be.matmul(*A.wo, *buf.attn, n, *buf.o);
  be.add_bias(*buf.o, *A.bo, n);
  be.add(*buf.x, *buf.o, n * d);
  be.layer_norm(*buf.x, A.norm.get(), A.norm_b.get(), n, d, c.norm_eps, *buf.x);
  be.matmul(*F.up, *buf.x, n, *buf.up);
  be.add_bias(*buf.up, *F.up_b, n);
  be.activation(*buf.up, n * c.n_ff, Activation::GeluErf, *buf.up);
  be.matmul(*F.down, *buf.up, n, *buf.o);
  be.add_bias(*buf.o, *F.down_b, n);
  be.add(*buf.x, *buf.o, n * d);
  be.layer_norm(*buf.x, F.norm.get(), F.norm_b.get(), n, d, c.norm_eps, *buf.x);
}

// The number of labels of a *ForSequenceClassification config (transformers'
// num_labels: the size of id2label, 2 unless the config says); 0 for a base
// model.
int classifier_labels(const nlohmann::json& j, const std::string& path) {
  const bool classifier = j.contains("architectures") && j["architectures"].is_array() &&
                          !j["architectures"].empty() && j["architectures"][0].is_string() &&
                          j["architectures"][0].get<std::string>().ends_with("ForSequenceClassification");
  if (!classifier) return 0;
  const int n = j.contains("id2label") && j["id2label"].is_object() ? static_cast<int>(j["id2label"].size()) : 2;
  PAGELLM_CHECK(n >= 1 && n <= 1 << 16, "'{}': id2label has {} labels", path, n);
  return n;
}

void read_hf(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  c.norm_eps = static_cast<float>(hf_float(j, "layer_norm_eps", 1e-12));
  c.n_token_types = hf_size(j, "type_vocab_size", 2, 0, 1024, path);
  const std::string pos = j.value("position_embedding_type", std::string("absolute"));
  PAGELLM_CHECK(pos == "absolute", "'{}': position_embedding_type '{}' is not supported (absolute is)", path, pos);
  PAGELLM_CHECK(!j.value("is_decoder", false), "'{}': a BERT decoder (is_decoder) is not supported", path);
  c.n_cls_out = classifier_labels(j, path);
}

// XLMRobertaConfig / RobertaConfig: BERT's fields, and the padding row the
// position ids start after.
void read_hf_roberta(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  c.norm_eps = static_cast<float>(hf_float(j, "layer_norm_eps", 1e-12));
  // Checked, but every token is type 0: the loader keeps that row alone.
  hf_size(j, "type_vocab_size", 2, 1, 1024, path);
  c.n_token_types = 1;
  const std::string pos = j.value("position_embedding_type", std::string("absolute"));
  PAGELLM_CHECK(pos == "absolute", "'{}': position_embedding_type '{}' is not supported (absolute is)", path, pos);
  PAGELLM_CHECK(!j.value("is_decoder", false), "'{}': a RoBERTa decoder (is_decoder) is not supported", path);
  PAGELLM_CHECK(!j.value("add_cross_attention", false), "'{}': cross-attention (add_cross_attention) is not "
                "supported", path);
  // Position i of a text is row padding_idx + 1 + i (transformers'
  // create_position_ids_from_input_ids, for inputs without padding tokens).
  const int pad = hf_size(j, "pad_token_id", 1, 0, 1 << 20, path);
  c.hf_pos_offset = pad + 1;
  PAGELLM_CHECK(c.n_ctx_train > c.hf_pos_offset, "'{}': max_position_embeddings {} leaves no position after the "
                "padding row (pad_token_id {})", path, c.n_ctx_train, pad);
  c.n_ctx_train -= c.hf_pos_offset;
  c.n_cls_out = classifier_labels(j, path);
}

void read_gguf(const GGUFFile& f, ModelConfig& c) {
  const std::string a = f.get_string("general.architecture") + ".";
  // llama.cpp's converter writes the LayerNorm epsilon under its own key.
  c.norm_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_epsilon", c.norm_eps));
  PAGELLM_CHECK(!f.get_bool(a + "attention.causal", false), "'{}': {}attention.causal is true; BERT attends both ways",
                f.path(), a);
  const GGUFTensorInfo* types = f.find_tensor("token_types.weight");
  c.n_token_types = gguf_size(f, a + "token_type_count", types && types->shape.size() == 2 ? types->shape[1] : 0, 0, 1024);
  // The classifier's labels (llama.cpp writes their names), else its rows.
  const GGUFTensorInfo* out = f.find_tensor("cls.output.weight");
  const GGUFValue* labels = f.find(a + "classifier.output_labels");
  const uint64_t n_out = labels ? labels->count : out && out->shape.size() == 2 ? static_cast<uint64_t>(out->shape[1]) : 0;
  PAGELLM_CHECK(n_out <= 1 << 16, "'{}': a classifier of {} labels", f.path(), n_out);

  c.n_cls_out = static_cast<int>(n_out);
}

void write_labels(const ModelConfig& c, const char* cls, nlohmann::ordered_json& j) {
  j["architectures"] = nlohmann::ordered_json::array({cls});
  nlohmann::ordered_json labels, ids;
  for (int k = 0; k < c.n_cls_out; ++k) {
    labels[std::to_string(k)] = "LABEL_" + std::to_string(k);
    ids["LABEL_" + std::to_string(k)] = k;
  }
  j["id2label"] = labels;
  j["label2id"] = ids;
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  for (const char* key : {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                          "bos_token_id", "eos_token_id"})
    j.erase(key);
  j["hidden_act"] = "gelu";
  j["layer_norm_eps"] = decimal(c.norm_eps);
  j["type_vocab_size"] = c.n_token_types;
  j["position_embedding_type"] = "absolute";
  j["pad_token_id"] = 0;
  // A cross-encoder: BertForSequenceClassification with its labels.
  if (c.n_cls_out > 0) write_labels(c, "BertForSequenceClassification", j);
}

// XLMRobertaConfig: the position table's rows before position 0 come back
// (max_position_embeddings counts them), its padding row is pad_token_id.
void write_hf_roberta(const ModelConfig& c, nlohmann::ordered_json& j) {
  for (const char* key : {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings"})
    j.erase(key);
  PAGELLM_CHECK(c.hf_pos_offset >= 1, "cannot write a Hugging Face folder: XLM-RoBERTa's position table needs its "
                "padding row (hf_pos_offset {})", c.hf_pos_offset);
  j["hidden_act"] = "gelu";
  j["layer_norm_eps"] = decimal(c.norm_eps);
  j["max_position_embeddings"] = c.n_ctx_train + c.hf_pos_offset;
  j["type_vocab_size"] = c.n_token_types;
  j["position_embedding_type"] = "absolute";
  j["bos_token_id"] = 0;
  j["pad_token_id"] = c.hf_pos_offset - 1;
  j["eos_token_id"] = 2;
  if (c.n_cls_out > 0) write_labels(c, "XLMRobertaForSequenceClassification", j);
}

void tiny_extras(ModelConfig& c) { c.n_token_types = 2; }
// A cross-encoder (BertForSequenceClassification, one label: a relevance score).
void tiny_reranker_extras(ModelConfig& c) {
  c.n_token_types = 2;
  c.n_cls_out = 1;
}

// XLM-RoBERTa's: one token type, positions after padding row 1.
void tiny_roberta_extras(ModelConfig& c) {
  c.n_token_types = 1;
  c.hf_pos_offset = 2;
}
void tiny_roberta_cls_extras(ModelConfig& c) {
  tiny_roberta_extras(c);
  c.n_cls_out = 1;
}

// What BERT and XLM-RoBERTa share: a bidirectional encoder with erf GELU,
// post-LayerNorm layers under "encoder.layer.", BertConfig's defaults
// (XLMRobertaConfig's and RobertaConfig's are the same).
ArchInfo encoder_entry(Arch arch, const char* model_type, std::vector<HfClass> classes, const char* base_prefix) {
  ArchInfo a = entry(arch, "bert", model_type, std::move(classes));
  a.non_causal = true;
  a.act = Activation::GeluErf;
  a.hf_layers = "encoder.layer.";
  a.hf_base_prefix = base_prefix;
  a.extra_ops = {PGLB_OP_LAYER_NORM, PGLB_OP_ACTIVATION};
  a.hf.vocab_size = 30522;
  a.hf.hidden_size = 768;
  a.hf.num_hidden_layers = 12;
  a.hf.num_attention_heads = 12;
  a.hf.intermediate_size = 3072;
  a.hf.max_position_embeddings = 512;
  a.hf.rms_norm_eps = 1e-12f;
  a.hf.hidden_act = "gelu";
  a.layer = bert_layer_tensors();
  a.layer_forward = bert_layer;
  return a;
}

}  // namespace

ArchInfo bert() {
  ArchInfo a = encoder_entry(Arch::Bert, "bert", {{"BertModel"}, {"BertForSequenceClassification"}}, "bert.");
  a.globals = bert_globals();
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-bert", 512, 256, 2, 4, 4, 64, 512, 128, 10000.f, 1e-12f, false, 0, 0, 0, 0, 0, tiny_extras},
      {"tiny-bert-reranker", 512, 64, 2, 4, 4, 16, 128, 128, 10000.f, 1e-12f, false, 0, 0, 0, 0, 0,
       tiny_reranker_extras},
      // bge-small-en-v1.5 / all-MiniLM-L12's shape (384 wide, 12 layers).
      {"bge-small", 30522, 384, 12, 12, 12, 32, 1536, 512, 10000.f, 1e-12f, false, 0, 0, 0, 0, 0, tiny_extras},
  };
  return a;
}

ArchInfo xlm_roberta() {
  ArchInfo a = encoder_entry(Arch::XlmRoberta, "xlm-roberta",
                             {{"XLMRobertaModel"}, {"XLMRobertaForSequenceClassification"}, {"RobertaModel"},
                              {"RobertaForSequenceClassification"}},
                             "roberta.");
  a.gguf_shared = true;  // llama.cpp writes these files as "bert"
  a.globals = roberta_globals();
  a.read_hf = read_hf_roberta;
  a.write_hf = write_hf_roberta;
  // bge-m3's layout at a test's size: 250002 pieces, 8194 positions in the
  // real model; here a vocabulary the tests' Unigram tokenizer fits in.
  a.dummy_shapes = {
      {"tiny-xlm-roberta", 512, 256, 2, 4, 4, 64, 512, 128, 10000.f, 1e-5f, false, 0, 0, 0, 0, 0, tiny_roberta_extras},
      {"tiny-xlm-roberta-cls", 512, 256, 2, 4, 4, 64, 512, 128, 10000.f, 1e-5f, false, 0, 0, 0, 0, 0,
       tiny_roberta_cls_extras},
  };
  return a;
}

}  // namespace pagellm::family
