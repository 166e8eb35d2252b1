// LoRA adapters against transformers + peft (fixtures from
// tools/gen_lora_fixtures.py: random PEFT adapters on tiny dummy bases, and
// the same adapters converted by llama.cpp's convert_lora_to_gguf.py): each
// adapter alone, a batch that mixes several adapters and the base model, the
// engine end to end (slots, the scheduler's --max-loras, prefix caching per
// adapter), and the files and requests it refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "format/gguf.h"
#include "model/dummy.h"
#include "model/hf_writer.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_test_util.h"
#include "spec/spec_config.h"
#include "test_paths.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::max_rel_gap;
using test::read_floats;
using test::read_json;

// One base shape's fixtures, its HF folder regenerated from the recorded seed.
struct LoraFixture {
  std::string shape, dir, base_dir;
  json meta;
  bool present = false;
};

const LoraFixture& fixture_for(const std::string& shape) {
  static std::map<std::string, LoraFixture> cache;
  auto it = cache.find(shape);
  if (it != cache.end()) return it->second;
  LoraFixture f;
  f.shape = shape;
  f.dir = test::fixture("lora/" + shape);
  const std::string meta = f.dir + "/expected.json";
  if (fs::exists(meta)) {
    f.present = true;
    f.meta = read_json(meta);
    f.base_dir = (fs::path(test::temp_dir()) / ("lora_base_" + shape)).string();
    ThreadPool pool(2);
    write_dummy_hf(f.base_dir, DummySpec{shape, DType::F32, f.meta["seed"].get<uint64_t>()}, 1, pool);
    GGUFWriter w;
    w.set_string("general.architecture", "llama");
    add_synthetic_vocab(w, f.meta["n_vocab"].get<int>());
    w.write(f.base_dir + "/vocab.gguf");
  }
  return cache.emplace(shape, std::move(f)).first->second;
}

std::unique_ptr<Backend> cpu_backend() {
  CpuBackendOptions opts;
  opts.threads = 2;
  return make_cpu_backend(opts);
}

// Prefills several sequences in ONE forward pass (each its own blocks and
// LoRA slot) and returns each one's logits at every position.
std::vector<std::vector<float>> prefill_together(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                 const std::vector<int32_t>& slots) {
  const int bs = 16, V = model.config().n_vocab;
  int blocks = 1;
  for (const auto& p : prompts) blocks += static_cast<int>((p.size() + bs - 1) / bs);
  // (Linear-attention layers: one state slot per sequence.)
  const int states = model.has_linear_layers() ? static_cast<int>(prompts.size()) : 0;
  model.backend().allocate_kv_cache(model.kv_cache_spec(bs, blocks, DType::F32, nullptr, states));
  BatchInfo b;
  std::vector<int32_t> rows;
  int32_t next_block = 1, row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    SeqInfo info;
    info.q_start = row;
    info.q_len = static_cast<int32_t>(prompts[s].size());
    info.ctx_len = info.q_len;
    info.lora_slot = slots[s];
    info.state_slot = states > 0 ? static_cast<int32_t>(s) : -1;
    for (int32_t i = 0; i * bs < info.q_len; ++i) info.block_table.push_back(next_block++);
    for (int32_t pos = 0; pos < info.q_len; ++pos) {
      b.token_ids.push_back(prompts[s][static_cast<size_t>(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(static_cast<int64_t>(info.block_table[pos / bs]) * bs + pos % bs);
      rows.push_back(row++);
    }
    b.seqs.push_back(info);
  }
  std::vector<float> logits(rows.size() * V);
  model.forward(b, rows, logits.data());
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (const auto& p : prompts) {
    out.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(at * V),
                     logits.begin() + static_cast<std::ptrdiff_t>((at + p.size()) * V));
    at += p.size();
  }
  return out;
}

// Both sides compute in float32 from the same values: the gaps are summation
// order (measured ~1e-6 of the largest logit); the adapters move the logits
// by 0.1-1.4, so a wrong scale, a missing target or unpermuted Q/K rows fail
// by orders of magnitude.
constexpr double kTol = 1e-4;

struct LoraCase {
  std::string shape, adapter;
  bool gguf;
};

class LoraVsPeft : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraVsPeft, LogitsMatchAtEveryPosition) {
  const LoraCase& c = GetParam();
  const LoraFixture& f = fixture_for(c.shape);
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures for " << c.shape;
  const json& cs = f.meta["cases"][c.adapter];
  auto backend = cpu_backend();
  auto model = Model::load(f.base_dir, *backend);
  model->enable_lora(2, 16);
  const std::string path = f.dir + "/" + (c.gguf ? cs["gguf"].get<std::string>() : cs["adapter_dir"].get<std::string>());
  const LoraAdapter adapter = read_lora_adapter(path, *model, 16);
  EXPECT_EQ(adapter.rank, cs["config"]["r"].get<int>());
  // llama.cpp's converter writes no rsLoRA flag: its files run at alpha / r.
  const float scale = c.gguf ? cs["llama_cpp_scale"].get<float>() : cs["config"]["scale"].get<float>();
  EXPECT_FLOAT_EQ(adapter.scale, scale);
  model->set_lora_slot(2, &adapter);
  const int V = f.meta["n_vocab"].get<int>();
  const auto tokens = f.meta["tokens"].get<std::vector<int32_t>>();
  const auto got = prefill_together(*model, {tokens}, {2});
  const auto ref = read_floats(f.dir + "/" + c.shape + "-" + c.adapter + ".bin");
  ASSERT_EQ(ref.size(), tokens.size() * V);
  const double gap = max_rel_gap(got[0], ref, V);
  std::printf("[ lora ] %s %s (%s): max relative gap to peft %.2e\n", c.shape.c_str(), c.adapter.c_str(),
              c.gguf ? "gguf" : "peft", gap);
  EXPECT_LE(gap, kTol);
  // The base model's rows in the same model (slot 0) are the base's logits.
  const auto base = prefill_together(*model, {tokens}, {0});
  EXPECT_LE(max_rel_gap(base[0], read_floats(f.dir + "/" + c.shape + "-base.bin"), V), kTol);
}

