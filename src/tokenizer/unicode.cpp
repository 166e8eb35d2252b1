#include "tokenizer/unicode.h"

#include <algorithm>

#include "core/utf8.h"

namespace pagellm::unicode {

namespace {

// Value of the run containing cp in a table of (start, value) runs.
uint8_t run_value(const data::RangeValue* runs, size_t n, uint32_t cp) {
  auto it = std::upper_bound(runs, runs + n, cp, [](uint32_t c, const data::RangeValue& r) { return c < r.start; });
  return it == runs ? 0 : (it - 1)->value;
}

// Hangul syllables decompose and compose algorithmically (Unicode ch. 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xC0) {  // nothing below U+00C0 decomposes
    out.push_back(cp);
    return;
  }
  const auto* end = data::kDecompositions + data::kDecompositionsSize;
  auto it = std::lower_bound(data::kDecompositions, end, cp,
                             [](const data::Decomposition& d, uint32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), data::kDecompositionData + it->offset, data::kDecompositionData + it->offset + it->len);
}

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const uint64_t key = (uint64_t(a) << 21) | b;
  const auto* end = data::kCompositions + data::kCompositionsSize;
  auto it = std::lower_bound(data::kCompositions, end, key,
                             [](const data::Composition& c, uint64_t k) { return c.key < k; });
  return (it != end && it->key == key) ? it->cp : 0;
}

}  // namespace

size_t valid_char_len(std::string_view s, size_t pos) {
  const size_t n = s.size() - pos;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return 1;
  auto cont = [&](size_t i) { return i < n && (static_cast<uint8_t>(s[pos + i]) & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const auto b1 = static_cast<uint8_t>(s[pos + 1]);
    if (b0 == 0xE0 && b1 < 0xA0) return 0;   // overlong
    if (b0 == 0xED && b1 >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const auto b1 = static_cast<uint8_t>(s[pos + 1]);
    if (b0 == 0xF0 && b1 < 0x90) return 0;  // overlong
    if (b0 == 0xF4 && b1 >= 0x90) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

uint32_t decode_char(std::string_view s, size_t pos, size_t* len) {
  const size_t n = valid_char_len(s, pos);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  *len = n == 0 ? 1 : n;
  switch (n) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    case 4: return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    default: return kReplacementChar;
  }
}

void append_utf8(std::string& out, uint32_t cp) { pagellm::append_utf8(out, cp); }

std::vector<uint32_t> to_codepoints(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) cps.push_back(decode_char(s, pos, &len));
  return cps;
}

std::string from_codepoints(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

Category category(uint32_t cp) {
  if (cp >= 0x110000) return Category::Cn;
  return static_cast<Category>(run_value(data::kCategoryRuns, data::kCategoryRunsSize, cp));
}

bool is_letter(uint32_t cp) {
  const auto c = category(cp);
  return c >= Category::Lu && c <= Category::Lo;
}
bool is_number(uint32_t cp) {
  const auto c = category(cp);
  return c >= Category::Nd && c <= Category::No;
}
bool is_punctuation(uint32_t cp) {
  const auto c = category(cp);
  return c >= Category::Pc && c <= Category::Po;
}
bool is_symbol(uint32_t cp) {
  const auto c = category(cp);
  return c >= Category::Sm && c <= Category::So;
}
bool is_other(uint32_t cp) {
  const auto c = category(cp);
  return c == Category::Cc || c == Category::Cf || c == Category::Cn || c == Category::Co;
}

bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  return run_value(data::kCombiningClassRuns, data::kCombiningClassRunsSize, cp);
}

void nfd(std::vector<uint32_t>& cps) {
  std::vector<uint32_t> out;
  out.reserve(cps.size() + cps.size() / 4);
  for (uint32_t cp : cps) decompose_into(cp, out);
  // Canonical ordering: stable sort every run of non-starters by class.
  for (size_t i = 0; i < out.size();) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(out.begin() + i, out.begin() + j,
                       [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  cps.swap(out);
}

void nfc(std::vector<uint32_t>& cps) {
  nfd(cps);
  if (cps.empty()) return;
  size_t starter = 0;
  int last_class = combining_class(cps[0]) == 0 ? 0 : 256;  // 256: no starter yet
  size_t kept = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t ch = cps[i];
    const int cls = combining_class(ch);
    const uint32_t composite = last_class == 256 ? 0 : compose_pair(cps[starter], ch);
    if (composite != 0 && (last_class < cls || last_class == 0)) {
      cps[starter] = composite;
      continue;
    }
    if (cls == 0) starter = kept;
    last_class = cls;
    cps[kept++] = ch;
  }
  cps.resize(kept);
}

std::string nfd(std::string_view s) {
  auto cps = to_codepoints(s);
  nfd(cps);
  return from_codepoints(cps);
}

std::string nfc(std::string_view s) {
  // Fast path: ASCII is already in NFC.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; })) return std::string(s);
  auto cps = to_codepoints(s);
  nfc(cps);
  return from_codepoints(cps);
}

void lowercase(std::vector<uint32_t>& cps) {
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  const auto* end = data::kLowercase + data::kLowercaseSize;
  for (uint32_t cp : cps) {
    if (cp < 0x80) {
      out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    } else if (cp == 0x130) {  // İ -> i + combining dot above
      out.push_back('i');
      out.push_back(0x307);
    } else {
      auto it = std::lower_bound(data::kLowercase, end, cp,
                                 [](const data::CodepointMap& m, uint32_t c) { return m.from < c; });
      out.push_back(it != end && it->from == cp ? it->to : cp);
    }
  }
  cps.swap(out);
}

std::string lowercase(std::string_view s) {
  auto cps = to_codepoints(s);
  lowercase(cps);
  return from_codepoints(cps);
}

}  // namespace pagellm::unicode
