// Tokenizer behaviour beyond the reference vectors: stories260K golden ids,
// streaming detokenization, garbage input, special tokens, errors.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/util.h"
#include "format/gguf.h"
#include "hostile_input.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"
#include "tokenizer_test_util.h"

namespace pagellm {
namespace {

using json = nlohmann::json;

std::unique_ptr<Tokenizer> gguf_vocab(const std::string& name) {
  return Tokenizer::from_gguf(*GGUFFile::open(test::shared_data("tokenizer/ggml-vocab-" + name + ".gguf")));
}

#define REQUIRE_VOCAB(name) REQUIRE_FILE(test::shared_data("tokenizer/ggml-vocab-" + std::string(name) + ".gguf"))

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                       std::vector<std::string>* deltas = nullptr) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    std::string d = detok.push(id);
    EXPECT_TRUE(is_valid_utf8(d)) << "delta after id " << id;
    if (deltas) deltas->push_back(d);
    out += d;
  }
  out += detok.flush();
  return out;
}

// ---------------------------------------------------------------- stories260K

TEST(TokenizerStories, PromptAndGreedyText) {
  const std::string model = test::shared_data("models/stories260K.gguf");
  const std::string golden = test::shared_data("models/stories260K-greedy.json");
  REQUIRE_FILE(model);
  REQUIRE_FILE(golden);
  auto tok = Tokenizer::load(model);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->encode("Once upon a time", true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->encode("Once upon a time", false, false), (std::vector<int32_t>{403, 407, 261, 378}));
  const json g = json::parse(test::read_file(golden));
  const auto ids = g["generated_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 252u);
  const std::string text = g["generated_text"].get<std::string>();
  EXPECT_EQ(tok->decode(ids, true), text);
  EXPECT_EQ(stream_all(*tok, ids, true), text);
  EXPECT_EQ(tok->decode(g["prompt_ids_with_bos"].get<std::vector<int32_t>>(), true), " Once upon a time");
}

// ---------------------------------------------------------------- streaming

TEST(TokenizerDetokenizer, HoldsSplitCharactersSentencePiece) {
  REQUIRE_VOCAB("llama-spm");
  auto tok = gguf_vocab("llama-spm");
  const std::string text = "🦙 llama 你好世界 ✅ 😶‍🌫️ done";
  const auto ids = tok->encode(text, true, false);
  std::vector<std::string> deltas;
  const std::string streamed = stream_all(*tok, ids, true, &deltas);
  EXPECT_EQ(streamed, " " + text);  // SentencePiece dummy prefix
  EXPECT_EQ(streamed, tok->decode(ids, true));
  // 🦙 is not in the Llama vocabulary: four byte tokens, text only on the fourth.
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(tok->token_type(ids[2]), TokenType::Byte);
  EXPECT_EQ(tok->token_text(ids[2]), "<0xF0>");
  EXPECT_EQ(deltas[2], "");
  EXPECT_EQ(deltas[3], "");
  EXPECT_EQ(deltas[4], "");
  EXPECT_EQ(deltas[5], "🦙");
}

TEST(TokenizerDetokenizer, HoldsSplitCharactersByteLevel) {
  REQUIRE_VOCAB("gpt-2");
  auto tok = gguf_vocab("gpt-2");
  const std::string text = "🦙🦙 日本語のテキスト 한국어 Ünïcödé ✅";
  const auto ids = tok->encode(text, false, false);
  std::vector<std::string> deltas;
  EXPECT_EQ(stream_all(*tok, ids, true, &deltas), text);
  // Some token must end mid-character for this test to mean anything.
  size_t held = 0;
  for (size_t i = 0; i < ids.size(); ++i) held += deltas[i].empty();
  EXPECT_GT(held, 0u);
  // Per-token pieces concatenate to the exact bytes.
  EXPECT_EQ(tok->decode(ids, false), text);
}

TEST(TokenizerDetokenizer, FlushAndInvalidBytes) {
  REQUIRE_VOCAB("llama-spm");
  auto tok = gguf_vocab("llama-spm");
  const int32_t f0 = tok->find_token("<0xF0>").value(), x9f = tok->find_token("<0x9F>").value(), ff = tok->find_token("<0xFF>").value();
  {
    IncrementalDetokenizer d(*tok, true);
    EXPECT_EQ(d.push(f0), "");
    EXPECT_EQ(d.push(x9f), "");
    EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // unfinished character
    EXPECT_EQ(d.flush(), "");
  }
  {
    IncrementalDetokenizer d(*tok, true);
    EXPECT_EQ(d.push(ff), "\xEF\xBF\xBD");  // can never start a character
    EXPECT_EQ(d.push(f0), "");
    EXPECT_EQ(d.push(tok->find_token("▁a").value()), "\xEF\xBF\xBD a");  // interrupted character
  }
  {
    IncrementalDetokenizer skip(*tok, true), keep(*tok, false);
    EXPECT_EQ(skip.push(tok->bos_id()), "");
    EXPECT_EQ(keep.push(tok->bos_id()), "<s>");
  }
}

// ---------------------------------------------------------------- garbage and edges

TEST(TokenizerInput, GarbageNeverCrashesAndBytesSurvive) {
  REQUIRE_VOCAB("llama-spm");
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> toks;
  for (const char* name : {"llama-spm", "gpt-2", "bert-bge", "deepseek-llm", "falcon"})
    if (std::filesystem::exists(test::shared_data(std::string("tokenizer/ggml-vocab-") + name + ".gguf")))
      toks.emplace_back(name, gguf_vocab(name));
  for (const char* name : {"llama2", "qwen3"})
    if (std::filesystem::exists(test::shared_data(std::string("hf-tokenizers/") + name)))
      toks.emplace_back(std::string("hf-") + name, Tokenizer::from_hf_dir(test::shared_data(std::string("hf-tokenizers/") + name)));
  std::mt19937 rng(1234);
  std::vector<std::string> inputs = {"\xFF", "\xC3", "a\xE2\x82", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC0\xAF",
                                     std::string("nul\0byte", 8), "<s\xFF>", "\xF0\x9F\xA6"};
  for (int i = 0; i < 60; ++i) {
    std::string s(1 + rng() % 40, ' ');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 128 : rng() % 128);
    inputs.push_back(s);
  }
  for (const auto& [name, tok] : toks) {
    for (const std::string& s : inputs) {
      for (bool parse : {false, true}) {
        const auto ids = tok->encode(s, true, parse);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size()) << name;
        if (parse) continue;
        // Byte fallback (SentencePiece) and byte-level BPE keep invalid bytes as
        // byte tokens. (Not every byte-level vocabulary has all 256 bytes: falcon
        // lacks e.g. 0xFF, and deepseek-llm's user-defined "ÿ"-like tokens shadow them.)
        std::string back = tok->decode(ids, true);
        if (name == "llama-spm" || name == "hf-llama2") {
          ASSERT_FALSE(back.empty());
          back.erase(0, 1);  // dummy prefix space
          EXPECT_EQ(back, s) << name;
        } else if (name == "gpt-2") {
          EXPECT_EQ(back, s) << name;
        }
      }
    }
    EXPECT_TRUE(tok->encode("", false, false).empty()) << name;
    EXPECT_TRUE(tok->encode("", false, true).empty()) << name;
  }
}