std::vector<LoraCase> lora_cases() {
  std::vector<LoraCase> out;
  for (const char* shape : {"tiny-llama", "tiny-qwen3", "tiny-qwen3moe"}) {
    for (const char* a : {"a", "b", "c"}) out.push_back({shape, a, false});
    // (c.gguf runs at llama.cpp's alpha / r, not peft's rsLoRA scale: no peft reference.)
    for (const char* a : {"a", "b"}) out.push_back({shape, a, true});
  }
  // Phi-3's fused qkv_proj / gate_up_proj (B cut per target, A shared),
  // Gemma 4's own layer, and Qwen3.5's q_proj ([q | gate] per head) beside
  // its linear-attention layers (PEFT folders only).
  for (const char* shape : {"tiny-phi3", "tiny-gemma4", "tiny-qwen35"})
    for (const char* a : {"a", "b", "c"}) out.push_back({shape, a, false});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraVsPeft, ::testing::ValuesIn(lora_cases()), [](const auto& info) {
  std::string n = info.param.shape + "_" + info.param.adapter + (info.param.gguf ? "_gguf" : "_peft");
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

// One pass mixing three adapters and the base model, prompts of two lengths:
// each sequence gets its own adapter's logits (grouped products, no merging).
TEST(LoraMixedBatch, EachSequenceGetsItsAdaptersLogits) {
  for (const std::string shape : {"tiny-llama", "tiny-qwen3moe"}) {
    const LoraFixture& f = fixture_for(shape);
    if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
    auto backend = cpu_backend();
    auto model = Model::load(f.base_dir, *backend);
    model->enable_lora(3, 16);
    std::vector<LoraAdapter> adapters;
    for (const char* a : {"a", "b", "c"}) adapters.push_back(read_lora_adapter(f.dir + "/" + a, *model, 16));
    // Slots in another order than the adapters'.
    model->set_lora_slot(3, &adapters[0]);
    model->set_lora_slot(1, &adapters[1]);
    model->set_lora_slot(2, &adapters[2]);
    const auto tokens = f.meta["tokens"].get<std::vector<int32_t>>();
    const auto short_tokens = f.meta["tokens_short"].get<std::vector<int32_t>>();
    const int V = f.meta["n_vocab"].get<int>();
    const auto got = prefill_together(*model, {short_tokens, tokens, short_tokens, tokens, tokens},
                                      {2, 0, 3, 1, 2});
    const std::vector<std::pair<std::string, bool>> want = {{"c", true}, {"base", false}, {"a", true},
                                                            {"b", false}, {"c", false}};
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string ref = f.dir + "/" + shape + "-" + want[i].first + (want[i].second ? "-short" : "") + ".bin";
      const double gap = max_rel_gap(got[i], read_floats(ref), V);
      EXPECT_LE(gap, kTol) << shape << " sequence " << i << " (" << want[i].first << ")";
    }
  }
}

EngineConfig lora_engine_config(const LoraFixture& f, int32_t max_loras) {
  EngineConfig c;
  c.model = f.base_dir;
  c.tokenizer = f.base_dir + "/vocab.gguf";
  c.backend_options["threads"] = "2";
  c.kv_cache_dtype = DType::F32;
  c.scheduler.max_model_len = 128;
  c.lora.enabled = true;
  c.lora.max_loras = max_loras;
  c.lora.max_lora_rank = 16;
  for (const char* a : {"a", "b", "c"}) c.lora.modules.push_back({std::string("ad-") + a, f.dir + "/" + a});
  return c;
}

// Greedy continuations through the engine equal peft's, for every adapter
// and the base model at once, with fewer slots than adapters: the scheduler
// runs at most --max-loras adapters, the others wait and take a slot after.
TEST(LoraEngine, GreedyIdsOfMixedAdaptersWithFewerSlots) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  Engine engine(lora_engine_config(f, 2));
  const auto prompt = f.meta["greedy"]["prompt"].get<std::vector<int32_t>>();
  for (const char* c : {"base", "a", "b", "c"}) {
    for (int k = 0; k < 2; ++k) {
      EngineRequest r = test::make_request(fmt::format("{}-{}", c, k), prompt,
                                           static_cast<int>(f.meta["cases"][c]["greedy_ids"].size()));
      if (std::string(c) != "base") r.lora = std::string("ad-") + c;
      engine.add_request(std::move(r));
    }
  }
  std::map<std::string, std::vector<int32_t>> tokens;
  size_t most_running = 0;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step())
      for (const CompletionDelta& d : out.completions)
        tokens[out.request_id].insert(tokens[out.request_id].end(), d.token_ids.begin(), d.token_ids.end());
    engine.check_invariants();
    most_running = std::max(most_running, engine.stats().running_loras.size());
  }
  EXPECT_EQ(most_running, 2u);  // never more adapters running than slots
  for (const char* c : {"base", "a", "b", "c"})
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(tokens.at(fmt::format("{}-{}", c, k)), f.meta["cases"][c]["greedy_ids"].get<std::vector<int32_t>>())
          << c;
  // Three adapters through two slots: each was copied into one at least once.
  EXPECT_GE(engine.lora()->slot_loads(), 3);
}

