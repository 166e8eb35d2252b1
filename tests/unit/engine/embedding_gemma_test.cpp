// EmbeddingGemma (Gemma3TextModel with use_bidirectional_attention): the
// config's flag and window, sentence-transformers' Dense modules after the
// pooling, and the tiny random model's vectors against sentence-transformers'
// (tests/fixtures/hf/embed-tiny-embeddinggemma-f32-mean.json) from the HF
// folder and from llama.cpp's converter's GGUF of it
// (tests/fixtures/models/converted-tiny-embeddinggemma.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/pooling.h"
#include "format/gguf.h"
#include "model/model_test_util.h"
#include "model/dummy.h"
#include "model/hf_writer.h"
#include "model/model_config.h"
#include "test_paths.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(test::temp_dir()) / "embedding_gemma_test" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// tools/gen_embedding_fixtures.py's dense_weight: [out, in] from an integer hash.
std::vector<float> dense_weight(int n_in, int n_out, int salt) {
  std::vector<float> w(static_cast<size_t>(n_in) * n_out);
  for (int o = 0; o < n_out; ++o)
    for (int i = 0; i < n_in; ++i)
      w[static_cast<size_t>(o) * n_in + i] =
          static_cast<float>(std::sin(1.7 * ((o * 131 + i * 71 + salt * 17) % 997)) / std::sqrt(double(n_in)));
  return w;
}

// A one-tensor safetensors file (F32).
void write_safetensors(const fs::path& path, const std::string& name, const std::vector<int64_t>& shape,
                       const std::vector<float>& data) {
  const json header = {{name, {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, data.size() * 4}}}}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
}

struct DenseFile {
  std::string path;
  int in, out, salt;
};

