// Hostile model files: every count, size and hyperparameter is checked
// against the file and the limits before anything is allocated from it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "hostile_input.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model/hf_writer.h"
#include "model/model.h"
#include "model/model_config.h"

namespace pagellm {
namespace {

using nlohmann::json;
using test::expect_error_with;
using test::RawGGUF;

constexpr uint32_t kF32 = 0, kQ8_0 = 8;

std::unique_ptr<Model> load(const std::string& path) {
  static auto backend = make_cpu_backend(1);
  return Model::load(path, *backend);
}

GGUFValue scalar(GGUFType type, int64_t v) {
  GGUFValue g;
  g.type = type;
  g.i = v;
  g.u = static_cast<uint64_t>(v);
  return g;
}

GGUFValue f32(float v) {
  GGUFValue g;
  g.type = GGUFType::F32;
  g.f = v;
  return g;
}

// The tiny-llama dummy (Q8_0, ~1 MB), written once per test process.
const std::string& dummy_gguf() {
  static const std::string path = [] {
    ThreadPool pool(2);
    const std::string p = test::temp_dir() + "/limits-dummy.gguf";
    write_dummy_gguf(p, DummySpec{"tiny-llama", DType::Q8_0, 1}, nullptr, pool);
    return p;
  }();
  return path;
}

// A copy of the dummy with metadata `key` set to `value`.
void write_dummy_with(const std::string& to, const std::string& key, const GGUFValue& value) {
  auto f = GGUFFile::open(dummy_gguf());
  GGUFWriter w;
  bool replaced = false;
  for (const auto& [k, v] : f->metadata()) {
    replaced |= k == key;
    w.set_value(k, k == key ? value : v);
  }
  if (!replaced) w.set_value(key, value);
  for (const auto& t : f->tensors())
    w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  w.write(to);
}

}  // namespace

// --- GGUF structure ---------------------------------------------------------

TEST(GGUFLimits, TensorByteSizeDoesNotWrap) {
  test::ScratchDir dir("gguf-wrap");
  // [2^31, 2^31] F32 is 2^64 bytes: the size used to wrap to 0 and open.
  for (uint32_t type : {kF32, kQ8_0}) {
    RawGGUF g(1, 1);
    g.kv_str("general.architecture", "llama").tensor("huge", {uint64_t{1} << 31, uint64_t{1} << 31}, type, 0);
    g.pad().zeros(64).write(dir.file("wrap.gguf"));
    expect_error_with([&] { GGUFFile::open(dir.file("wrap.gguf")); },
                      "tensor 'huge' of shape [2147483648, 2147483648]");
    expect_error_with([&] { GGUFFile::open(dir.file("wrap.gguf")); }, "is larger than the file");
  }
}

TEST(GGUFLimits, CountsPastTheEndOfTheFileAreRefused) {
  test::ScratchDir dir("gguf-counts");
  const std::string p = dir.file("bad.gguf");
  auto expect = [&](const RawGGUF& g, const std::string& needle) {
    g.write(p);
    expect_error_with([&] { GGUFFile::open(p); }, needle);
  };
  expect(RawGGUF(0, uint64_t{1} << 60), "metadata count 1152921504606846976 exceeds the file");
  expect(RawGGUF(uint64_t{1} << 60, 0), "tensor count 1152921504606846976 exceeds the file");
  expect(RawGGUF(0, 1).u64(uint64_t{1} << 40).zeros(16), "metadata key needs 1099511627776 bytes");
  expect(RawGGUF(0, 1).str("k").u32(8).u64(~uint64_t{0}), "string needs 18446744073709551615 bytes");
  // Arrays: u32 elements, strings, nested arrays.
  expect(RawGGUF(0, 1).str("k").u32(9).u32(4).u64(uint64_t{1} << 40).zeros(8), "array of 1099511627776 elements");
  expect(RawGGUF(0, 1).str("k").u32(9).u32(8).u64(uint64_t{1} << 40).zeros(8), "string array of 1099511627776");
  expect(RawGGUF(0, 1).str("k").u32(9).u32(9).u64(uint64_t{1} << 40).zeros(8), "nested array of 1099511627776");
  expect(RawGGUF(0, 1).str("k").u32(9).u32(8).u64(2).str("a").u64(1000), "array string needs 1000 bytes");
  // Tensor table.
  expect(RawGGUF(1, 0).tensor("t", {1, 1, 1, 1, 1}, kF32, 0).pad(), "has 5 dimensions");
  expect(RawGGUF(1, 0).tensor("t", {}, kF32, 0).pad(), "has 0 dimensions");
  expect(RawGGUF(1, 0).tensor("t", {~uint64_t{0}}, kF32, 0).pad(), "invalid dimension -1");
  expect(RawGGUF(1, 0).tensor("t", {0}, kF32, 0).pad(), "invalid dimension 0");
  expect(RawGGUF(1, 0).tensor("t", {8}, kF32, 1u << 20).pad().zeros(32), "exceeds the file's 32 data bytes");
  expect(RawGGUF(1, 0).tensor("t", {8}, 12345, 0).pad().zeros(32), "unknown type id 12345");
  expect(RawGGUF(0, 1).kv_u32("general.alignment", 4), "invalid general.alignment (4;");
}

// --- Hyperparameters --------------------------------------------------------

TEST(ModelLimits, BlockCountOfABillionIsRefusedBeforeAllocating) {
  test::ScratchDir dir("gguf-blocks");
  // It used to size 10^9 layers (a 128 GB allocation) before failing.
  write_dummy_with(dir.file("m.gguf"), "llama.block_count", scalar(GGUFType::U32, 1'000'000'000));
  expect_error_with([&] { load(dir.file("m.gguf")); }, "llama.block_count = 1000000000 is out of range (1 to 1024)");
  write_dummy_with(dir.file("m.gguf"), "llama.block_count", scalar(GGUFType::U32, 3));
  expect_error_with([&] { load(dir.file("m.gguf")); },
                    "llama.block_count = 3 does not match the tensors, which hold 2 layers");
  ASSERT_NO_THROW(load(dummy_gguf()));
}

TEST(ModelLimits, HyperparametersAreRangeChecked) {
  test::ScratchDir dir("gguf-hparams");
  const std::string p = dir.file("m.gguf");
  struct Case {
    const char* key;
    GGUFValue value;
    const char* needle;
  };
  const Case cases[] = {
      {"llama.embedding_length", scalar(GGUFType::U32, int64_t{1} << 31),
       "llama.embedding_length = 2147483648 is out of range (1 to 131072)"},
      {"llama.embedding_length", scalar(GGUFType::U64, -1), "llama.embedding_length = 18446744073709551615"},
      {"llama.attention.head_count", scalar(GGUFType::U32, 0), "llama.attention.head_count = 0 is out of range"},
      {"llama.attention.head_count_kv", scalar(GGUFType::I32, -2), "head_count_kv = -2 is out of range"},
      {"llama.feed_forward_length", scalar(GGUFType::I64, int64_t{1} << 40), "feed_forward_length = 1099511627776"},
      {"llama.context_length", scalar(GGUFType::U64, -1), "llama.context_length = 18446744073709551615"},
      {"llama.attention.key_length", scalar(GGUFType::U32, 1'000'000), "key_length = 1000000 is out of range"},
      {"llama.vocab_size", scalar(GGUFType::U32, 1 << 30), "llama.vocab_size = 1073741824 is out of range"},
      {"llama.rope.dimension_count", scalar(GGUFType::U32, 7), "invalid RoPE dimension 7"},
      {"llama.attention.head_count_kv", scalar(GGUFType::U32, 3), "not a multiple of the KV head count 3"},
      {"llama.attention.layer_norm_rms_epsilon", f32(INFINITY), "invalid norm epsilon inf"},
      // In range but not what the tensors hold.
      {"llama.embedding_length", scalar(GGUFType::U32, 128), "has shape [256, 512], expected [128, 512]"},
      {"llama.vocab_size", scalar(GGUFType::U32, 1000), "expected [256, 1000]"},
      {"llama.block_count", scalar(GGUFType::U32, 1), "does not match the tensors, which hold 2 layers"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    write_dummy_with(p, c.key, c.value);
    expect_error_with([&] { load(p); }, c.needle);
  }
}

TEST(ModelLimits, ConfigSizesAreCheckedBeforeUse) {
  ModelConfig c = dummy_config("tiny-llama", 512);
  c.n_layer = 1'000'000'000;
  c.is_swa.clear();
  // finalize_config sizes is_swa from n_layer: the check comes first.
  expect_error_with([&] { finalize_config(c, true); }, "n_layer = 1000000000 is out of range (1 to 1024)");
  c = dummy_config("tiny-llama", 512);
  c.n_vocab = -3;
  expect_error_with([&] { c.validate(); }, "missing or zero");
}

// --- Hugging Face config.json -----------------------------------------------

namespace {

// A config.json as write_dummy_hf writes it, edited.
std::string hf_config_with(const test::ScratchDir& dir, const std::function<void(json&)>& edit) {
  json j = hf_config_json(dummy_config("tiny-llama", 512), false, DType::F32);
  edit(j);
  test::write_bytes(dir.file("config.json"), j.dump());
  return dir.file("config.json");
}

}  // namespace

TEST(HFConfigLimits, AbsurdSizesAreRefused) {
  test::ScratchDir dir("hf-config-limits");
  struct Case {
    const char* key;
    json value;
    const char* needle;
  };
  const Case cases[] = {
      {"num_hidden_layers", 1'000'000'000, "num_hidden_layers = 1000000000 is out of range (1 to 1024)"},
      {"hidden_size", -5, "hidden_size = -5 is out of range"},
      {"vocab_size", 1e30, "vocab_size = 1e+30 is not an integer from 1 to 16777216"},
      {"head_dim", 2.5, "head_dim = 2.5 is not an integer"},
      {"intermediate_size", "big", "intermediate_size must be an integer, not string"},
      {"num_key_value_heads", std::numeric_limits<uint64_t>::max(), "num_key_value_heads = 18446744073709551615"},
      {"max_position_embeddings", 0, "max_position_embeddings = 0 is out of range"},
      {"num_attention_heads", 2'000'000'000'000LL, "num_attention_heads = 2000000000000 is out of range"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    const std::string path = hf_config_with(dir, [&](json& j) { j[c.key] = c.value; });
    expect_error_with([&] { config_from_hf_json(path); }, c.needle);
  }
  // A whole number given as a float is fine, as transformers accepts it.
  EXPECT_EQ(config_from_hf_json(hf_config_with(dir, [](json& j) { j["num_hidden_layers"] = 2.0; })).n_layer, 2);
}

TEST(HFConfigLimits, DeepOrHugeConfigJsonIsRefusedByThePreScan) {
  test::ScratchDir dir("hf-config-deep");
  std::string deep = R"({"architectures": ["LlamaForCausalLM"], "x": )";
  deep += std::string(100'000, '[') + std::string(100'000, ']') + "}";
  test::write_bytes(dir.file("config.json"), deep);
  expect_error_with([&] { config_from_hf_json(dir.file("config.json")); },
                    "config.json': JSON nesting depth exceeds the limit of 64");
  std::filesystem::resize_file(dir.file("config.json"), 200u << 20);  // sparse: nothing is read
  expect_error_with([&] { config_from_hf_json(dir.file("config.json")); }, "exceeds the limit of 104857600 bytes");
}

// --- safetensors ------------------------------------------------------------

namespace {

std::string hf_folder(const test::ScratchDir& dir) {
  ThreadPool pool(2);
  write_dummy_hf(dir.path(), DummySpec{"tiny-llama", DType::F32, 1}, 1, pool);
  return dir.file("model.safetensors");
}

}  // namespace

TEST(SafetensorsLimits, HeaderLengthIsBoundedByTheFileAndTheLimit) {
  test::ScratchDir dir("st-header");
  const std::string st = hf_folder(dir);
  std::string len(8, '\0');
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(len.data(), &huge, 8);
  test::write_bytes(st, len + "{}      ");
  expect_error_with([&] { load(dir.path()); }, "safetensors header length 1152921504606846976 exceeds the file");
  // 150 MiB header in a 160 MiB (sparse) file: refused before it is parsed.
  const uint64_t big = uint64_t{150} << 20;
  std::memcpy(len.data(), &big, 8);
  test::write_bytes(st, len);
  std::filesystem::resize_file(st, 160u << 20);
  expect_error_with([&] { load(dir.path()); }, "safetensors header length 157286400 exceeds the limit of 104857600");
}

TEST(SafetensorsLimits, EntriesAreValidated) {
  test::ScratchDir dir("st-entries");
  const std::string st = hf_folder(dir);
  const std::string good = test::read_bytes(st);
  ASSERT_NO_THROW(load(dir.path()));
  const std::string norm = "model.norm.weight";
  struct Case {
    std::function<void(json&)> edit;
    const char* needle;
  };
  const uint64_t big = uint64_t{1} << 32;
  const Case cases[] = {
      {[&](json& h) {
         h[norm]["shape"] = {big, big, big};
       },
       "shape [4294967296,4294967296,4294967296] is larger"},
      {[&](json& h) { h[norm]["shape"] = {1e30}; }, "tensor model.norm.weight has an invalid dimension 1e+30"},
      {[&](json& h) { h[norm]["shape"] = {-256}; }, "has an invalid dimension -256"},
      {[&](json& h) {
         h[norm]["shape"] = json::array({1, 2, 3, 4, 5, 6, 7, 8, 9});
       },
       "up to 8 dimensions"},
      {[&](json& h) {
         h[norm]["data_offsets"] = {-4, 1020};
       },
       "data_offsets must be two non-negative integers"},
      {[&](json& h) {
         h[norm]["data_offsets"] = {0.5, 1024};
       },
       "data_offsets must be two non-negative integers"},
      {[&](json& h) {
         h[norm]["data_offsets"] = {1024, 0};
       },
       "data offsets exceed the file"},
      {[&](json& h) { h[norm] = 7; }, "safetensors entry model.norm.weight is not an object"},
      // Unused entries are checked too.
      {[&](json& h) {
         h["extra"] = {{"dtype", "I64"}, {"shape", {3}}, {"data_offsets", {0, 8}}};
       },
       "tensor extra size does not match its shape (8 bytes for 3 elements of I64)"},
      {[&](json& h) {
         h["extra"] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {0, big}}};
       },
       "tensor extra data offsets exceed the file"},
      // Right size, but F32 data two bytes off its alignment.
      {[&](json& h) {
         auto& o = h[norm]["data_offsets"];
         const uint64_t b = o[0].get<uint64_t>(), e = o[1].get<uint64_t>();
         o = b >= 2 ? json{b - 2, e - 2} : json{b + 2, e + 2};
       },
       "is not aligned to its 4-byte elements"},
      {[&](json& h) {
         json deep = 1;
         for (int k = 0; k < 100; ++k) deep = json::array({deep});
         h["__metadata__"]["deep"] = deep;
       },
       "safetensors header: JSON nesting depth exceeds the limit of 64"},
  };
  for (size_t k = 0; k < std::size(cases); ++k) {
    SCOPED_TRACE(k);
    test::write_bytes(st, good);
    test::edit_safetensors_header(st, cases[k].edit);
    expect_error_with([&] { load(dir.path()); }, cases[k].needle);
  }
}

}  // namespace pagellm
