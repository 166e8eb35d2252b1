// llama.cpp's tokenizer test vectors against the vocab-only GGUF files: every
// input encoded with add_special = false, parse_special = false must give the
// reference ids exactly.
#include <gtest/gtest.h>

#include <thread>

#include "format/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

using test::ids_string;
using test::shared_data;

const char* const kVectorNames[] = {
    "bert-bge",   "chameleon", "command-r",   "deepseek-coder", "deepseek-llm", "deepseek-r1-qwen",
    "falcon",     "gpt-2",     "llama-bpe",   "llama-spm",      "mpt",          "phi-3",
    "qwen2",      "refact",    "roberta-bpe", "starcoder",
};

std::string vocab_path(const std::string& name) { return shared_data("tokenizer/ggml-vocab-" + name + ".gguf"); }

class GgufVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufVectors, EncodesLikeReference) {
  const std::string name = GetParam();
  const std::string gguf = vocab_path(name);
  REQUIRE_FILE(gguf + ".inp");
  REQUIRE_FILE(gguf);  // vectors without their vocabulary are skipped
  const auto vectors = test::read_vectors(gguf + ".inp", gguf + ".out");
  ASSERT_EQ(vectors.inputs.size(), 46u);
  ASSERT_EQ(vectors.expected.size(), vectors.inputs.size());
  auto tok = Tokenizer::from_gguf(*GGUFFile::open(gguf));
  int failures = 0;
  for (size_t i = 0; i < vectors.inputs.size(); ++i) {
    const auto ids = tok->encode(vectors.inputs[i], /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids, vectors.expected[i]) << name << " input #" << i << " '" << vectors.inputs[i] << "'\n got "
                                        << ids_string(ids) << "\nwant " << ids_string(vectors.expected[i]);
    failures += ids != vectors.expected[i];
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, GgufVectors, ::testing::ValuesIn(kVectorNames),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// One tokenizer, every vector, four threads at once: same ids as alone.
TEST(TokenizerGguf, ConcurrentEncodeMatches) {
  std::vector<std::string> inputs;
  std::vector<std::unique_ptr<Tokenizer>> toks;
  std::vector<std::vector<std::vector<int32_t>>> expected;
  for (const char* name : kVectorNames) {
    const std::string gguf = vocab_path(name);
    if (!std::filesystem::exists(gguf) || !std::filesystem::exists(gguf + ".inp")) continue;
    auto v = test::read_vectors(gguf + ".inp", gguf + ".out");
    toks.push_back(Tokenizer::from_gguf(*GGUFFile::open(gguf)));
    expected.push_back(v.expected);
    if (inputs.empty()) inputs = v.inputs;
  }
  if (toks.empty()) GTEST_SKIP() << "no vocabularies in " << shared_data("tokenizer");
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t v = 0; v < toks.size(); ++v)
          for (size_t i = 0; i < inputs.size(); ++i)
            mismatches[t] += toks[v]->encode(inputs[(i + t) % inputs.size()], false, false) !=
                             expected[v][(i + t) % inputs.size()];
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// Vocabularies without vectors still load, and byte-level / byte-fallback
// ones give back every input exactly.
TEST(TokenizerGguf, RoundTripsText) {
  const std::string text = "Hello world! \xC3\xA9t\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99 \t\n  x";
  for (const char* name : {"baichuan", "gpt-neox", "gpt-2", "llama-spm", "falcon", "deepseek-llm", "starcoder"}) {
    const std::string gguf = vocab_path(name);
    if (!std::filesystem::exists(gguf)) continue;
    auto tok = Tokenizer::from_gguf(*GGUFFile::open(gguf));
    const auto ids = tok->encode(text, false, false);
    ASSERT_FALSE(ids.empty()) << name;
    std::string back = tok->decode(ids, false);
    if (tok->token_text(ids[0]).starts_with("\xE2\x96\x81")) back.erase(0, 1);  // SentencePiece dummy prefix
    EXPECT_EQ(back, text) << name << ": " << tok->describe();
  }
}

}  // namespace
}  // namespace pagellm