// modules.json: Transformer, mean Pooling, the Dense modules, Normalize (as
// the fixture script writes them).
void write_st_files(const fs::path& dir, const std::vector<DenseFile>& dense, bool normalize = true,
                    const std::string& activation = "torch.nn.modules.linear.Identity") {
  json modules = json::array({{{"idx", 0}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
                              {{"idx", 1}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
  fs::create_directories(dir / "1_Pooling");
  std::ofstream(dir / "1_Pooling" / "config.json") << json{{"pooling_mode_mean_tokens", true}}.dump();
  for (const DenseFile& d : dense) {
    modules.push_back({{"idx", modules.size()}, {"path", d.path}, {"type", "sentence_transformers.models.Dense"}});
    fs::create_directories(dir / d.path);
    std::ofstream(dir / d.path / "config.json")
        << json{{"in_features", d.in}, {"out_features", d.out}, {"bias", false}, {"activation_function", activation}}
               .dump();
    write_safetensors(dir / d.path / "model.safetensors", "linear.weight", {d.out, d.in},
                      dense_weight(d.in, d.out, d.salt));
  }
  if (normalize) {
    modules.push_back(
        {{"idx", modules.size()}, {"path", "9_Normalize"}, {"type", "sentence_transformers.models.Normalize"}});
    fs::create_directories(dir / "9_Normalize");
  }
  std::ofstream(dir / "modules.json") << modules.dump();
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The Dense modules are read as written, run in order after the pooling and
// before Normalize: W2 (W1 x), then x / |x|, against a plain reference.
TEST(EmbeddingGemmaPooling, DenseModulesAfterPoolingBeforeNormalize) {
  const fs::path dir = scratch("dense");
  write_st_files(dir, {{"2_Dense", 24, 40, 2}, {"3_Dense", 40, 16, 3}});
  const PoolingSpec spec = model_pooling(dir.string(), nullptr);
  EXPECT_EQ(spec.type, PoolingType::Mean);
  EXPECT_TRUE(spec.normalize);
  ASSERT_EQ(spec.dense.size(), 2u);
  EXPECT_EQ(spec.dense[0].in, 24);
  EXPECT_EQ(spec.dense[0].out, 40);
  EXPECT_EQ(spec.dense[0].activation, HeadActivation::None);
  EXPECT_TRUE(spec.dense[0].bias.empty());
  EXPECT_EQ(spec.dense[1].weight, dense_weight(40, 16, 3));
  EXPECT_EQ(spec.output_size(24), 16);

  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> x = randn(24, seed);
    const auto w1 = dense_weight(24, 40, 2), w2 = dense_weight(40, 16, 3);
    std::vector<double> h(40, 0.0), y(16, 0.0);
    for (int o = 0; o < 40; ++o)
      for (int i = 0; i < 24; ++i) h[o] += double(w1[o * 24 + i]) * x[i];
    double norm = 0;
    for (int o = 0; o < 16; ++o) {
      for (int i = 0; i < 40; ++i) y[o] += double(w2[o * 40 + i]) * h[i];
      norm += y[o] * y[o];
    }
    const std::vector<float> got = finish_embedding(spec, x);
    ASSERT_EQ(got.size(), 16u);
    for (int o = 0; o < 16; ++o) EXPECT_NEAR(got[o], y[o] / std::sqrt(norm), 1e-6) << o;
    PoolingSpec raw = spec;
    raw.normalize = false;
    const std::vector<float> unnormalised = finish_embedding(raw, x);
    for (int o = 0; o < 16; ++o) EXPECT_NEAR(unnormalised[o], y[o], 1e-5 * std::max(1.0, std::fabs(y[o]))) << o;
  }
  // A vector of the wrong size is an Error, not a read past the weights.
  EXPECT_THROW(finish_embedding(spec, std::vector<float>(23, 1.0f)), Error);
}

TEST(EmbeddingGemmaPooling, BadDenseModulesAreErrors) {
  const fs::path dir = scratch("bad-dense");
  write_st_files(dir, {{"2_Dense", 8, 4, 2}}, true, "torch.nn.modules.activation.GELU");
  EXPECT_THROW(model_pooling(dir.string(), nullptr), Error);
  write_st_files(dir, {{"2_Dense", 8, 4, 2}}, true, "torch.nn.modules.activation.Tanh");
  EXPECT_EQ(model_pooling(dir.string(), nullptr).dense.at(0).activation, HeadActivation::Tanh);
  // The weights' shape must be the config's.
  write_st_files(dir, {{"2_Dense", 8, 4, 2}});
  std::ofstream(dir / "2_Dense" / "config.json") << json{{"in_features", 8}, {"out_features", 5}}.dump();
  try {
    model_pooling(dir.string(), nullptr);
    ADD_FAILURE() << "a Dense module of the wrong shape was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear.weight"), std::string::npos) << e.what();
  }
  fs::remove(dir / "2_Dense" / "model.safetensors");
  EXPECT_THROW(model_pooling(dir.string(), nullptr), Error);
  // Layers that do not chain: an Error at load, not at the first request.
  write_st_files(dir, {{"2_Dense", 8, 4, 2}, {"3_Dense", 5, 3, 3}});
  try {
    model_pooling(dir.string(), nullptr);
    ADD_FAILURE() << "dense layers that do not chain were read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes 5 values"), std::string::npos) << e.what();
  }
}

ModelConfig config_of(const json& j, const fs::path& dir) {
  const fs::path path = dir / "variant.json";
  std::ofstream(path) << j.dump();
  return config_from_hf_json(path.string());
}

// config.json: the flag makes the model bidirectional, its window W becomes a
// symmetric one of |p - j| <= W / 2 (transformers: W // 2 + 1, exclusive);
// the writer writes the flag and W back.
TEST(EmbeddingGemmaConfig, BidirectionalFlagAndWindow) {
  ThreadPool pool(2);
  const fs::path dir = scratch("config");
  write_dummy_hf(dir.string(), DummySpec{"tiny-embeddinggemma", DType::F32, 1}, 1, pool);
  std::ifstream in(dir / "config.json");
  json j = json::parse(in);
  EXPECT_EQ(j["architectures"][0], "Gemma3TextModel");
  EXPECT_EQ(j["use_bidirectional_attention"], true);
  EXPECT_EQ(j["sliding_window"], 8);
  ModelConfig c = config_of(j, dir);
  EXPECT_TRUE(c.non_causal);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.attention_window(), 5);
  for (int w : {1, 2, 7, 9, 512}) {
    c.sliding_window = w;
    EXPECT_EQ(c.attention_window(), w / 2 + 1) << w;
  }
  json causal = j;
  causal.erase("use_bidirectional_attention");
  EXPECT_THROW(config_of(causal, dir), Error);
  json lm = j;
  lm["architectures"] = {"Gemma3ForCausalLM"};
  EXPECT_THROW(config_of(lm, dir), Error);
  lm.erase("use_bidirectional_attention");
  const ModelConfig gemma3 = config_of(lm, dir);
  EXPECT_FALSE(gemma3.non_causal);
  EXPECT_EQ(gemma3.attention_window(), 8);
}

