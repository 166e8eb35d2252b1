// Pooling (embedding requests): the Pooler against a scalar reference on
// random hidden states, where a model's pooling comes from (sentence-
// transformers files), and the engine's embeddings of a tiny Qwen3 folder
// against sentence-transformers' (fixtures from tools/gen_embedding_fixtures.py):
// chunked prefill, batches, a concurrent generation request, and a
// prefix-cache hit that mean pooling must not take.
#include "engine/pooling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "model/model_test_util.h"
#include "model/dummy.h"
#include "model/hf_writer.h"
#include "model/model.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<float> random_rows(int32_t n, int32_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.5f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n) * d);
  for (float& x : v) x = dist(rng);
  return v;
}

// The pooled vector in double: mean / last / first row, then / ||.||.
std::vector<double> pool_ref(const std::vector<float>& rows, int32_t n, int32_t d, PoolingType type, bool normalize) {
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (int32_t k = 0; k < d; ++k) {
    if (type == PoolingType::Mean) {
      for (int32_t i = 0; i < n; ++i) out[k] += rows[static_cast<size_t>(i) * d + k];
      out[k] /= n;
    } else {
      out[k] = rows[static_cast<size_t>(type == PoolingType::Last ? n - 1 : 0) * d + k];
    }
  }
  if (normalize) {
    double ss = 0;
    for (double x : out) ss += x * x;
    for (double& x : out) x /= std::sqrt(ss);
  }
  return out;
}

TEST(Pooler, MatchesScalarReferenceOverChunks) {
  const int32_t d = 48;
  for (int32_t n : {1, 2, 17, 100}) {
    const auto rows = random_rows(n, d, 7 + n);
    for (PoolingType type : {PoolingType::Last, PoolingType::Mean, PoolingType::Cls}) {
      for (bool normalize : {false, true}) {
        for (int32_t chunk : {1, 7, n}) {
          Pooler p(type, d);
          // What the scheduler hands over per chunk (scheduler/step_decisions.cpp).
          for (int32_t start = 0; start < n; start += chunk) {
            const int32_t count = std::min(chunk, n - start);
            const bool last_chunk = start + count == n;
            if (type == PoolingType::Mean) p.add(rows.data() + static_cast<size_t>(start) * d, start, count);
            else if (type == PoolingType::Last && last_chunk)
              p.add(rows.data() + static_cast<size_t>(n - 1) * d, n - 1, 1);
            else if (type == PoolingType::Cls && (start == 0 || last_chunk))
              p.add(rows.data() + static_cast<size_t>(start) * d, start, 1);
          }
          const auto got = p.result(n, normalize);
          const auto want = pool_ref(rows, n, d, type, normalize);
          ASSERT_EQ(got.size(), want.size());
          for (int32_t k = 0; k < d; ++k)
            EXPECT_NEAR(got[k], want[k], 1e-6 * std::max(1.0, std::fabs(want[k])))
                << "n " << n << " type " << static_cast<int>(type) << " chunk " << chunk << " k " << k;
        }
      }
    }
  }
}

TEST(Pooler, RecomputeFromPositionZeroStartsOver) {
  const int32_t d = 8, n = 10;
  const auto rows = random_rows(n, d, 3);
  const auto other = random_rows(4, d, 4);
  Pooler p(PoolingType::Mean, d);
  p.add(other.data(), 0, 4);  // a preempted first attempt
  p.add(rows.data(), 0, n);
  const auto got = p.result(n, false);
  const auto want = pool_ref(rows, n, d, PoolingType::Mean, false);
  for (int32_t k = 0; k < d; ++k) EXPECT_NEAR(got[k], want[k], 1e-6);
  Pooler missing(PoolingType::Mean, d);
  missing.add(rows.data(), 0, 3);
  EXPECT_THROW(missing.result(n, false), Error);
}

