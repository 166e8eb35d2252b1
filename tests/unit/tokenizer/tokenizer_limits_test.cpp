// Hostile tokenizer.json files: nesting bounded at parse and in the loader's
// own recursion over Sequence steps, ids checked before the vocabulary is
// sized, and a truncation / mutation sweep over trimmed real files.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_set>

#include "hostile_input.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using test::expect_error_with;

constexpr const char* kModel = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

// tokenizer.json text with `extra` members (",\"normalizer\": ...") after the model.
std::string tokenizer_json(const std::string& extra, const std::string& model = kModel) {
  return std::string("{\"model\": ") + model + extra + "}";
}

// n Sequence levels of `type` around `leaf`: {"type": "Sequence", "<list>": [ ... ]}.
std::string nested_sequence(const std::string& list_key, int n, const std::string& leaf) {
  std::string s;
  s.reserve(static_cast<size_t>(n) * 40 + leaf.size());
  for (int k = 0; k < n; ++k) s += R"({"type": "Sequence", ")" + list_key + "\": [";
  s += leaf;
  for (int k = 0; k < n; ++k) s += "]}";
  return s;
}

std::unique_ptr<Tokenizer> load_text(const test::ScratchDir& dir, const std::string& text) {
  test::write_bytes(dir.file("tokenizer.json"), text);
  return Tokenizer::from_hf_dir(dir.path());
}

}  // namespace

TEST(TokenizerLimits, TwoHundredThousandNestedSequencesAreRefusedAtParse) {
  test::ScratchDir dir("tok-deep");
  // 200,000 nested Sequence steps (~7 MB) crashed `pagellm tokenize` by recursion.
  const std::string norm = nested_sequence("normalizers", 200'000, R"({"type": "NFC"})");
  expect_error_with([&] { load_text(dir, tokenizer_json(", \"normalizer\": " + norm)); },
                    "tokenizer.json': JSON nesting depth exceeds the limit of 64");
  const std::string pre = nested_sequence("pretokenizers", 200'000, R"({"type": "Whitespace"})");
  expect_error_with([&] { load_text(dir, tokenizer_json(", \"pre_tokenizer\": " + pre)); },
                    "JSON nesting depth exceeds the limit of 64");
}

TEST(TokenizerLimits, SequenceNestingIsBoundedInTheLoader) {
  test::ScratchDir dir("tok-seq");
  // 20 levels are 41 JSON levels: within the parse limit, past the loader's.
  const struct {
    const char* member;
    const char* list;
    const char* leaf;
    const char* what;
  } cases[] = {
      {"normalizer", "normalizers", R"({"type": "NFC"})", "normalizer"},
      {"pre_tokenizer", "pretokenizers", R"({"type": "Whitespace"})", "pre-tokenizer"},
      {"post_processor", "processors", R"({"type": "ByteLevel"})", "post-processor"},
      {"decoder", "decoders", R"({"type": "Fuse"})", "decoder"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.member);
    const auto text = [&](int n) {
      return tokenizer_json(std::string(", \"") + c.member + "\": " + nested_sequence(c.list, n, c.leaf));
    };
    expect_error_with([&] { load_text(dir, text(20)); },
                      std::string(c.what) + " Sequence nesting exceeds the limit of 16");
    EXPECT_NO_THROW(load_text(dir, text(3)));
  }
}

TEST(TokenizerLimits, MissingAndMistypedFieldsAreErrors) {
  test::ScratchDir dir("tok-fields");
  // Each of these read a missing key through const operator[] (undefined behaviour).
  const char* extras[] = {
      R"(, "normalizer": {"type": "Sequence"})",
      R"(, "normalizer": {"type": "Replace", "content": "x"})",
      R"(, "normalizer": {"type": "Prepend"})",
      R"(, "pre_tokenizer": {"type": "Sequence"})",
      R"(, "pre_tokenizer": {"type": "Split"})",
      R"(, "post_processor": {"type": "BertProcessing", "cls": ["a"], "sep": []})",
      R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {}}]})",
      R"(, "post_processor": {"type": "TemplateProcessing"})",
      R"(, "decoder": {"type": "Sequence"})",
      R"(, "added_tokens": [{"content": "x"}])",
      R"(, "added_tokens": [{"id": 1e30, "content": "x"}])",
      R"(, "added_tokens": [{"id": -1, "content": "x"}])",
      R"(, "added_tokens": [7])",
  };
  for (const char* extra : extras) {
    SCOPED_TRACE(extra);
    EXPECT_THROW(load_text(dir, tokenizer_json(extra)), Error);
  }
  expect_error_with([&] { load_text(dir, tokenizer_json(R"(, "added_tokens": [{"id": 1e30, "content": "x"}])")); },
                    "token id 1e+30 is not an integer from 0 to 2147483647");
  // added_tokens_decoder keys must be ids (std::stoll threw std::invalid_argument).
  test::write_bytes(dir.file("tokenizer_config.json"), R"({"added_tokens_decoder": {"abc": {"content": "x"}}})");
  expect_error_with([&] { load_text(dir, tokenizer_json("")); }, "added_tokens_decoder key 'abc' is not a token id");
}