EngineRequest embed_request(const std::string& id, std::vector<int32_t> ids) {
  EngineRequest r;
  r.id = id;
  r.prompt_ids = std::move(ids);
  r.embed = true;
  return r;
}

std::map<std::string, std::vector<float>> run(Engine& engine, std::vector<EngineRequest> reqs) {
  for (auto& r : reqs) engine.add_request(std::move(r));
  std::map<std::string, std::vector<float>> out;
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished) out[o.request_id] = o.embedding;
    }
    engine.check_invariants();
  }
  return out;
}

double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += double(a[i]) * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

const char* kFixture = "embed-tiny-embeddinggemma-f32-mean";

EngineConfig engine_config(const std::string& model, const std::string& tokenizer) {
  EngineConfig c;
  c.model = model;
  c.tokenizer = tokenizer;
  c.backend_options["threads"] = "2";
  c.kv_cache_dtype = DType::F32;
  c.scheduler.max_model_len = 128;
  c.scheduler.max_num_batched_tokens = 48;
  return c;
}

// Every input alone, then all in one batch: sentence-transformers' vectors
// (inputs of 1 and 5 tokens fit the window of 8; 23 and 40 do not).
void check_vectors(Engine& engine, const json& meta, const std::string& what) {
  const auto tokens = meta["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto want = meta["embeddings"].get<std::vector<std::vector<double>>>();
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string id = "a" + std::to_string(i);
    alone.push_back(run(engine, {embed_request(id, tokens[i])}).at(id));
    ASSERT_EQ(alone.back().size(), want[i].size());
    const double cos = cosine(alone.back(), want[i]);
    EXPECT_GE(cos, 0.9999) << what << " input " << i;
    std::printf("[ embed ] %s input %zu (%zu tokens): cosine %.8f\n", what.c_str(), i, tokens[i].size(), cos);
  }
  std::vector<EngineRequest> batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.push_back(embed_request("b" + std::to_string(i), tokens[i]));
  const auto out = run(engine, std::move(batch));
  for (size_t i = 0; i < tokens.size(); ++i)
    for (size_t k = 0; k < alone[i].size(); ++k)
      EXPECT_NEAR(out.at("b" + std::to_string(i))[k], alone[i][k], 1e-5) << "input " << i << " k " << k;
}

std::vector<DenseFile> fixture_dense(const json& meta) {
  std::vector<DenseFile> d;
  for (const auto& m : meta["dense"])
    d.push_back({m[0].get<std::string>(), m[1].get<int>(), m[2].get<int>(), m[3].get<int>()});
  return d;
}

std::string synthetic_vocab(const fs::path& dir) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  add_synthetic_vocab(w, 512);
  const std::string vocab = (dir / "vocab.gguf").string();
  w.write(vocab);
  return vocab;
}

// F32 and BF16 weights (BF16: float activations, as torch upcasts them).
class EmbeddingGemmaHf : public ::testing::TestWithParam<DType> {};

TEST_P(EmbeddingGemmaHf, FolderMatchesSentenceTransformers) {
  const bool bf16 = GetParam() == DType::BF16;
  const std::string name = std::string("hf/embed-tiny-embeddinggemma-") + (bf16 ? "bf16" : "f32") + "-mean.json";
  REQUIRE_FILE(test::fixture(name));
  std::ifstream in(test::fixture(name));
  const json meta = json::parse(in);
  EXPECT_EQ(meta["hf_sliding_window"], 5);  // transformers' own: 8 // 2 + 1
  ThreadPool pool(2);
  const fs::path dir = scratch(bf16 ? "hf-bf16" : "hf-f32");
  write_dummy_hf(dir.string(), DummySpec{"tiny-embeddinggemma", GetParam(), meta["seed"].get<uint64_t>()}, 1, pool);
  write_st_files(dir, fixture_dense(meta));
  EngineConfig config = engine_config(dir.string(), synthetic_vocab(dir));
  if (bf16) config.backend_options["exact_matmul"] = "1";
  Engine engine(config);
  EXPECT_TRUE(engine.model_config().non_causal);
  EXPECT_EQ(engine.pooling().type, PoolingType::Mean);
  EXPECT_EQ(engine.pooling().dense.size(), 2u);
  check_vectors(engine, meta, std::string("tiny-embeddinggemma HF folder ") + (bf16 ? "BF16" : "F32"));
}