TEST(Pooling, TruncateAndNormalize) {
  auto v = random_rows(1, 32, 9);
  const auto t = truncate_embedding(v, 5, true);
  ASSERT_EQ(t.size(), 5u);
  double ss = 0, ref_ss = 0;
  for (float x : t) ss += static_cast<double>(x) * x;
  EXPECT_NEAR(ss, 1.0, 1e-6);
  for (int k = 0; k < 5; ++k) ref_ss += static_cast<double>(v[k]) * v[k];
  for (int k = 0; k < 5; ++k) EXPECT_NEAR(t[k], v[k] / std::sqrt(ref_ss), 1e-6);
  EXPECT_EQ(truncate_embedding(v, 3, false), std::vector<float>(v.begin(), v.begin() + 3));
  EXPECT_THROW(truncate_embedding(v, 33, true), Error);
  EXPECT_THROW(truncate_embedding(v, 0, true), Error);
}

// What tools/gen_embedding_fixtures.py adds to the folder.
void write_st_files(const fs::path& dir, const std::string& mode_key, bool normalize, const std::string& extra = "") {
  json modules = json::array({{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
                              {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
  if (normalize)
    modules.push_back({{"idx", 2}, {"name", "2"}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}});
  if (!extra.empty()) modules.push_back({{"idx", 3}, {"name", "3"}, {"path", "3"}, {"type", extra}});
  std::ofstream(dir / "modules.json") << modules.dump();
  fs::create_directories(dir / "1_Pooling");
  json pooling = {{"word_embedding_dimension", 256}, {"pooling_mode_cls_token", false},
                  {"pooling_mode_mean_tokens", false}, {"pooling_mode_lasttoken", false}};
  pooling[mode_key] = true;
  std::ofstream(dir / "1_Pooling" / "config.json") << pooling.dump();
}

fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(test::temp_dir()) / "pooling_test" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(ModelPooling, ReadsSentenceTransformersFiles) {
  const fs::path dir = scratch("st");
  EXPECT_EQ(model_pooling(dir.string(), nullptr).type, PoolingType::Last);  // no files: vLLM's default
  write_st_files(dir, "pooling_mode_mean_tokens", false);
  PoolingSpec s = model_pooling(dir.string(), nullptr);
  EXPECT_EQ(s.type, PoolingType::Mean);
  EXPECT_FALSE(s.normalize);
  write_st_files(dir, "pooling_mode_cls_token", true);
  s = model_pooling(dir.string(), nullptr);
  EXPECT_EQ(s.type, PoolingType::Cls);
  EXPECT_TRUE(s.normalize);
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"pooling_mode": "lasttoken"})";
  EXPECT_EQ(model_pooling(dir.string(), nullptr).type, PoolingType::Last);
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"pooling_mode_max_tokens": true})";
  EXPECT_THROW(model_pooling(dir.string(), nullptr), Error);
  write_st_files(dir, "pooling_mode_lasttoken", true, "sentence_transformers.models.Dense");
  try {
    model_pooling(dir.string(), nullptr);
    ADD_FAILURE() << "a Dense module was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Dense"), std::string::npos) << e.what();
  }
}

// llama.cpp's <arch>.pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
TEST(ModelPooling, ReadsGgufPoolingType) {
  const fs::path dir = scratch("gguf");
  auto with_type = [&](std::optional<uint32_t> type) {
    GGUFWriter w;
    w.set_string("general.architecture", "qwen3");
    if (type) w.set_u32("qwen3.pooling_type", *type);
    const std::string path = (dir / "m.gguf").string();
    w.write(path);
    return GGUFFile::open(path);
  };
  const std::pair<uint32_t, PoolingType> known[] = {
      {1, PoolingType::Mean}, {2, PoolingType::Cls}, {3, PoolingType::Last}};
  for (auto [t, want] : known) {
    const auto f = with_type(t);
    const PoolingSpec s = model_pooling("m.gguf", f.get());
    EXPECT_EQ(s.type, want) << t;
    EXPECT_TRUE(s.normalize);
  }
  EXPECT_EQ(model_pooling("m.gguf", with_type(std::nullopt).get()).type, PoolingType::Last);
  EXPECT_EQ(model_pooling("m.gguf", with_type(0).get()).type, PoolingType::Last);
  // Rank: a reranker's scores (engine/score_head.h), not embeddings.
  try {
    model_pooling("m.gguf", with_type(4).get());
    ADD_FAILURE() << "rank pooling gave embeddings";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--task score"), std::string::npos) << e.what();
  }
}