TEST(TokenizerInput, EmptyWithSpecialsGivesOnlyBosEos) {
  REQUIRE_VOCAB("llama-spm");
  EXPECT_EQ(gguf_vocab("llama-spm")->encode("", true, false), (std::vector<int32_t>{1}));
  REQUIRE_VOCAB("bert-bge");
  EXPECT_EQ(gguf_vocab("bert-bge")->encode("", true, false), (std::vector<int32_t>{101, 102}));
  EXPECT_EQ(gguf_vocab("bert-bge")->encode("Hello world", true, false), (std::vector<int32_t>{101, 7592, 2088, 102}));
}

TEST(TokenizerSpecial, ParseSpecialGguf) {
  REQUIRE_VOCAB("llama-spm");
  auto tok = gguf_vocab("llama-spm");
  EXPECT_EQ(tok->encode("<s>Hello</s>", false, true), (std::vector<int32_t>{1, 15043, 2}));
  const auto plain = tok->encode("<s>Hello</s>", false, false);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(tok->decode({1, 15043, 2}, false), "<s> Hello</s>");
  EXPECT_EQ(tok->decode({1, 15043, 2}, true), " Hello");
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(15043));
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
}

TEST(TokenizerSpecial, PhiChatTemplateAndEog) {
  REQUIRE_VOCAB("phi-3");
  auto tok = gguf_vocab("phi-3");
  EXPECT_FALSE(tok->chat_template().empty());
  const int32_t end = tok->find_token("<|end|>").value();
  EXPECT_TRUE(tok->is_eog(end));
  EXPECT_TRUE(tok->is_eog(tok->eos_id()));
  const auto ids = tok->encode("<|user|>\nHi<|end|>", false, true);
  EXPECT_EQ(ids.front(), tok->find_token("<|user|>").value());
  EXPECT_EQ(ids.back(), end);
}