// The prefix cache keeps adapters apart: the same prompt under another
// adapter (or none) computes again; under the same adapter it is found.
TEST(LoraEngine, PrefixCacheIsPerAdapter) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  Engine engine(lora_engine_config(f, 2));
  const auto tokens = f.meta["tokens"].get<std::vector<int32_t>>();
  auto cached = [&](const std::string& id, const std::string& lora) {
    EngineRequest r = test::make_request(id, tokens, 1);
    r.lora = lora;
    engine.add_request(std::move(r));
    int32_t n = -1;
    while (engine.has_unfinished())
      for (RequestOutput& out : engine.step())
        if (out.finished) n = out.num_cached_tokens;
    return n;
  };
  EXPECT_EQ(cached("1", "ad-a"), 0);
  EXPECT_EQ(cached("2", "ad-a"), 32);  // two full blocks of 16
  EXPECT_EQ(cached("3", "ad-b"), 0);
  EXPECT_EQ(cached("4", ""), 0);
  EXPECT_EQ(cached("5", ""), 32);
  EXPECT_EQ(cached("6", "ad-b"), 32);
}

// Load and unload at run time: a request holds its adapter until it ends;
// new requests for an unloaded name are refused; the name may be loaded again.
TEST(LoraEngine, LoadAndUnloadAtRunTime) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  EngineConfig c = lora_engine_config(f, 1);
  c.lora.modules.clear();
  Engine engine(c);
  LoraRegistry& lora = *engine.lora();
  lora.load("x", f.dir + "/a");
  const auto prompt = f.meta["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = f.meta["cases"]["a"]["greedy_ids"].get<std::vector<int32_t>>();
  EngineRequest r = test::make_request("r", prompt, static_cast<int>(want.size()));
  r.lora = "x";
  engine.add_request(std::move(r));
  std::vector<int32_t> got;
  for (const RequestOutput& out : engine.step())
    for (const CompletionDelta& d : out.completions) got = d.token_ids;
  EXPECT_TRUE(lora.unload("x"));  // while the request runs
  EXPECT_FALSE(lora.has("x"));
  const test::Results results = test::run_all(engine);
  const auto& rest = results.at("r")[0].tokens;
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, want);
  EngineRequest again = test::make_request("again", prompt, 2);
  again.lora = "x";
  EXPECT_THROW(engine.add_request(again), InvalidRequest);
  lora.load("x", f.dir + "/b");
  EXPECT_NO_THROW(engine.add_request(again));
  test::run_all(engine);
  EXPECT_THROW(lora.load("x", f.dir + "/a"), InvalidRequest);  // the name is taken
}

