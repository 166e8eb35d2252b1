// The one concrete Tokenizer: special-token split -> normalizers ->
// pre-tokenizers -> (byte-level mapping) -> model, assembled by the GGUF and
// Hugging Face loaders. Everything here is immutable after loading.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/models.h"
#include "tokenizer/text_steps.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace pagellm::tok {

// How a token's text becomes bytes (token_to_piece).
enum class PieceStyle {
  SentencePiece,  // U+2581 -> space, <0xAB> -> byte
  ByteLevel,      // GPT-2 byte alphabet -> bytes
  WordPieceGguf,  // "▁word" -> " word", continuation as is
  WordPieceHf,    // "##ing" -> "ing", others -> " " + text
};

class PipelineTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special) const override;
  int32_t vocab_size() const override { return vocab.size(); }
  const std::string& token_text(int32_t id) const override;
  TokenType token_type(int32_t id) const override;
  std::optional<int32_t> find_token(std::string_view text) const override;
  std::string describe() const override { return description; }

  // --- assembled by the loaders
  Vocabulary vocab;
  SpecialTokenMatcher specials;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool byte_level = false;  // map piece bytes to the GPT-2 alphabet before the model
  std::unique_ptr<Model> model;
  PieceStyle piece_style = PieceStyle::SentencePiece;
  std::vector<int32_t> prefix_ids, suffix_ids;  // added around the text by add_special
  std::string description;

  // Sets the public special-token facts; eog gets eos and EOT-like tokens added.
  void set_special(int32_t bos, int32_t eos, int32_t unk, bool add_bos, bool add_eos, std::vector<int32_t> eog,
                   std::string chat_template);
  // Builds the special-token matcher from token types: control / unknown
  // tokens need parse_special, user-defined ones always match.
  void build_special_matcher_from_types();
  // The pair template (Tokenizer::encode_pair): prefix a middle b suffix.
  void set_pair_template(std::vector<int32_t> prefix, std::vector<int32_t> middle, std::vector<int32_t> suffix) {
    pair_ = {true, std::move(prefix), std::move(middle), std::move(suffix)};
  }

 private:
  void encode_segment(std::string_view segment, bool is_first, Workspace& ws, std::vector<int32_t>& out) const;
};

// Token texts that end a turn in common chat formats.
bool is_eot_like_text(std::string_view text);

}  // namespace pagellm::tok