TEST(TokenizerLimits, PostProcessorIdsOutsideTheVocabularyAreErrors) {
  test::ScratchDir dir("tok-post");
  // These ids went into every encoded prompt unchecked (a fuzzer finding):
  // the model would read past its embedding table.
  const char* extras[] = {
      R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},)"
      R"( {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [5000]}}})",
      R"(, "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 5000], "sep": ["[SEP]", 0]})",
      R"(, "post_processor": {"type": "RobertaProcessing", "cls": ["<s>", 0], "sep": ["</s>", 5000]})",
  };
  for (const char* extra : extras) {
    SCOPED_TRACE(extra);
    expect_error_with([&] { load_text(dir, tokenizer_json(extra)); },
                      "post-processor token id 5000 is outside the vocabulary");
  }
}

TEST(TokenizerLimits, SparseIdsAreRefusedBeforeSizingTheVocabulary) {
  test::ScratchDir dir("tok-ids");
  // One id of 10^9 sized a 10^9-entry table (~40 GB) before.
  const std::string model = R"({"type": "BPE", "vocab": {"a": 0, "b": 1000000000}, "merges": []})";
  expect_error_with([&] { load_text(dir, tokenizer_json("", model)); },
                    "token id 1000000000 is far past the 2 tokens listed");
  expect_error_with([&] { load_text(dir, tokenizer_json(R"(, "added_tokens": [{"id": 900000000, "content": "x"}])")); },
                    "token id 900000000 is far past");
}

namespace {

// A real tokenizer.json cut down to its first `keep` ids (added tokens
// renumbered after them), its members in the usual order with the model last.
std::string trimmed_tokenizer(const std::string& path, int64_t keep) {
  const json j = json::parse(test::read_bytes(path));  // std::map: ordered_json is quadratic here
  std::vector<std::pair<int64_t, std::string>> kept;
  std::unordered_set<std::string> texts;
  for (const auto& [text, id] : j.at("model").at("vocab").items())
    if (id.get<int64_t>() < keep) kept.emplace_back(id.get<int64_t>(), text), texts.insert(text);
  std::sort(kept.begin(), kept.end());
  ordered_json model = ordered_json::object();
  for (const auto& [key, v] : j.at("model").items())
    if (key != "vocab" && key != "merges") model[key] = v;
  ordered_json vocab = ordered_json::object();
  for (const auto& [id, text] : kept) vocab[text] = id;
  model["vocab"] = vocab;
  ordered_json merges = ordered_json::array();
  for (const auto& m : j.at("model").at("merges")) {
    const std::string s =
        m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>();
    const size_t sp = s.find(' ', 1);
    if (sp != std::string::npos && texts.contains(s.substr(0, sp)) && texts.contains(s.substr(sp + 1)) &&
        texts.contains(s.substr(0, sp) + s.substr(sp + 1)))
      merges.push_back(ordered_json(m));
  }
  model["merges"] = merges;
  ordered_json added = ordered_json::array();
  int64_t next = keep;
  for (auto a : j.at("added_tokens")) {
    if (a.at("id").get<int64_t>() >= keep) {
      if (next == keep + 4) continue;
      a["id"] = next++;
    }
    added.push_back(ordered_json(a));
  }
  ordered_json out = ordered_json::object();
  for (const char* key :
       {"version", "truncation", "padding", "normalizer", "pre_tokenizer", "post_processor", "decoder"})
    if (j.contains(key)) out[key] = j.at(key);
  out["added_tokens"] = added;
  out["model"] = model;
  return out.dump(2);
}

}  // namespace

