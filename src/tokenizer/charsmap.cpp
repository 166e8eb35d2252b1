#include "tokenizer/charsmap.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace pagellm::tok {

PrecompiledCharsmap::PrecompiledCharsmap(std::string bytes) {
  PAGELLM_CHECK(bytes.size() >= 4, "precompiled_charsmap: {} bytes, too short for its header", bytes.size());
  uint32_t trie_bytes = 0;
  for (int k = 3; k >= 0; --k) trie_bytes = trie_bytes << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(k)]);
  PAGELLM_CHECK(trie_bytes % 4 == 0 && trie_bytes > 0 && trie_bytes <= bytes.size() - 4,
                "precompiled_charsmap: a trie of {} bytes in {} bytes", trie_bytes, bytes.size());
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + 4 + 4 * i);
    units_[i] = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }
  replacements_ = bytes.substr(4 + trie_bytes);
}

PrecompiledCharsmap PrecompiledCharsmap::from_base64(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    PAGELLM_CHECK(v >= 0, "precompiled_charsmap: not base64 (byte {})", static_cast<int>(static_cast<unsigned char>(c)));
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>(acc >> bits & 0xFF));
    }
  }
  return PrecompiledCharsmap(std::move(bytes));
}

uint32_t PrecompiledCharsmap::unit(size_t i) const {
  PAGELLM_CHECK(i < units_.size(), "precompiled_charsmap: trie index {} past its {} units", i, units_.size());
  return units_[i];
}

bool PrecompiledCharsmap::transform(std::string_view s, std::string_view& out) const {
  auto base = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  size_t node = base(unit(0));
  for (unsigned char c : s) {
    if (c == 0) return false;
    node ^= c;
    const uint32_t u = unit(node);
    if ((u & ((1u << 31) | 0xFF)) != c) return false;  // not a child of the node
    node ^= base(u);
    if ((u >> 8) & 1) {  // a leaf: the value unit below holds the replacement's offset
      const size_t at = unit(node) & ((1u << 31) - 1);
      PAGELLM_CHECK(at < replacements_.size(), "precompiled_charsmap: a replacement at {} past {} bytes", at,
                    replacements_.size());
      const size_t end = replacements_.find('\0', at);
      PAGELLM_CHECK(end != std::string::npos, "precompiled_charsmap: an unterminated replacement");
      out = std::string_view(replacements_).substr(at, end - at);
      return true;
    }
  }
  return false;
}

namespace {

// Characters that stay in the grapheme of the character before them.
bool extends_grapheme(uint32_t cp) {
  const unicode::Category c = unicode::category(cp);
  return c == unicode::Category::Mn || c == unicode::Category::Mc || c == unicode::Category::Me || cp == 0x200D ||
         (cp >= 0xFE00 && cp <= 0xFE0F);
}

}  // namespace

void PrecompiledCharsmap::normalize(std::string& text) const {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    // One grapheme: [pos, end).
    size_t len = 0;
    unicode::decode_char(text, pos, &len);
    size_t end = pos + len;
    bool joined = false;
    while (end < text.size()) {
      size_t next = 0;
      const uint32_t cp = unicode::decode_char(text, end, &next);
      if (!joined && !extends_grapheme(cp)) break;
      joined = cp == 0x200D;
      end += next;
    }
    const std::string_view grapheme = std::string_view(text).substr(pos, end - pos);
    std::string_view norm;
    if (grapheme.size() < 6 && transform(grapheme, norm)) {
      out.append(norm);
    } else {
      for (size_t at = 0; at < grapheme.size();) {
        size_t n = 0;
        unicode::decode_char(grapheme, at, &n);
        const std::string_view ch = grapheme.substr(at, n);
        out.append(transform(ch, norm) ? norm : ch);
        at += n;
      }
    }
    pos = end;
  }
  text = std::move(out);
}

}  // namespace pagellm::tok