TEST(TokenizerSpecial, HfSpecialTokenFacts) {
  const std::string dir = test::shared_data("hf-tokenizers/");
  REQUIRE_FILE(dir + "qwen3/tokenizer.json");
  auto qwen = Tokenizer::from_hf_dir(dir + "qwen3");
  EXPECT_EQ(qwen->bos_id(), -1);
  EXPECT_EQ(qwen->eos_id(), 151645);  // <|im_end|>
  EXPECT_FALSE(qwen->add_bos());
  EXPECT_TRUE(qwen->is_eog(151645));
  EXPECT_TRUE(qwen->is_eog(151643));  // <|endoftext|>
  EXPECT_FALSE(qwen->chat_template().empty());
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151667));  // <think> is a non-special added token
  EXPECT_EQ(qwen->token_type(151667), TokenType::UserDefined);
  EXPECT_EQ(qwen->decode({151644, 872, 198, 6023, 151645}, true), "user\nhi");

  auto llama3 = Tokenizer::from_hf_dir(dir + "llama3/tokenizer.json");
  EXPECT_EQ(llama3->bos_id(), 128000);
  EXPECT_EQ(llama3->eos_id(), 128001);
  EXPECT_FALSE(llama3->add_bos());  // this tokenizer.json's post-processor adds nothing
  for (const char* eot : {"<|eot_id|>", "<|end_of_text|>"}) {  // Llama 3.0: no <|eom_id|>
    ASSERT_TRUE(llama3->find_token(eot).has_value()) << eot;
    EXPECT_TRUE(llama3->is_eog(*llama3->find_token(eot))) << eot;
  }
  EXPECT_EQ(llama3->eog_ids(), (std::vector<int32_t>{128001, 128009}));
  EXPECT_FALSE(llama3->chat_template().empty());

  auto llama2 = Tokenizer::from_hf_dir(dir + "llama2");
  EXPECT_TRUE(llama2->add_bos());
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_EQ(llama2->encode("Hello", true, false).front(), 1);
  EXPECT_EQ(llama2->token_to_piece(llama2->find_token("<0x0A>").value(), true), "\n");
}