// The tiny Qwen3 folder of the fixtures, with its sentence-transformers
// files, served by an engine with a synthetic vocabulary of its size.
struct Fixture {
  json meta;
  EngineConfig config;
};

Fixture load_fixture(const std::string& name, int32_t max_batched_tokens, bool prefix_caching = true) {
  Fixture f;
  const std::string path = test::fixture("hf/" + name + ".json");
  std::ifstream in(path);
  if (!in.good()) return f;
  f.meta = json::parse(in);
  const fs::path dir = scratch(name);
  ThreadPool pool(2);
  const std::string shape = f.meta["shape"], type = f.meta["type"], pooling = f.meta["pooling"];
  write_dummy_hf(dir.string(), DummySpec{shape, dtype_from_name(type), f.meta["seed"].get<uint64_t>()}, 1, pool);
  write_st_files(dir, pooling == "last" ? "pooling_mode_lasttoken" : pooling == "mean" ? "pooling_mode_mean_tokens"
                                                                                     : "pooling_mode_cls_token",
                 f.meta["normalize"].get<bool>());
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  add_synthetic_vocab(w, 512);
  const std::string vocab = (dir / "vocab.gguf").string();
  w.write(vocab);
  EngineConfig& c = f.config;
  c.model = dir.string();
  c.tokenizer = vocab;
  c.backend_options["threads"] = "2";
  if (type == "bf16") c.backend_options["exact_matmul"] = "1";  // float activations, as torch upcasts
  c.kv_cache_dtype = DType::F32;
  c.enable_prefix_caching = prefix_caching;
  c.scheduler.max_model_len = 256;
  c.scheduler.max_num_batched_tokens = max_batched_tokens;
  return f;
}

double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += static_cast<double>(a[i]) * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

// Runs the requests to the end; embeddings by request id (and, when asked,
// their prompt tokens found in the prefix cache).
std::map<std::string, std::vector<float>> run(Engine& engine, std::vector<EngineRequest> reqs,
                                              std::map<std::string, int32_t>* cached = nullptr) {
  for (auto& r : reqs) engine.add_request(std::move(r));
  std::map<std::string, std::vector<float>> out;
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished) out[o.request_id] = o.embedding;
      if (o.finished && cached) (*cached)[o.request_id] = o.num_cached_tokens;
    }
    engine.check_invariants();
  }
  return out;
}

EngineRequest embed_request(const std::string& id, std::vector<int32_t> ids) {
  EngineRequest r;
  r.id = id;
  r.prompt_ids = std::move(ids);
  r.embed = true;
  return r;
}

class EmbeddingsVsSentenceTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(EmbeddingsVsSentenceTransformers, AloneChunkedAndBatched) {
  const std::string name = GetParam();
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  // Chunks of 7 tokens: long inputs span several steps (mean pooling accumulates).
  Fixture f = load_fixture(name, 7);
  Engine engine(f.config);
  const auto tokens = f.meta["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto want = f.meta["embeddings"].get<std::vector<std::vector<double>>>();
  // Alone, one after another.
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto out = run(engine, {embed_request("a" + std::to_string(i), tokens[i])});
    alone.push_back(out.at("a" + std::to_string(i)));
    const double cos = cosine(alone.back(), want[i]);
    double gap = 0;
    for (size_t k = 0; k < want[i].size(); ++k) gap = std::max(gap, std::fabs(alone.back()[k] - want[i][k]));
    EXPECT_GE(cos, 0.9999) << name << " input " << i;
    std::printf("[ embed ] %s input %zu (%zu tokens): cosine %.8f, max abs gap %.2e\n", name.c_str(), i,
                tokens[i].size(), cos, gap);
  }
  // All at once, with a generation request in the same steps.
  std::vector<EngineRequest> batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.push_back(embed_request("b" + std::to_string(i), tokens[i]));
  EngineRequest gen;
  gen.id = "chat";
  gen.prompt_ids = tokens.back();
  gen.params.max_tokens = 8;
  gen.params.temperature = 0;
  batch.insert(batch.begin() + 1, gen);
  auto out = run(engine, std::move(batch));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& b = out.at("b" + std::to_string(i));
    ASSERT_EQ(b.size(), alone[i].size());
    double gap = 0;
    for (size_t k = 0; k < b.size(); ++k) {
      EXPECT_NEAR(b[k], alone[i][k], 1e-5) << "input " << i << " k " << k;
      gap = std::max(gap, static_cast<double>(std::fabs(b[k] - alone[i][k])));
    }
    std::printf("[ embed ] %s input %zu batched beside a generation request: max abs gap to alone %.2e\n",
                name.c_str(), i, gap);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EmbeddingsVsSentenceTransformers,
                         ::testing::Values("embed-tiny-qwen3-f32-last", "embed-tiny-qwen3-bf16-last",
                                           "embed-tiny-qwen3-f32-mean"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// A generation request leaves the input's blocks in the prefix cache; the
// mean-pooled embedding after it must still see every position.
TEST(EmbeddingsEngine, MeanPoolingTakesNoPrefixCacheHit) {
  const std::string name = "embed-tiny-qwen3-f32-mean";
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  Fixture f = load_fixture(name, 64);
  Engine engine(f.config);
  const auto tokens = f.meta["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto want = f.meta["embeddings"].get<std::vector<std::vector<double>>>();
  EngineRequest gen;
  gen.id = "gen";
  gen.prompt_ids = tokens.back();
  gen.params.max_tokens = 2;
  run(engine, {gen});
  std::map<std::string, int32_t> cached;
  const auto got = run(engine, {embed_request("e", tokens.back())}, &cached).at("e");
  EXPECT_GE(cosine(got, want.back()), 0.9999);
  EXPECT_EQ(cached.at("e"), 0);
  // Last-token pooling may take the hit: only the last position is needed.
  f.config.pooling = PoolingType::Last;
  Engine last(f.config);
  run(last, {gen});
  const auto hit = run(last, {embed_request("e", tokens.back())}, &cached);
  EXPECT_EQ(cached.at("e"), 32);  // two full blocks of 16 of the 40 tokens
  EXPECT_EQ(hit.at("e").size(), want.back().size());
}

TEST(EmbeddingsEngine, OverridesAndBadRequests) {
  const std::string name = "embed-tiny-qwen3-f32-last";
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  Fixture f = load_fixture(name, 64);
  f.config.pooling = PoolingType::Mean;
  f.config.pooling_normalize = false;
  Engine engine(f.config);
  EXPECT_EQ(engine.pooling().type, PoolingType::Mean);
  EXPECT_FALSE(engine.pooling().normalize);
  EngineRequest r = embed_request("x", {1, 2, 3});
  r.params.n = 2;
  EXPECT_THROW(engine.add_request(r), InvalidRequest);
  EXPECT_THROW(engine.add_request(embed_request("y", std::vector<int32_t>(256, 5))), InvalidRequest);
  EXPECT_THROW(engine.add_request(embed_request("z", {})), InvalidRequest);
}

// A model whose pooling is not served (here: a Dense module, as
// EmbeddingGemma ships) still generates; embedding requests get its reason.
TEST(EmbeddingsEngine, UnservedPoolingRefusesOnlyEmbeddings) {
  const std::string name = "embed-tiny-qwen3-f32-last";
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  Fixture f = load_fixture(name, 64);
  write_st_files(f.config.model, "pooling_mode_lasttoken", true, "sentence_transformers.models.Dense");
  Engine engine(f.config);
  EXPECT_NE(engine.pooling_error().find("Dense"), std::string::npos) << engine.pooling_error();
  try {
    engine.add_request(embed_request("e", {1, 2, 3}));
    ADD_FAILURE() << "an embedding request was accepted";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "model");
  }
  EngineRequest gen;
  gen.id = "gen";
  gen.prompt_ids = {1, 2, 3};
  gen.params.max_tokens = 2;
  run(engine, {gen});
}

// An encoder (tiny BertModel, and XLMRobertaModel with its positions past the
// padding row and its Unigram tokenizer), bidirectional attention: each input
// in one step, alone and batched, equals sentence-transformers' vector; a prompt
// already in the prefix cache is computed again; generation is refused (the
// model computes embeddings only), and an input longer than a step's token
// budget is refused rather than chunked.
class EncoderEmbeddingsVsSentenceTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(EncoderEmbeddingsVsSentenceTransformers, OneStepAloneBatchedNoPrefixCache) {
  const std::string name = GetParam();
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  Fixture f = load_fixture(name, 48);
  f.config.scheduler.max_model_len = 128;  // the tiny model's learned positions
  Engine engine(f.config);
  EXPECT_TRUE(engine.model_config().non_causal);
  const auto tokens = f.meta["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto want = f.meta["embeddings"].get<std::vector<std::vector<double>>>();
  std::map<std::string, int32_t> cached;
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string id = "a" + std::to_string(i);
    alone.push_back(run(engine, {embed_request(id, tokens[i])}, &cached).at(id));
    const double cos = cosine(alone.back(), want[i]);
    double gap = 0;
    for (size_t k = 0; k < want[i].size(); ++k) gap = std::max(gap, std::fabs(alone.back()[k] - want[i][k]));
    EXPECT_GE(cos, 0.9999) << name << " input " << i;
    std::printf("[ embed ] %s input %zu (%zu tokens): cosine %.8f, max abs gap %.2e\n", name.c_str(), i,
                tokens[i].size(), cos, gap);
  }
  std::vector<EngineRequest> batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.push_back(embed_request("b" + std::to_string(i), tokens[i]));
  const auto out = run(engine, std::move(batch), &cached);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& b = out.at("b" + std::to_string(i));
    ASSERT_EQ(b.size(), alone[i].size());
    for (size_t k = 0; k < b.size(); ++k) EXPECT_NEAR(b[k], alone[i][k], 1e-5) << "input " << i << " k " << k;
    EXPECT_EQ(cached.at("b" + std::to_string(i)), 0) << "input " << i;
  }
  // Unnormalised: transformers' last hidden state at position 0 (CLS) or its
  // mean over the positions, scale included.
  if (f.meta.contains("hidden_first")) {
    EngineConfig rc = f.config;
    rc.pooling_normalize = false;
    Engine raw(rc);
    const bool cls = f.meta["pooling"] == "cls";
    const auto hidden = f.meta[cls ? "hidden_first" : "hidden_mean"].get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string id = "r" + std::to_string(i);
      const auto v = run(raw, {embed_request(id, tokens[i])}).at(id);
      ASSERT_EQ(v.size(), hidden[i].size());
      double d2 = 0, n2 = 0;
      for (size_t k = 0; k < v.size(); ++k) d2 += (v[k] - hidden[i][k]) * (v[k] - hidden[i][k]), n2 += hidden[i][k] * hidden[i][k];
      const double rel = std::sqrt(d2 / n2);
      EXPECT_LT(rel, 1e-5) << name << " input " << i;
      std::printf("[ embed ] %s input %zu: unnormalised, relative L2 gap to transformers' hidden state %.2e\n",
                  name.c_str(), i, rel);
    }
  }
  // Text: the fixture's WordPiece tokenizer.json in the folder gives
  // transformers' ids ([CLS] ... [SEP]) and sentence-transformers' vectors.
  if (f.meta.contains("texts")) {
    std::ofstream(fs::path(f.config.model) / "tokenizer.json") << f.meta["tokenizer_json"].dump();
    EngineConfig tc = f.config;
    tc.tokenizer.clear();  // the folder's own
    Engine text_engine(tc);
    const auto texts = f.meta["texts"].get<std::vector<std::string>>();
    const auto ids = f.meta["text_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto text_want = f.meta["text_embeddings"].get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto got_ids = text_engine.tokenizer().encode(texts[i], true, false);
      EXPECT_EQ(got_ids, ids[i]) << "'" << texts[i] << "'";
      const std::string id = "t" + std::to_string(i);
      const auto v = run(text_engine, {embed_request(id, got_ids)}).at(id);
      const double cos = cosine(v, text_want[i]);
      EXPECT_GE(cos, 0.9999) << "'" << texts[i] << "'";
      std::printf("[ embed ] %s text %zu (%zu tokens): cosine %.8f\n", name.c_str(), i, got_ids.size(), cos);
    }
  }
  EngineRequest gen;
  gen.id = "gen";
  gen.prompt_ids = tokens.back();
  gen.params.max_tokens = 2;
  try {
    engine.add_request(gen);
    ADD_FAILURE() << "a generation request was accepted by an encoder";
  } catch (const InvalidRequest& e) {
    EXPECT_NE(std::string(e.what()).find("--task embed"), std::string::npos) << e.what();
  }
  try {
    engine.add_request(embed_request("long", std::vector<int32_t>(60, 5)));
    ADD_FAILURE() << "an input over the step's budget was accepted";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "input") << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EncoderEmbeddingsVsSentenceTransformers,
                         ::testing::Values("embed-tiny-bert-f32-cls", "embed-tiny-bert-f32-mean",
                                           "embed-tiny-xlm-roberta-f32-cls", "embed-tiny-xlm-roberta-f32-mean",
                                           "embed-tiny-xlm-roberta-bf16-cls"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// llama.cpp's converter on the tiny BERT's HF folder
// (tools/gen_convert_fixtures.py): its tensors are the ones pagellm's GGUF
// dummy holds (names, shapes, checksums), and a GGUF with the converter's
// metadata (bert.attention.layer_norm_epsilon, attention.causal false,
// token_type_count) gives sentence-transformers' CLS vectors.
TEST(EncoderEmbeddings, LlamaCppConvertedGgufMatchesSentenceTransformers) {
  const std::string conv = test::fixture("models/converted-tiny-bert.json");
  const std::string name = "embed-tiny-bert-f32-cls";
  REQUIRE_FILE(conv);
  REQUIRE_FILE(test::fixture("hf/" + name + ".json"));
  std::ifstream in(conv);
  const json meta = json::parse(in);
  const int n_vocab = meta["n_vocab"].get<int>();
  ThreadPool pool(2);
  const ModelConfig cfg = dummy_config("tiny-bert", n_vocab);
  auto src = make_dummy_source(cfg, DummySpec{"tiny-bert", DType::F32, meta["seed"].get<uint64_t>()}, pool);
  GGUFWriter w;
  for (const auto& t : meta["tensors"]) {
    const std::string tname = t["name"].get<std::string>();
    const TensorData* d = src->find(tname);
    ASSERT_TRUE(d) << tname << " (the converter writes it; pagellm's GGUF has no such tensor)";
    ASSERT_EQ(d->type, DType::F32) << tname;
    EXPECT_EQ(d->shape, t["shape"].get<std::vector<int64_t>>()) << tname;
    const auto* v = static_cast<const float*>(d->data);
    double sumsq = 0;
    for (int64_t k = 0; k < d->cols() * d->rows(); ++k) sumsq += double(v[k]) * v[k];
    const double want = t["sumsq"].get<double>();
    EXPECT_NEAR(sumsq, want, 1e-6 * want + 1e-9) << tname;
    w.add_tensor(tname, DType::F32, d->shape,
                 std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v),
                                      reinterpret_cast<const uint8_t*>(v + d->cols() * d->rows())));
  }
  EXPECT_EQ(src->count(), meta["tensors"].size()) << "the same set of tensors";
  const std::string unset = test::set_converter_metadata(w, meta["metadata"]);
  ASSERT_TRUE(unset.empty()) << "metadata type not handled here: " << unset;
  // A sequence-classification head as llama.cpp's converter writes one
  // (BertForSequenceClassification, 3 labels): read by name, not run.
  std::vector<float> head(256 * 3);
  for (size_t k = 0; k < head.size(); ++k) head[k] = static_cast<float>(k % 17) * 0.01f - 0.08f;
  w.add_tensor("cls.output.weight", DType::F32, {256, 3},
               std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(head.data()),
                                    reinterpret_cast<const uint8_t*>(head.data() + head.size())));
  w.set_string_array("bert.classifier.output_labels", {"a", "b", "c"});
  add_synthetic_vocab(w, n_vocab);
  const fs::path dir = scratch("converted-tiny-bert");
  const std::string path = (dir / "converted.gguf").string();
  w.write(path);
  {
    auto backend = make_cpu_backend(2);
    auto model = Model::load(path, *backend);
    EXPECT_EQ(model->config().n_cls_out, 3);
    const TensorData* t = model->file_tensor("cls.output.weight");
    ASSERT_TRUE(t);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{256, 3}));
    EXPECT_EQ(static_cast<const float*>(t->data)[20], head[20]);
    EXPECT_FALSE(model->file_tensor("cls.weight"));
  }

  Fixture f = load_fixture(name, 48);
  f.config.model = path;
  f.config.tokenizer = path;
  f.config.scheduler.max_model_len = 128;
  Engine engine(f.config);
  // The converter writes pooling_type only from modules.json: an encoder
  // that does not say pools its [CLS] row.
  EXPECT_EQ(engine.pooling().type, PoolingType::Cls);
  const auto tokens = f.meta["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto want = f.meta["embeddings"].get<std::vector<std::vector<double>>>();
  std::vector<EngineRequest> batch;
  for (size_t k = 0; k < tokens.size(); ++k) batch.push_back(embed_request("c" + std::to_string(k), tokens[k]));
  const auto out = run(engine, std::move(batch));
  for (size_t k = 0; k < tokens.size(); ++k) {
    const double cos = cosine(out.at("c" + std::to_string(k)), want[k]);
    EXPECT_GE(cos, 0.9999) << "input " << k;
    std::printf("[ embed ] converted tiny-bert GGUF input %zu: cosine %.8f\n", k, cos);
  }
}