INSTANTIATE_TEST_SUITE_P(Types, EmbeddingGemmaHf, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(info.param == DType::BF16 ? "bf16" : "f32"); });

// llama.cpp's converter (--sentence-transformers-dense-modules) on the same
// folder: gemma-embedding, its layer tensors those of pagellm's GGUF dummy,
// dense_2 / dense_3 the Dense modules' weights, pooling_type mean.
TEST(EmbeddingGemma, LlamaCppConvertedGgufMatchesSentenceTransformers) {
  const std::string conv = test::fixture("models/converted-tiny-embeddinggemma.json");
  REQUIRE_FILE(conv);
  REQUIRE_FILE(test::fixture(std::string("hf/") + kFixture + ".json"));
  std::ifstream cin(conv), fin(test::fixture(std::string("hf/") + kFixture + ".json"));
  const json meta = json::parse(cin), fixture = json::parse(fin);
  ThreadPool pool(2);
  const ModelConfig cfg = dummy_config("tiny-embeddinggemma", meta["n_vocab"].get<int>());
  auto src = make_dummy_source(cfg, DummySpec{"tiny-embeddinggemma", DType::F32, meta["seed"].get<uint64_t>()}, pool);
  std::map<std::string, std::vector<float>> dense;
  for (const DenseFile& d : fixture_dense(fixture))
    dense[d.path == "2_Dense" ? "dense_2.weight" : "dense_3.weight"] = dense_weight(d.in, d.out, d.salt);
  GGUFWriter w;
  size_t from_dummy = 0;
  for (const auto& t : meta["tensors"]) {
    const std::string name = t["name"].get<std::string>();
    const auto shape = t["shape"].get<std::vector<int64_t>>();
    std::vector<float> values;
    if (dense.count(name)) {
      values = dense[name];
    } else {
      const TensorData* d = src->find(name);
      ASSERT_TRUE(d) << name << " (the converter writes it; pagellm's GGUF has no such tensor)";
      ASSERT_EQ(d->type, DType::F32) << name;
      EXPECT_EQ(d->shape, shape) << name;
      const auto* v = static_cast<const float*>(d->data);
      values.assign(v, v + d->cols() * d->rows());
      ++from_dummy;
    }
    double sumsq = 0;
    for (float x : values) sumsq += double(x) * x;
    EXPECT_NEAR(sumsq, t["sumsq"].get<double>(), 1e-6 * t["sumsq"].get<double>() + 1e-9) << name;
    w.add_tensor(name, DType::F32, shape,
                 std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                      reinterpret_cast<const uint8_t*>(values.data() + values.size())));
  }
  EXPECT_EQ(dense.size(), 2u);
  EXPECT_EQ(from_dummy, src->count()) << "the same set of layer tensors";
  const std::string unset = test::set_converter_metadata(w, meta["metadata"]);
  ASSERT_TRUE(unset.empty()) << "metadata type not handled here: " << unset;
  EXPECT_EQ(meta["metadata"]["general.architecture"]["value"], "gemma-embedding");
  EXPECT_EQ(meta["metadata"]["gemma-embedding.attention.sliding_window"]["value"], 8);
  add_synthetic_vocab(w, meta["n_vocab"].get<int>());
  const fs::path dir = scratch("converted");
  const std::string path = (dir / "converted.gguf").string();
  w.write(path);
  Engine engine(engine_config(path, path));
  EXPECT_TRUE(engine.model_config().non_causal);
  EXPECT_EQ(engine.pooling().type, PoolingType::Mean);
  EXPECT_EQ(engine.pooling().dense.size(), 2u);
  check_vectors(engine, fixture, "converted tiny-embeddinggemma GGUF");
}

}  // namespace
}  // namespace pagellm