// Speculative decoding verifies drafts with each sequence's adapter: the
// outputs equal those without speculation, adapter by adapter.
TEST(LoraEngine, SpeculativeDecodingKeepsEachAdaptersOutputs) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  // A repetitive prompt, so that the n-gram proposer drafts.
  std::vector<int32_t> prompt;
  for (int k = 0; k < 6; ++k)
    for (int32_t t : {1, 501, 500, 505, 196}) prompt.push_back(t);
  auto run = [&](bool spec) {
    EngineConfig c = lora_engine_config(f, 3);
    if (spec)
      c.speculative = parse_speculative_config(
          R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "adaptive": false})");
    Engine engine(c);
    for (const char* a : {"", "ad-a", "ad-b", "ad-c"}) {
      EngineRequest r = test::make_request(std::string("r") + a, prompt, 24);
      r.lora = a;
      engine.add_request(std::move(r));
    }
    test::Results results = test::run_all(engine);
    if (spec) EXPECT_GT(engine.metrics().spec_decode_num_draft_tokens, 0);
    return results;
  };
  const test::Results plain = run(false), spec = run(true);
  for (const char* a : {"", "ad-a", "ad-b", "ad-c"})
    EXPECT_EQ(spec.at(std::string("r") + a)[0].tokens, plain.at(std::string("r") + a)[0].tokens) << a;
  EXPECT_NE(plain.at("rad-a")[0].tokens, plain.at("r")[0].tokens);  // the adapter matters here
}

// A structured output constrains what an adapter's request may say.
TEST(LoraEngine, StructuredOutputsWithAnAdapter) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  Engine engine(lora_engine_config(f, 1));
  const auto prompt = f.meta["greedy"]["prompt"].get<std::vector<int32_t>>();
  EngineRequest r = test::make_request("s", prompt, 16);
  r.params.ignore_eos = false;
  r.lora = "ad-a";
  r.params.structured.kind = StructuredOutputs::Kind::Regex;
  r.params.structured.spec = "(yes|no)";
  engine.add_request(std::move(r));
  const test::Results results = test::run_all(engine);
  const std::string& text = results.at("s")[0].text;
  EXPECT_TRUE(text == "yes" || text == "no") << text;
}

// Loading and unloading from another thread while requests stream: the
// registry changes between steps only (run_on_step_thread), requests keep
// their adapter, and errors come back to the caller.
TEST(AsyncEngineLora, LoadAndUnloadWhileRequestsRun) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  AsyncEngine engine(std::make_unique<Engine>(lora_engine_config(f, 2)));
  const auto prompt = f.meta["greedy"]["prompt"].get<std::vector<int32_t>>();
  auto submit = [&](const std::string& id, const std::string& lora) {
    EngineRequest r = test::make_request(id, prompt, 8);
    r.lora = lora;
    return engine.submit(std::move(r));
  };
  auto tokens_of = [](RequestStream& s) {
    std::vector<int32_t> out;
    while (auto o = s.next(std::chrono::seconds(60))) {
      EXPECT_TRUE(o->error.empty()) << o->error;
      for (const CompletionDelta& d : o->completions) out.insert(out.end(), d.token_ids.begin(), d.token_ids.end());
      if (o->finished) break;
    }
    return out;
  };
  std::vector<std::shared_ptr<RequestStream>> streams = {submit("a1", "ad-a"), submit("b1", "ad-b"), submit("base", "")};
  std::thread loader([&] {
    engine.run_on_step_thread([&](Engine& e) { e.lora()->load("x", f.dir + "/c"); });
    streams.push_back(submit("x1", "x"));
    engine.run_on_step_thread([&](Engine& e) { EXPECT_TRUE(e.lora()->unload("ad-b")); });
  });
  loader.join();
  EXPECT_THROW(engine.run_on_step_thread([&](Engine& e) { e.lora()->load("y", f.dir + "/missing"); }), Error);
  const std::vector<std::string> cases = {"a", "b", "base", "c"};
  for (size_t i = 0; i < streams.size(); ++i)
    EXPECT_EQ(tokens_of(*streams[i]), f.meta["cases"][cases[i]]["greedy_ids"].get<std::vector<int32_t>>()) << i;
  std::vector<std::string> names;
  for (const LoraInfo& l : engine.loras()) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"ad-a", "ad-c", "x"}));
  // A request for the unloaded name fails with a 400-kind error naming the model field.
  auto gone = submit("b2", "ad-b");
  auto out = gone->next(std::chrono::seconds(60));
  ASSERT_TRUE(out && out->finished);
  EXPECT_EQ(out->error_kind, RequestError::Invalid);
  EXPECT_EQ(out->error_param, "model");
}

