// Score heads: the head's arithmetic against a scalar reference on random
// weights and inputs (dense layers with bias and activation, sigmoid and
// softmax), and where a head comes from: a GGUF with llama.cpp's rank
// pooling (cls.output rows, the rerank template), a folder with vLLM's
// --hf-overrides (lm_head rows of classifier_from_token), and the models
// that have none.
#include "engine/score_head.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <unordered_map>

#include "backend/backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "model/hf_writer.h"
#include "model/tensor_source.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.1f, 0.8f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

DenseLayer random_layer(int32_t in, int32_t out, bool bias, HeadActivation act, std::mt19937& rng) {
  DenseLayer l;
  l.in = in;
  l.out = out;
  l.weight = random_values(static_cast<size_t>(in) * out, rng);
  if (bias) l.bias = random_values(static_cast<size_t>(out), rng);
  l.activation = act;
  return l;
}

// The head written out plainly, in double.
std::vector<double> head_ref(const ScoreHead& h, const std::vector<float>& x0) {
  std::vector<double> x(x0.begin(), x0.end());
  for (const DenseLayer& l : h.layers) {
    std::vector<double> y(l.out);
    for (int o = 0; o < l.out; ++o) {
      double s = l.bias.empty() ? 0 : l.bias[o];
      for (int i = 0; i < l.in; ++i) s += double(l.weight[o * l.in + i]) * x[i];
      if (l.activation == HeadActivation::Tanh) s = std::tanh(s);
      if (l.activation == HeadActivation::Relu) s = s > 0 ? s : 0;
      if (l.activation == HeadActivation::Gelu) s = s * 0.5 * std::erfc(-s / std::sqrt(2.0));
      y[o] = s;
    }
    x = y;
  }
  if (h.output == HeadOutput::Identity) return x;
  if (h.output == HeadOutput::Sigmoid) {
    for (double& v : x) v = 1 / (1 + std::exp(-v));
  } else {
    double z = 0;
    for (double v : x) z += std::exp(v);
    for (double& v : x) v = std::exp(v) / z;
  }
  return x;
}

TEST(ScoreHead, MatchesScalarReference) {
  std::mt19937 rng(7);
  for (HeadOutput output : {HeadOutput::Sigmoid, HeadOutput::Softmax, HeadOutput::Identity})
    for (HeadActivation act : {HeadActivation::Tanh, HeadActivation::Gelu, HeadActivation::Relu}) {
      ScoreHead h;
      h.layers.push_back(random_layer(48, 24, true, act, rng));
      h.layers.push_back(random_layer(24, output == HeadOutput::Softmax ? 3 : 1, output == HeadOutput::Sigmoid,
                                      HeadActivation::None, rng));
      h.output = output;
      for (int trial = 0; trial < 4; ++trial) {
        const std::vector<float> x = random_values(48, rng);
        const std::vector<float> got = h.probabilities(x);
        const std::vector<double> want = head_ref(h, x);
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-6) << k;
        EXPECT_FLOAT_EQ(h.score(x), got[0]);
      }
    }
}

// llama.cpp's two labels (yes, no) under a softmax are vLLM's one row
// (yes - no) under a sigmoid: P(yes) = sigmoid(logit_yes - logit_no).
TEST(ScoreHead, SoftmaxOfYesNoIsSigmoidOfTheDifference) {
  std::mt19937 rng(11);
  ScoreHead two, one;
  two.layers.push_back(random_layer(32, 2, false, HeadActivation::None, rng));
  two.output = HeadOutput::Softmax;
  DenseLayer diff = two.layers[0];
  diff.out = 1;
  diff.weight.resize(32);
  for (int i = 0; i < 32; ++i) diff.weight[i] = two.layers[0].weight[i] - two.layers[0].weight[32 + i];
  one.layers.push_back(diff);
  for (int trial = 0; trial < 8; ++trial) {
    const std::vector<float> x = random_values(32, rng);
    EXPECT_NEAR(two.score(x), one.score(x), 1e-6);
  }
}

TEST(ScoreHead, WrongInputSizeThrows) {
  std::mt19937 rng(3);
  ScoreHead h;
  h.layers.push_back(random_layer(8, 1, false, HeadActivation::None, rng));
  EXPECT_THROW(h.probabilities(std::vector<float>(7, 1.f)), Error);
  h.layers.push_back(random_layer(3, 1, false, HeadActivation::None, rng));  // 1 output into a layer of 3 inputs
  EXPECT_THROW(h.probabilities(std::vector<float>(8, 1.f)), Error);
}

fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(test::temp_dir()) / "score_head_test" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class MapSource : public TensorSource {
 public:
  const TensorData* find(const std::string& name) const override {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  }
  size_t count() const override { return tensors.size(); }
  std::unordered_map<std::string, TensorData> tensors;
};

class ScoreModelSource : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
  }
  std::unique_ptr<Tokenizer> tok_;
  MapSource none_;
};

TEST_F(ScoreModelSource, GgufRankHead) {
  const fs::path dir = scratch("gguf");
  std::mt19937 rng(5);
  const std::vector<float> rows = random_values(2 * 16, rng);  // yes, no
  auto write = [&](uint32_t pooling, bool with_template) {
    GGUFWriter w;
    w.set_string("general.architecture", "qwen3");
    w.set_u32("qwen3.pooling_type", pooling);
    if (with_template) w.set_string("tokenizer.chat_template.rerank", "<q>{query}</q><d>{document}</d>");
    w.add_tensor("cls.output.weight", DType::F32, {16, 2}, bytes_of(rows));
    const std::string path = (dir / "m.gguf").string();
    w.write(path);
    return GGUFFile::open(path);
  };
  std::string why;
  auto f = write(4, true);
  auto m = find_score_model("m.gguf", f.get(), none_, *tok_, json::object(), "auto", why);
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->head.layers.size(), 1u);
  EXPECT_EQ(m->head.input_size(), 16);
  EXPECT_EQ(m->head.num_labels(), 2);
  EXPECT_EQ(m->head.output, HeadOutput::Softmax);
  EXPECT_EQ(m->head.layers[0].weight, rows);
  EXPECT_EQ(m->format.template_text, "<q>{query}</q><d>{document}</d>");
  // raw: the client formats
  m = find_score_model("m.gguf", f.get(), none_, *tok_, json::object(), "raw", why);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->format.template_text.empty());
  // no template in the file: raw
  f = write(4, false);
  m = find_score_model("m.gguf", f.get(), none_, *tok_, json::object(), "auto", why);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->format.template_text.empty());
  m = find_score_model("m.gguf", f.get(), none_, *tok_, json::object(), "qwen3-reranker", why);
  EXPECT_EQ(m->format.template_text, qwen3_reranker_template());
  EXPECT_EQ(m->head.output, HeadOutput::Softmax);
  EXPECT_EQ(m->pooling, PoolingType::Last);  // a causal model's last token
  // An encoder reranker (llama.cpp's BERT GGUFs): the pooler's dense layer
  // with tanh, then one label; the first token, or the mean.
  {
    GGUFWriter w;
    w.set_string("general.architecture", "bert");
    w.set_u32("bert.pooling_type", 4);
    w.set_bool("bert.attention.causal", false);
    w.add_tensor("cls.weight", DType::F32, {16, 16}, bytes_of(random_values(16 * 16, rng)));
    w.add_tensor("cls.bias", DType::F32, {16}, bytes_of(random_values(16, rng)));
    w.add_tensor("cls.output.weight", DType::F32, {16, 1}, bytes_of(random_values(16, rng)));
    const std::string path = (dir / "bert.gguf").string();
    w.write(path);
    auto b = GGUFFile::open(path);
    m = find_score_model("bert.gguf", b.get(), none_, *tok_, json::object(), "auto", why);
    ASSERT_TRUE(m.has_value());
    ASSERT_EQ(m->head.layers.size(), 2u);
    EXPECT_EQ(m->head.layers[0].activation, HeadActivation::Tanh);
    EXPECT_EQ(m->head.layers[0].bias.size(), 16u);
    EXPECT_EQ(m->head.output, HeadOutput::Sigmoid);
    EXPECT_EQ(m->pooling, PoolingType::Cls);
    w.set_u32("bert.classifier.pooling_type", 1);
    w.write(path);
    b = GGUFFile::open(path);
    EXPECT_EQ(find_score_model("bert.gguf", b.get(), none_, *tok_, json::object(), "auto", why)->pooling,
              PoolingType::Mean);
  }
  // A converted BertForSequenceClassification: no rank pooling, its labels
  // instead; a file without the pooler (llama.cpp b11434 drops it) is refused.
  for (bool pooler : {true, false}) {
    GGUFWriter w;
    w.set_string("general.architecture", "bert");
    w.set_bool("bert.attention.causal", false);
    w.set_string_array("bert.classifier.output_labels", {"LABEL_0"});
    if (pooler) w.add_tensor("cls.weight", DType::F32, {16, 16}, bytes_of(random_values(16 * 16, rng)));
    w.add_tensor("cls.output.weight", DType::F32, {16, 1}, bytes_of(random_values(16, rng)));
    const std::string path = (dir / "bert-cls.gguf").string();
    w.write(path);
    auto b = GGUFFile::open(path);
    if (!pooler) {
      try {
        find_score_model("bert-cls.gguf", b.get(), none_, *tok_, json::object(), "auto", why);
        ADD_FAILURE() << "a classifier without its pooler was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("pooler"), std::string::npos) << e.what();
      }
      continue;
    }
    m = find_score_model("bert-cls.gguf", b.get(), none_, *tok_, json::object(), "auto", why);
    ASSERT_TRUE(m.has_value()) << why;
    EXPECT_EQ(m->head.layers.size(), 2u);
    EXPECT_EQ(m->pooling, PoolingType::Cls);
  }
  // last pooling (an embedder): no head, and why
  f = write(3, false);
  EXPECT_FALSE(find_score_model("m.gguf", f.get(), none_, *tok_, json::object(), "auto", why).has_value());
  EXPECT_NE(why.find("rank"), std::string::npos) << why;
  // overrides belong to folders
  EXPECT_THROW(find_score_model("m.gguf", f.get(), none_, *tok_, json{{"architectures", {"X"}}}, "auto", why), Error);
}