// llama.cpp's converter on the tiny XLM-R cross-encoder's HF folder
// (tools/gen_cross_encoder_fixtures.py): arch bert, the position table from
// position 0 (its first padding_idx + 1 rows dropped), a UGM ("t5")
// vocabulary with the precompiled charsmap. Its tensors are pagellm's GGUF
// dummy's; the file tokenizes as llama-server does, embeds as
// sentence-transformers (the encoder is tiny-xlm-roberta's) and scores pairs
// as CrossEncoder (and llama-server, within its GELU's precision).
TEST(EncoderEmbeddings, LlamaCppConvertedXlmRobertaMatchesReferences) {
  const std::string conv = test::fixture("models/converted-tiny-xlm-roberta-cls.json");
  const std::string embed = "embed-tiny-xlm-roberta-f32-cls";
  const std::string rerank = test::fixture("hf/rerank-tiny-xlm-roberta.json");
  REQUIRE_FILE(conv);
  REQUIRE_FILE(test::fixture("hf/" + embed + ".json"));
  REQUIRE_FILE(rerank);
  const json meta = json::parse(std::ifstream(conv));
  const json scores = json::parse(std::ifstream(rerank));
  ThreadPool pool(2);
  const ModelConfig cfg = dummy_config(meta["shape"], meta["n_vocab"].get<int>());
  auto src = make_dummy_source(cfg, DummySpec{meta["shape"], DType::F32, meta["seed"].get<uint64_t>()}, pool);
  GGUFWriter w;
  for (const auto& t : meta["tensors"]) {
    const std::string tname = t["name"].get<std::string>();
    const TensorData* d = src->find(tname);
    ASSERT_TRUE(d) << tname;
    EXPECT_EQ(d->shape, t["shape"].get<std::vector<int64_t>>()) << tname;
    const auto* v = static_cast<const float*>(d->data);
    double sumsq = 0;
    for (int64_t k = 0; k < d->cols() * d->rows(); ++k) sumsq += double(v[k]) * v[k];
    EXPECT_NEAR(sumsq, t["sumsq"].get<double>(), 1e-6 * t["sumsq"].get<double>() + 1e-9) << tname;
    w.add_tensor(tname, DType::F32, d->shape,
                 std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v),
                                      reinterpret_cast<const uint8_t*>(v + d->cols() * d->rows())));
  }
  EXPECT_EQ(src->count(), meta["tensors"].size());
  ASSERT_EQ(test::set_converter_metadata(w, meta["metadata"]), "");
  const fs::path dir = scratch("converted-tiny-xlm-roberta");
  const std::string path = (dir / "converted.gguf").string();
  w.write(path);

  // The vocabulary: llama-server's ids ("<s> ... </s>", specials parsed).
  const json& llama = meta["llama_cpp"];
  auto gguf = GGUFFile::open(path);
  auto tok = Tokenizer::from_gguf(*gguf);
  for (size_t i = 0; i < llama["texts"].size(); ++i) {
    const std::string text = llama["texts"][i];
    EXPECT_EQ(tok->encode(text, true, true), llama["text_ids"][i].get<std::vector<int32_t>>()) << "'" << text << "'";
  }

  // Embeddings (the CLS row, normalised): sentence-transformers' vectors.
  Fixture f = load_fixture(embed, 48);
  f.config.model = path;
  f.config.tokenizer = path;
  f.config.task = ServeTask::Embed;
  f.config.scheduler.max_model_len = 128;
  {
    Engine engine(f.config);
    EXPECT_EQ(engine.pooling().type, PoolingType::Cls);
    const auto tokens = f.meta["tokens"].get<std::vector<std::vector<int32_t>>>();
    const auto want = f.meta["embeddings"].get<std::vector<std::vector<double>>>();
    std::vector<EngineRequest> batch;
    for (size_t k = 0; k < tokens.size(); ++k) batch.push_back(embed_request("c" + std::to_string(k), tokens[k]));
    const auto out = run(engine, std::move(batch));
    for (size_t k = 0; k < tokens.size(); ++k) {
      const double cos = cosine(out.at("c" + std::to_string(k)), want[k]);
      EXPECT_GE(cos, 0.9999) << "input " << k;
      std::printf("[ embed ] converted tiny-xlm-roberta GGUF input %zu: cosine %.8f\n", k, cos);
    }
  }

  // Scores: the pairs as transformers' tokenizer joins them, CrossEncoder's
  // sigmoid; llama-server's raw logits agree to its GELU table's precision.
  EngineConfig sc = f.config;
  sc.task = ServeTask::Pooling;
  sc.scheduler.max_num_batched_tokens = 128;  // the longest pair is 61 tokens
  Engine engine(sc);
  ASSERT_EQ(engine.task(), ServeTask::Score) << engine.score_error();
  const auto want = scores["scores"].get<std::vector<double>>();
  const auto llama_logits = llama["rerank_logits"].get<std::vector<double>>();
  for (size_t i = 0; i < want.size(); ++i) {
    EngineRequest r;
    r.id = "s";
    const json& pair = scores["pairs"][i];
    r.prompt_ids = engine.score_model()->format.tokens(engine.tokenizer(), pair[0], pair[1]);
    EXPECT_EQ(r.prompt_ids, scores["token_ids"][i].get<std::vector<int32_t>>()) << i;
    r.score = true;
    engine.add_request(std::move(r));
    float got = -1;
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step())
        if (o.finished) got = o.score;
    EXPECT_NEAR(got, want[i], 1e-5) << i;
    if (i < llama_logits.size()) {
      const double llama_score = 1.0 / (1.0 + std::exp(-llama_logits[i]));
      EXPECT_NEAR(got, llama_score, 2e-4) << i;
      std::printf("[ score ] converted tiny-xlm-roberta-cls pair %zu: %.7f, CrossEncoder %.7f, llama-server "
                  "sigmoid(%.7f) = %.7f\n", i, got, want[i], llama_logits[i], llama_score);
    }
  }
}

// A device without non-causal attention (the C11 test plugin, as the OpenCL
// one) refuses an encoder at load, naming what it lacks.
TEST(EncoderEmbeddings, ADeviceWithoutNonCausalAttentionRefusesTheModel) {
  load_backend_plugin(PAGELLM_TEST_PLUGIN_DIR "/libpagellm_backend_cscalar.so");
  auto be = create_backend("cscalar");
  ThreadPool pool(2);
  const ModelConfig cfg = dummy_config("tiny-bert", 512);
  auto src = make_dummy_source(cfg, DummySpec{"tiny-bert", DType::F32, 1}, pool);
  try {
    Model::from_source(cfg, *src, *be);
    ADD_FAILURE() << "the cscalar device took an encoder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-causal"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagellm
