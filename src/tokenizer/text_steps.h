// The text stages before a model: normalizer steps (rewrite a segment of raw
// text) and pre-tokenizer steps (cut it into pieces), in the shapes Hugging
// Face's tokenizer.json describes and the GGUF vocabularies imply.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/charsmap.h"
#include "tokenizer/regex_split.h"

namespace pagellm::tok {

struct BertOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;
  bool lowercase = true;
};

struct NormalizerStep {
  enum class Kind {
    Prepend,           // a: prepended to non-empty text (HF Prepend)
    PrependIfMissing,  // a: prepended unless text starts with it; first_only: only the input's first segment
    Replace,           // a -> b everywhere (literal), or regex -> b
    NFC,
    NFD,
    Lowercase,
    Strip,             // whitespace on the left (first_only=true) / right (flag)
    Bert,
    Precompiled,       // SentencePiece's charsmap (charsmap)
  };
  NormalizerStep(Kind k, std::string a_ = {}, std::string b_ = {}) : kind(k), a(std::move(a_)), b(std::move(b_)) {}
  Kind kind;
  std::string a, b;
  std::shared_ptr<const Regex> regex;  // Replace with a regex pattern
  bool first_only = false;
  bool strip_left = false, strip_right = false;
  BertOptions bert;
  std::shared_ptr<const PrecompiledCharsmap> charsmap;  // Precompiled
};

// Applies the steps to one segment of input. is_first: the segment starts the input text.
void apply_normalizers(const std::vector<NormalizerStep>& steps, std::string& text, bool is_first);

struct PreTokenizerStep {
  enum class Kind { Split, Bert };
  PreTokenizerStep(Kind k, SplitRule r = {}) : kind(k), rule(std::move(r)) {}
  Kind kind;
  SplitRule rule;  // Split
};

// Cuts text into pieces (spans), applying the steps in order.
void apply_pre_tokenizers(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                          std::vector<Span>& pieces, std::vector<Span>& scratch);

// BERT: whitespace separates (dropped), punctuation stands alone.
void bert_split(std::string_view text, const std::vector<Span>& in, std::vector<Span>& out);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
void byte_level_encode(std::string_view bytes, std::string& out);
// Inverse for one code point; -1 when cp is not in the alphabet.
int byte_level_decode(uint32_t cp);

}  // namespace pagellm::tok