TEST_F(ScoreModelSource, HfOverridesTakeLmHeadRows) {
  const fs::path dir = scratch("hf");
  std::ofstream(dir / "config.json") << json{{"architectures", {"Qwen3ForCausalLM"}}}.dump();
  const int32_t n_embd = 8, n_vocab = tok_->vocab_size();
  std::mt19937 rng(9);
  const std::vector<float> table = random_values(static_cast<size_t>(n_vocab) * n_embd, rng);
  MapSource src;
  src.tensors["token_embd.weight"] = TensorData{"token_embd.weight", DType::F32, {n_embd, n_vocab}, table.data()};
  // Two tokens of the vocabulary stand for "no" and "yes".
  const std::string no = tok_->token_text(100), yes = tok_->token_text(200);
  const auto no_id = *tok_->find_token(no), yes_id = *tok_->find_token(yes);
  const json overrides = {{"architectures", {"Qwen3ForSequenceClassification"}},
                          {"classifier_from_token", {no, yes}},
                          {"is_original_qwen3_reranker", true}};
  std::string why;
  auto m = find_score_model(dir.string(), nullptr, src, *tok_, overrides, "auto", why);
  ASSERT_TRUE(m.has_value()) << why;
  ASSERT_EQ(m->head.num_labels(), 1);
  EXPECT_EQ(m->head.output, HeadOutput::Sigmoid);
  for (int i = 0; i < n_embd; ++i)
    EXPECT_FLOAT_EQ(m->head.layers[0].weight[i], table[yes_id * n_embd + i] - table[no_id * n_embd + i]);
  EXPECT_EQ(m->format.template_text, qwen3_reranker_template());
  // an untied lm_head is preferred to the embedding
  const std::vector<float> lm_head = random_values(table.size(), rng);
  src.tensors["output.weight"] = TensorData{"output.weight", DType::F32, {n_embd, n_vocab}, lm_head.data()};
  m = find_score_model(dir.string(), nullptr, src, *tok_, overrides, "raw", why);
  EXPECT_FLOAT_EQ(m->head.layers[0].weight[0], lm_head[yes_id * n_embd] - lm_head[no_id * n_embd]);
  EXPECT_TRUE(m->format.template_text.empty());
  // without overrides: a causal LM has no head
  EXPECT_FALSE(find_score_model(dir.string(), nullptr, src, *tok_, json::object(), "auto", why).has_value());
  EXPECT_NE(why.find("--hf-overrides"), std::string::npos) << why;
  // what cannot be served is refused by name
  EXPECT_THROW(find_score_model(dir.string(), nullptr, src, *tok_, json{{"num_labels", 3}}, "auto", why), Error);
  json wrong_type = overrides;
  wrong_type["is_original_qwen3_reranker"] = "yes";
  EXPECT_THROW(find_score_model(dir.string(), nullptr, src, *tok_, wrong_type, "auto", why), Error);
  wrong_type = overrides;
  wrong_type["architectures"] = "Qwen3ForSequenceClassification";  // not a list: no classifier named
  EXPECT_FALSE(find_score_model(dir.string(), nullptr, src, *tok_, wrong_type, "auto", why).has_value());
  json unknown = overrides;
  unknown["classifier_from_token"] = {"no-such-token-text", yes};
  EXPECT_THROW(find_score_model(dir.string(), nullptr, src, *tok_, unknown, "auto", why), Error);
  EXPECT_THROW(find_score_model(dir.string(), nullptr, src, *tok_, overrides, "/no/such/template", why), Error);
}