// Every truncation up to the vocabulary, a stride through the rest, and
// mutations: each load succeeds or throws pagellm::Error.
TEST(TokenizerLimits, TruncationAndMutationSweep) {
  for (const char* name : {"llama2", "llama3"}) {
    SCOPED_TRACE(name);
    const std::string src = test::shared_data(std::string("hf-tokenizers/") + name + "/tokenizer.json");
    REQUIRE_FILE(src);
    test::ScratchDir dir(std::string("tok-sweep-") + name);
    const std::string good = trimmed_tokenizer(src, 600);
    const std::string path = dir.file("tokenizer.json");
    test::write_bytes(path, good);
    ASSERT_NO_THROW(Tokenizer::from_hf_dir(dir.path())->encode("Hello world", true, false));
    const size_t dense_end = std::min(good.size(), good.find("\"vocab\"") + 256);
    int loaded = 0, refused = 0;
    auto attempt = [&](const std::string& text, const std::string& where) {
      test::write_bytes(path, text);
      const bool ok =
          test::loads_or_errors([&] { Tokenizer::from_hf_dir(dir.path())->encode("Hi there", true, true); }, where);
      ++(ok ? loaded : refused);
    };
    for (size_t n = 0; n < dense_end; ++n) attempt(good.substr(0, n), "cut at " + std::to_string(n));
    for (size_t k = 0; k < 200; ++k) {
      const size_t n = dense_end + (good.size() - dense_end) * k / 200;
      attempt(good.substr(0, n), "cut at " + std::to_string(n));
    }
    EXPECT_EQ(loaded, 0) << "a truncated tokenizer.json loaded";
    std::mt19937 rng(11);
    for (int iter = 0; iter < 400; ++iter) {
      std::string b = good;
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
        const size_t at = rng() % 2 ? rng() % dense_end : rng() % b.size();
        b[at] = static_cast<char>(rng() % 2 ? rng() : "{}[]\",:0\\"[rng() % 9]);
      }
      attempt(b, "mutation " + std::to_string(iter));
    }
    std::printf("  %s: %zu bytes, dense to %zu; %d loaded, %d refused\n", name, good.size(), dense_end, loaded,
                refused);
  }
}

TEST(TokenizerLimits, TokenizeOnADeepTokenizerJsonExitsWithAClearError) {
  const std::string bin = test::pagellm_binary();
  if (bin.empty()) GTEST_SKIP() << "pagellm binary not built";
  test::ScratchDir dir("tok-cli");
  test::write_bytes(dir.file("tokenizer.json"),
                    tokenizer_json(", \"normalizer\": " + nested_sequence("normalizers", 200'000, "null")));
  const auto r = test::run_cli(bin, "tokenize -m '" + dir.path() + "' hello");
  ASSERT_TRUE(r.exited) << r.output;
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("JSON nesting depth exceeds the limit of 64"), std::string::npos) << r.output;
}

}  // namespace pagellm
