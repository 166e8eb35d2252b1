// SentencePiece's precompiled normalization map (Hugging Face's "Precompiled"
// normalizer, XLM-R's and T5's tokenizer.json; a GGUF UGM vocabulary's
// tokenizer.ggml.precompiled_charsmap): a trie from UTF-8 sequences to their
// normalized text (nmt_nfkc: NFKC plus a few rules), stored as
//   uint32 trie_bytes | trie units (uint32 each) | NUL-terminated replacements.
// The trie is a XOR-compressed double array: a unit packs BASE (bits 10-30,
// shifted left 8 more when bit 9 is set), a leaf flag (bit 8) and the byte
// that leads to it (bits 0-7, with bit 31 in the check so value units never
// match); a child of node s by byte c sits at s.base ^ c, and a leaf's value
// unit (at its base) holds the replacement's offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::tok {

class PrecompiledCharsmap {
 public:
  // The map's bytes; throws Error when they are not one.
  explicit PrecompiledCharsmap(std::string bytes);
  static PrecompiledCharsmap from_base64(std::string_view text);

  // Rewrites text as Hugging Face's Precompiled normalizer does: per grapheme
  // (a character and the combining marks, variation selectors and
  // zero-width-joined characters after it), the replacement of its shortest
  // prefix in the map when the grapheme is under 6 bytes and has one, else
  // each character's own replacement, or the character.
  void normalize(std::string& text) const;

 private:
  // The replacement of the shortest prefix of s that the map holds; false when none.
  bool transform(std::string_view s, std::string_view& out) const;
  uint32_t unit(size_t i) const;
  std::vector<uint32_t> units_;
  std::string replacements_;
};

}  // namespace pagellm::tok