TEST(LoraEngine, RefusesRequestsItCannotServe) {
  const LoraFixture& f = fixture_for("tiny-llama");
  if (!f.present) GTEST_SKIP() << "no LoRA fixtures";
  Engine engine(lora_engine_config(f, 1));
  EngineRequest r = test::make_request("r", {1, 2, 3}, 2);
  r.lora = "nope";
  try {
    engine.add_request(r);
    FAIL() << "an unknown adapter was accepted";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "model");
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
  }
  Engine plain(test::tiny_engine_config());
  r.lora = "ad-a";
  EXPECT_THROW(plain.add_request(r), InvalidRequest);
}

void expect_error_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A copy of a fixture adapter with its config edited.
std::string edited_adapter(const LoraFixture& f, const std::string& name, const std::function<void(json&)>& edit) {
  const fs::path dir = fs::path(test::temp_dir()) / ("lora_edit_" + name);
  fs::create_directories(dir);
  fs::copy_file(fs::path(f.dir) / "a" / "adapter_model.safetensors", dir / "adapter_model.safetensors",
                fs::copy_options::overwrite_existing);
  json cfg = read_json(f.dir + "/a/adapter_config.json");
  edit(cfg);
  std::ofstream(dir / "adapter_config.json") << cfg.dump();
  return dir.string();
}

TEST(LoraFiles, RefusesWhatDoesNotFit) {
  const LoraFixture& llama = fixture_for("tiny-llama");
  const LoraFixture& qwen = fixture_for("tiny-qwen3");
  if (!llama.present || !qwen.present) GTEST_SKIP() << "no LoRA fixtures";
  auto backend = cpu_backend();
  auto model = Model::load(llama.base_dir, *backend);
  expect_error_with([&] { read_lora_adapter(llama.dir + "/a", *model, 4); }, "over --max-lora-rank 4");
  expect_error_with([&] { read_lora_adapter(llama.dir + "/missing", *model, 16); }, "does not exist");
  expect_error_with([&] { read_lora_adapter(qwen.dir + "/a.gguf", *model, 16); }, "an adapter for 'qwen3' models");
  expect_error_with(
      [&] {
        read_lora_adapter(edited_adapter(llama, "mts", [](json& j) { j["modules_to_save"] = {"lm_head"}; }), *model,
                          16);
      },
      "modules_to_save is not served");
  expect_error_with(
      [&] { read_lora_adapter(edited_adapter(llama, "dora", [](json& j) { j["use_dora"] = true; }), *model, 16); },
      "use_dora is not served");
  expect_error_with(
      [&] { read_lora_adapter(edited_adapter(llama, "bias", [](json& j) { j["bias"] = "all"; }), *model, 16); },
      "bias 'all' is not served");
  expect_error_with(
      [&] { read_lora_adapter(edited_adapter(llama, "type", [](json& j) { j["peft_type"] = "IA3"; }), *model, 16); },
      "peft_type 'IA3'");
  // Not a directory and not a GGUF file.
  const std::string junk = (fs::path(test::temp_dir()) / "lora_junk.gguf").string();
  std::ofstream(junk) << "not a gguf";
  EXPECT_THROW(read_lora_adapter(junk, *model, 16), Error);
  // A base GGUF model file is not an adapter.
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  const std::string not_adapter = (fs::path(test::temp_dir()) / "lora_not_adapter.gguf").string();
  w.write(not_adapter);
  expect_error_with([&] { read_lora_adapter(not_adapter, *model, 16); }, "not a LoRA adapter");
  // Families whose layers do not run the shared blocks are refused by name.
  EngineConfig c = test::tiny_engine_config();
  c.dummy_shape = "tiny-deepseek3";
  c.lora.enabled = true;
  expect_error_with([&] { Engine e(c); }, "not served for deepseek2 models");
  EngineConfig bad = test::tiny_engine_config();
  bad.lora.enabled = true;
  bad.lora.max_cpu_loras = 1;
  bad.lora.max_loras = 2;
  expect_error_with([&] { Engine e(bad); }, "--max-cpu-loras (1) must be at least --max-loras (2)");
}

}  // namespace
}  // namespace pagellm
