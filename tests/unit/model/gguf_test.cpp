#include "format/gguf.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "test_paths.h"

namespace pagellm {
namespace {

std::string write_sample(const std::string& name) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "hello"});
  w.set_f32_array("tokenizer.ggml.scores", {0.f, 0.f, 0.f, -1.5f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1});
  std::vector<uint8_t> data(4 * 8 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  w.add_tensor("w", DType::F32, {8, 4}, data);
  // 16 rows x 34 bytes = 544, a multiple of the alignment: no tail padding,
  // so every strict prefix of the file is a truncation.
  w.add_tensor("v", DType::Q8_0, {32, 16}, std::vector<uint8_t>(544, 1));
  const std::string path = test::temp_dir() + "/" + name;
  w.write(path);
  return path;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(GGUF, WriterAndReaderRoundTrip) {
  auto f = GGUFFile::open(write_sample("rt.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(f->get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token", false));
  auto toks = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.size(), 4u);
  EXPECT_EQ(toks[3], "hello");
  EXPECT_FLOAT_EQ(f->get_float_array("tokenizer.ggml.scores")[3], -1.5f);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")[0], 2);
  const auto* w = f->find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->cols(), 8);
  EXPECT_EQ(w->rows(), 4);
  EXPECT_EQ(w->nbytes, 128u);
  EXPECT_EQ(w->data[5], 5);
  const auto* v = f->find_tensor("v");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, DType::Q8_0);
  EXPECT_EQ(v->nbytes, 544u);
  EXPECT_THROW(f->get_int("general.architecture"), Error);
  EXPECT_THROW(f->get_string("missing.key"), Error);
}

// Copying metadata from one file to another (dummies take a real file's
// tokenizer keys) keeps every scalar: bools and signed values too.
TEST(GGUF, SetValueCopiesEveryScalarKind) {
  GGUFWriter a;
  a.set_bool("k.bool", true);
  a.set_i32("k.i32", -5);
  a.set_u32("k.u32", 4000000000u);
  a.set_f32("k.f32", -1.25f);
  a.set_string("k.str", "x");
  const std::string first = test::temp_dir() + "/copy-a.gguf", second = test::temp_dir() + "/copy-b.gguf";
  a.write(first);
  auto f = GGUFFile::open(first);
  GGUFWriter b;
  for (const auto& [key, value] : f->metadata()) b.set_value(key, value);
  b.write(second);
  auto g = GGUFFile::open(second);
  EXPECT_TRUE(g->get_bool("k.bool", false));
  EXPECT_EQ(g->get_int("k.i32"), -5);
  EXPECT_EQ(g->get_int("k.u32"), 4000000000ll);
  EXPECT_FLOAT_EQ(g->get_float("k.f32"), -1.25f);
  EXPECT_EQ(g->get_string("k.str"), "x");
}

TEST(GGUF, ReadsRealFiles) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  auto f = GGUFFile::open(path);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_NE(f->find_tensor("token_embd.weight"), nullptr);
  const std::string vocab = test::shared_data("tokenizer/ggml-vocab-gpt-2.gguf");
  REQUIRE_FILE(vocab);
  auto g = GGUFFile::open(vocab);
  EXPECT_EQ(g->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens").size(), 50257u);
}

TEST(GGUF, RejectsMissingAndNonGGUFFiles) {
  EXPECT_THROW(GGUFFile::open(test::temp_dir() + "/does-not-exist.gguf"), Error);
  const std::string p = test::temp_dir() + "/notgguf.bin";
  write_bytes(p, {'h', 'e', 'l', 'l', 'o', '!', '!', '!'});
  EXPECT_THROW(GGUFFile::open(p), Error);
  write_bytes(p, {});
  EXPECT_THROW(GGUFFile::open(p), Error);
}

// Every truncation of a valid file must fail cleanly (an Error, not a crash).
TEST(GGUF, EveryTruncationFailsCleanly) {
  const auto bytes = read_bytes(write_sample("trunc-src.gguf"));
  const std::string p = test::temp_dir() + "/trunc.gguf";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + n));
    EXPECT_THROW(GGUFFile::open(p), Error) << "truncated at " << n;
  }
}

// Random byte corruption: opening either succeeds or throws Error; never
// crashes, hangs or allocates wildly (ASan builds catch the latter).
TEST(GGUF, RandomCorruptionNeverCrashes) {
  const auto bytes = read_bytes(write_sample("fuzz-src.gguf"));
  const std::string p = test::temp_dir() + "/fuzz.gguf";
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % 400 < b.size() ? rng() % 400 : rng() % b.size();
      b[at % b.size()] = static_cast<uint8_t>(rng());
    }
    write_bytes(p, b);
    try {
      GGUFFile::open(p);
    } catch (const Error&) {
    }
  }
}

TEST(GGUF, HugeCountsAreRejectedBeforeAllocating) {
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  auto put64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put64(0);
  put64(1);
  put64(3);  // key length
  b.insert(b.end(), {'a', 'b', 'c'});
  b.insert(b.end(), {9, 0, 0, 0});  // array
  b.insert(b.end(), {8, 0, 0, 0});  // of strings
  put64(uint64_t{1} << 60);         // absurd count
  const std::string p = test::temp_dir() + "/huge.gguf";
  write_bytes(p, b);
  try {
    GGUFFile::open(p);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the file"), std::string::npos) << e.what();
  }
}

}  // namespace pagellm
