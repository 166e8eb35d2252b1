// The Unicode facts the tokenizers need beyond PCRE2: UTF-8 coding, general
// categories (BERT splitting), NFD / NFC and lowercase (normalizers). Tables
// are generated from Python's unicodedata by tools/gen_unicode_tables.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;

enum class Category : uint8_t {
  Cn, Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe,
  Pi, Pf, Po, Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co,
};

// Length of the valid UTF-8 sequence starting at s[pos], or 0 when the bytes
// there are not one (stray continuation byte, overlong, surrogate, truncated).
size_t valid_char_len(std::string_view s, size_t pos);
// Decodes the code point at s[pos] and sets *len to the bytes consumed; an
// invalid sequence gives U+FFFD and consumes one byte.
uint32_t decode_char(std::string_view s, size_t pos, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
// Invalid bytes become U+FFFD.
std::vector<uint32_t> to_codepoints(std::string_view s);
std::string from_codepoints(const std::vector<uint32_t>& cps);

Category category(uint32_t cp);
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_punctuation(uint32_t cp);  // P*
bool is_symbol(uint32_t cp);       // S*
bool is_other(uint32_t cp);        // Cc, Cf, Cn, Co (BERT's "control")
// The Unicode White_Space property.
bool is_whitespace(uint32_t cp);
int combining_class(uint32_t cp);

// Canonical decomposition / composition (UAX #15). Invalid bytes become U+FFFD.
void nfd(std::vector<uint32_t>& cps);
void nfc(std::vector<uint32_t>& cps);
std::string nfd(std::string_view s);
std::string nfc(std::string_view s);
// Full lowercase mapping (U+0130 becomes two code points).
std::string lowercase(std::string_view s);
void lowercase(std::vector<uint32_t>& cps);

// Generated tables (unicode_data.cpp).
namespace data {
struct RangeValue {
  uint32_t start;
  uint8_t value;
};
struct Decomposition {
  uint32_t cp;
  uint16_t offset;
  uint8_t len;
};
struct Composition {
  uint64_t key;  // first << 21 | second
  uint32_t cp;
};
struct CodepointMap {
  uint32_t from, to;
};
extern const RangeValue kCategoryRuns[];
extern const size_t kCategoryRunsSize;
extern const RangeValue kCombiningClassRuns[];
extern const size_t kCombiningClassRunsSize;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionsSize;
extern const uint32_t kDecompositionData[];
extern const Composition kCompositions[];
extern const size_t kCompositionsSize;
extern const CodepointMap kLowercase[];
extern const size_t kLowercaseSize;
}  // namespace data

}  // namespace pagellm::unicode