TEST(TokenizerSpecial, MatcherIsLeftmostLongest) {
  tok::SpecialTokenMatcher m;
  m.add("ab", 1, true);
  m.add("abc", 2, true);
  m.add("bcd", 3, true);
  m.add("<ctl>", 4, false);
  m.add("<l>", 5, true, /*lstrip=*/true, /*rstrip=*/false);
  m.add("<r>", 6, true, false, /*rstrip=*/true);
  auto run = [&](std::string_view text, bool parse) {
    std::vector<tok::SpecialTokenMatcher::Segment> segs;
    m.split(text, parse, segs);
    std::string out;
    for (const auto& s : segs) {
      if (s.token >= 0) {
        out += fmt::format("[{}]", s.token);
      } else {
        out += '\'';
        out += text.substr(s.begin, s.end - s.begin);
        out += '\'';
      }
    }
    return out;
  };
  EXPECT_EQ(run("xabcdx", false), "'x'[2]'dx'");
  EXPECT_EQ(run("abab", false), "[1][1]");
  EXPECT_EQ(run("a<ctl>b", false), "'a<ctl>b'");
  EXPECT_EQ(run("a<ctl>b", true), "'a'[4]'b'");
  EXPECT_EQ(run("x  <l>  y", false), "'x'[5]'  y'");
  EXPECT_EQ(run("x  <r>  y", false), "'x  '[6]'y'");
  EXPECT_EQ(run("", true), "");
}

// ---------------------------------------------------------------- Unicode

TEST(TokenizerUnicode, NormalizationForms) {
  EXPECT_EQ(unicode::nfc("e\xCC\x81"), "\xC3\xA9");                      // e + acute -> é
  EXPECT_EQ(unicode::nfd("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "각");  // Hangul jamo compose
  EXPECT_EQ(unicode::nfd("각"), "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
  EXPECT_EQ(unicode::nfd("\xE1\xB8\x8B\xCC\xA3"), "d\xCC\xA3\xCC\x87");   // ḋ + dot below: reordered
  EXPECT_EQ(unicode::nfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");  // -> ḍ + dot above
  EXPECT_EQ(unicode::nfc("\xE2\x84\xA6"), "\xCE\xA9");                    // Ohm sign -> Omega (singleton)
  EXPECT_EQ(unicode::nfc("A\xCC\x8A"), "\xC3\x85");
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::lowercase("ÀÉÎ ΣΑΣ İ Ж"), "àéî σασ i\xCC\x87 ж");
  EXPECT_EQ(unicode::nfc("\xFF" "a"), "\xEF\xBF\xBD" "a");  // invalid byte -> U+FFFD
  EXPECT_TRUE(unicode::is_punctuation(U'¿'));
  EXPECT_TRUE(unicode::is_symbol(U'€'));
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  EXPECT_FALSE(unicode::is_whitespace(0x200B));
  EXPECT_EQ(unicode::category(U'a'), unicode::Category::Ll);
  EXPECT_EQ(unicode::category(0x0301), unicode::Category::Mn);
}

// ---------------------------------------------------------------- errors

TEST(TokenizerErrors, MissingOrBadVocabularies) {
  const std::string dir = test::temp_dir();
  {
    GGUFWriter w;
    w.set_string("general.architecture", "llama");
    w.write(dir + "/novocab.gguf");
    try {
      Tokenizer::load(dir + "/novocab.gguf");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no vocabulary"), std::string::npos) << e.what();
    }
  }
  {
    GGUFWriter w;
    w.set_string("tokenizer.ggml.model", "rwkv");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    w.write(dir + "/rwkv.gguf");
    try {
      Tokenizer::load(dir + "/rwkv.gguf");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'rwkv'"), std::string::npos) << e.what();
    }
  }
  // UGM ("t5"): a charsmap that is not bytes, or not a charsmap, and
  // unescaped whitespace are refused by name.
  auto t5 = [&](const std::function<void(GGUFWriter&)>& extra) {
    GGUFWriter w;
    w.set_string("tokenizer.ggml.model", "t5");
    w.set_string_array("tokenizer.ggml.tokens", {"<pad>", "</s>", "<unk>", "\u2581a", "b"});
    w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2});
    w.set_i32_array("tokenizer.ggml.token_type", {3, 3, 2, 1, 1});
    w.set_bool("tokenizer.ggml.add_space_prefix", true);
    extra(w);
    w.write(dir + "/t5.gguf");
    return Tokenizer::load(dir + "/t5.gguf");
  };
  EXPECT_EQ(t5([](GGUFWriter&) {})->encode("ab", true, false), (std::vector<int32_t>{3, 4, 1}));  // ▁a b </s>
  const std::string charsmap = "tokenizer.ggml.precompiled_charsmap";
  test::expect_error_with([&] { t5([&](GGUFWriter& w) { w.set_string(charsmap, "x"); }); }, "precompiled_charsmap");
  test::expect_error_with([&] { t5([&](GGUFWriter& w) { w.set_i32_array(charsmap, {1}); }); }, "precompiled_charsmap");
  test::expect_error_with([&] { t5([](GGUFWriter& w) { w.set_bool("tokenizer.ggml.escape_whitespaces", false); }); },
                          "escape_whitespaces");
  EXPECT_THROW(Tokenizer::load(dir + "/does-not-exist.gguf"), Error);
  EXPECT_THROW(Tokenizer::from_hf_dir(dir), Error);  // no tokenizer.json
  {
    std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ";
    EXPECT_THROW(Tokenizer::load(dir + "/tokenizer.json"), Error);
    std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "WordLevel", "vocab": {"a": 0}}})";
    EXPECT_THROW(Tokenizer::load(dir), Error);
    // Unigram: a list of [piece, score]; unk_id inside it
    std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": [["a"]]}})";
    EXPECT_THROW(Tokenizer::load(dir), Error);
    std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "Unigram", "unk_id": 5, "vocab": [["a", -1.0]]}})";
    EXPECT_THROW(Tokenizer::load(dir), Error);
  }
  REQUIRE_VOCAB("gpt-2");
  auto tok = gguf_vocab("gpt-2");
  EXPECT_THROW(tok->token_to_piece(-1, true), InvalidRequest);
  EXPECT_THROW(tok->decode({50257}, false), InvalidRequest);
  EXPECT_FALSE(tok->find_token("definitely-not-a-token").has_value());
}