// BertForSequenceClassification's folder: the pooler (tanh) and the
// classifier as the model's tensor source names them; sigmoid, or the raw
// logit where the config names Identity as the cross-encoder's activation.
TEST_F(ScoreModelSource, HfBertCrossEncoder) {
  const fs::path dir = scratch("bert-hf");
  const int32_t d = 8;
  std::mt19937 rng(11);
  const std::vector<float> pw = random_values(d * d, rng), pb = random_values(d, rng), cw = random_values(d, rng),
                           cb = random_values(1, rng);
  MapSource src;
  src.tensors["cls.weight"] = TensorData{"cls.weight", DType::F32, {d, d}, pw.data()};
  src.tensors["cls.bias"] = TensorData{"cls.bias", DType::F32, {d}, pb.data()};
  src.tensors["cls.output.weight"] = TensorData{"cls.output.weight", DType::F32, {d, 1}, cw.data()};
  src.tensors["cls.output.bias"] = TensorData{"cls.output.bias", DType::F32, {1}, cb.data()};
  json cfg = {{"architectures", {"BertForSequenceClassification"}}};
  std::ofstream(dir / "config.json") << cfg.dump();
  std::string why;
  auto m = find_score_model(dir.string(), nullptr, src, *tok_, json::object(), "auto", why);
  ASSERT_TRUE(m.has_value()) << why;
  ASSERT_EQ(m->head.layers.size(), 2u);
  EXPECT_EQ(m->head.layers[0].activation, HeadActivation::Tanh);
  EXPECT_EQ(m->head.layers[0].weight, pw);
  EXPECT_EQ(m->head.layers[1].bias, cb);
  EXPECT_EQ(m->head.output, HeadOutput::Sigmoid);
  EXPECT_EQ(m->pooling, PoolingType::Cls);
  const std::vector<float> x = random_values(d, rng);
  ScoreHead raw = m->head;
  raw.output = HeadOutput::Identity;
  const double logit = head_ref(raw, x)[0];
  EXPECT_NEAR(m->head.score(x), 1.0 / (1.0 + std::exp(-logit)), 1e-6);
  cfg["sbert_ce_default_activation_function"] = "torch.nn.modules.linear.Identity";  // ms-marco-MiniLM's
  std::ofstream(dir / "config.json") << cfg.dump();
  m = find_score_model(dir.string(), nullptr, src, *tok_, json::object(), "auto", why);
  EXPECT_EQ(m->head.output, HeadOutput::Identity);
  EXPECT_NEAR(m->head.score(x), logit, 1e-5);
  // a classifier without the pooler: refused by name
  src.tensors.erase("cls.weight");
  EXPECT_THROW(find_score_model(dir.string(), nullptr, src, *tok_, json::object(), "auto", why), Error);
}