// A vocabulary smaller than a model type's default special ids (BERT's 100-102,
// llama's 1 and 2) must not hand out those ids (found by the gguf fuzzer).
TEST(TokenizerErrors, DefaultSpecialIdsOutsideSmallVocabulary) {
  const std::string dir = test::temp_dir();
  for (const char* model : {"bert", "llama", "gpt2"}) {
    GGUFWriter w;
    w.set_string("tokenizer.ggml.model", model);
    w.set_string_array("tokenizer.ggml.tokens", {"a"});
    w.set_string_array("tokenizer.ggml.merges", {});
    const std::string path = dir + "/small-" + model + ".gguf";
    w.write(path);
    const auto tok = Tokenizer::load(path);
    for (int32_t id : tok->encode("a b [CLS] <s> zz", true, true))
      EXPECT_TRUE(id >= 0 && id < tok->vocab_size()) << model << ": id " << id;
  }
}

// A minimal tokenizer.json written here: WordPiece model, BERT normalizer and
// pre-tokenizer, BertProcessing.
TEST(TokenizerHf, MinimalWordPiece) {
  const std::string dir = test::temp_dir() + "/wp";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << R"({
    "added_tokens": [{"id": 0, "content": "[UNK]", "special": true}, {"id": 1, "content": "[CLS]", "special": true},
                     {"id": 2, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 1], "sep": ["[SEP]", 2]},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "wor": 4, "##ld": 5, "!": 6, "cafe": 7}}
  })";
  auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok->encode("Hello World! Café xyz", true, false), (std::vector<int32_t>{1, 3, 4, 5, 6, 7, 0, 2}));
  EXPECT_EQ(tok->decode({3, 4, 5}, true), " hello world");
}

}  // namespace
}  // namespace pagellm