// Score requests through the engine: chunked prefill (chunks of 16), the
// pairs alone and all at once beside a generation request.
TEST(ScoreEngine, ConvertedRerankerMatchesTransformers) {
  const std::string gguf = test::fixture("hf/rerank-tiny-qwen3.gguf");
  REQUIRE_FILE(gguf);
  std::ifstream in(test::fixture("hf/rerank-tiny-qwen3.json"));
  const json meta = json::parse(in);
  const auto tokens = meta["token_ids"].get<std::vector<std::vector<int32_t>>>();
  const auto want = meta["scores"].get<std::vector<double>>();
  EngineConfig c;
  c.model = gguf;
  c.task = ServeTask::Pooling;  // --runner pooling: a rank GGUF is a score model
  c.backend_options["threads"] = "2";
  c.kv_cache_dtype = DType::F32;
  c.scheduler.max_model_len = 256;
  c.scheduler.max_num_batched_tokens = 16;
  Engine engine(c);
  ASSERT_EQ(engine.task(), ServeTask::Score) << engine.score_error();
  auto score_request = [](const std::string& id, const std::vector<int32_t>& ids) {
    EngineRequest r;
    r.id = id;
    r.prompt_ids = ids;
    r.score = true;
    return r;
  };
  auto run = [&](std::vector<EngineRequest> reqs) {
    for (auto& r : reqs) engine.add_request(std::move(r));
    std::map<std::string, float> out;
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step()) {
        EXPECT_TRUE(o.error.empty()) << o.error;
        if (o.finished && o.request_id != "gen") {
          EXPECT_EQ(o.embedding.size(), 2u);  // P(yes), P(no)
          out[o.request_id] = o.score;
        }
      }
    return out;
  };
  std::vector<float> alone;
  for (size_t i = 0; i < tokens.size(); ++i) {
    alone.push_back(run({score_request("s", tokens[i])}).at("s"));
    EXPECT_NEAR(alone[i], want[i], 1e-5) << i;
  }
  EngineRequest gen;
  gen.id = "gen";
  gen.prompt_ids = tokens[0];
  gen.params.max_tokens = 4;
  std::vector<EngineRequest> all = {gen};
  for (size_t i = 0; i < tokens.size(); ++i) all.push_back(score_request("s" + std::to_string(i), tokens[i]));
  const auto batched = run(std::move(all));
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_NEAR(batched.at("s" + std::to_string(i)), alone[i], 1e-6) << i;
  // what a score request cannot be
  EngineRequest two = score_request("x", tokens[0]);
  two.params.n = 2;
  EXPECT_THROW(engine.add_request(two), InvalidRequest);
}

// An XLM-RoBERTa cross-encoder (tiny XLMRobertaForSequenceClassification,
// bge-reranker-v2-m3's layout) from its HF folder: the fixture's Unigram
// tokenizer gives transformers' pairs (<s> q </s></s> d </s>), and the scores
// (classifier.dense, tanh, out_proj on <s>, then a sigmoid) are
// sentence-transformers' CrossEncoder's (tools/gen_cross_encoder_fixtures.py).
TEST(ScoreEngine, XlmRobertaCrossEncoderMatchesCrossEncoder) {
  const std::string fixture = test::fixture("hf/rerank-tiny-xlm-roberta.json");
  REQUIRE_FILE(fixture);
  std::ifstream in(fixture);
  const json meta = json::parse(in);
  const fs::path dir = scratch("xlmr-cls");
  {
    ThreadPool pool(2);
    write_dummy_hf(dir.string(), DummySpec{meta["shape"], DType::F32, meta["seed"].get<uint64_t>()}, 1, pool);
  }
  for (const auto& [name, text] : meta["files"].items()) std::ofstream(dir / name) << text.get<std::string>();
  EngineConfig c;
  c.model = dir.string();
  c.task = ServeTask::Pooling;
  c.backend_options["threads"] = "2";
  c.kv_cache_dtype = DType::F32;
  c.scheduler.max_model_len = 128;
  Engine engine(c);
  ASSERT_EQ(engine.task(), ServeTask::Score) << engine.score_error();
  const auto want = meta["scores"].get<std::vector<double>>();
  const auto want_ids = meta["token_ids"].get<std::vector<std::vector<int32_t>>>();
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& pair = meta["pairs"][i];
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt_ids = engine.score_model()->format.tokens(engine.tokenizer(), pair[0], pair[1]);
    EXPECT_EQ(r.prompt_ids, want_ids[i]) << i;
    r.score = true;
    reqs.push_back(std::move(r));
  }
  for (auto& r : reqs) engine.add_request(std::move(r));
  std::map<std::string, float> got;
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished) got[o.request_id] = o.score;
    }
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.at(std::to_string(i)), want[i], 1e-5) << i;
    std::printf("[ score ] tiny-xlm-roberta-cls pair %zu: %.7f, CrossEncoder %.7f\n", i, got.at(std::to_string(i)),
                want[i]);
  }
}

TEST(ScoreEngine, ModelWithoutHeadRefusesScores) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  EngineConfig c;
  c.model = path;
  c.task = ServeTask::Pooling;
  c.backend_options["threads"] = "2";
  c.scheduler.max_model_len = 256;
  Engine engine(c);
  EXPECT_EQ(engine.task(), ServeTask::Embed);
  EXPECT_EQ(engine.score_model(), nullptr);
  EngineRequest r;
  r.id = "s";
  r.prompt_ids = {1, 2, 3};
  r.score = true;
  try {
    engine.add_request(r);
    ADD_FAILURE() << "a score request was accepted";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "model");
    EXPECT_NE(std::string(e.what()).find("score head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagellm
