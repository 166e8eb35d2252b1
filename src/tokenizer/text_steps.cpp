#include "tokenizer/text_steps.h"

#include <array>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace pagellm::tok {

namespace {

bool is_chinese_char(uint32_t cp) {  // the CJK blocks BERT isolates
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool is_bert_whitespace(uint32_t cp) { return cp == '\t' || cp == '\n' || cp == '\r' || unicode::is_whitespace(cp); }
bool is_bert_control(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  return unicode::is_other(cp);
}
bool is_bert_punctuation(uint32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126))
    return true;
  return cp >= 0x80 && unicode::is_punctuation(cp);
}

void bert_normalize(const BertOptions& opt, std::string& text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t len = 0;
  for (size_t pos = 0; pos < text.size(); pos += len) {
    const uint32_t cp = unicode::decode_char(text, pos, &len);
    if (opt.clean_text) {
      if (cp == 0 || cp == unicode::kReplacementChar || is_bert_control(cp)) continue;
      if (is_bert_whitespace(cp)) {
        cps.push_back(' ');
        continue;
      }
    }
    if (opt.handle_chinese_chars && is_chinese_char(cp)) {
      cps.push_back(' ');
      cps.push_back(cp);
      cps.push_back(' ');
    } else {
      cps.push_back(cp);
    }
  }
  if (opt.strip_accents) {
    unicode::nfd(cps);
    std::erase_if(cps, [](uint32_t cp) { return unicode::category(cp) == unicode::Category::Mn; });
  }
  if (opt.lowercase) unicode::lowercase(cps);
  text = unicode::from_codepoints(cps);
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  if (from.empty() || text.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(text, at, hit - at);
    out += to;
  }
  out.append(text, at, std::string::npos);
  text.swap(out);
}

bool is_ws_byte_or_char(std::string_view s, size_t pos, size_t* len) {
  return unicode::is_whitespace(unicode::decode_char(s, pos, len));
}

}  // namespace

void apply_normalizers(const std::vector<NormalizerStep>& steps, std::string& text, bool is_first) {
  for (const NormalizerStep& s : steps) {
    switch (s.kind) {
      case NormalizerStep::Kind::Prepend:
        if (!text.empty()) text.insert(0, s.a);
        break;
      case NormalizerStep::Kind::PrependIfMissing:
        if (!text.empty() && (is_first || !s.first_only) && !text.starts_with(s.a)) text.insert(0, s.a);
        break;
      case NormalizerStep::Kind::Replace:
        if (s.regex) {
          std::vector<Span> hits;
          s.regex->find_all(text, {0, text.size()}, hits);
          if (hits.empty()) break;
          std::string out;
          size_t at = 0;
          for (const Span h : hits) {
            out.append(text, at, h.begin - at);
            out += s.b;
            at = h.end;
          }
          out.append(text, at, std::string::npos);
          text.swap(out);
        } else {
          replace_all(text, s.a, s.b);
        }
        break;
      case NormalizerStep::Kind::NFC:
        text = unicode::nfc(text);
        break;
      case NormalizerStep::Kind::NFD:
        text = unicode::nfd(text);
        break;
      case NormalizerStep::Kind::Lowercase:
        text = unicode::lowercase(text);
        break;
      case NormalizerStep::Kind::Strip: {
        size_t b = 0, e = text.size(), len = 0;
        if (s.strip_left)
          while (b < e && is_ws_byte_or_char(text, b, &len)) b += len;
        if (s.strip_right) {
          // Walk forward, remembering where the trailing whitespace run starts.
          size_t run = e;
          for (size_t pos = b; pos < e; pos += len) {
            if (is_ws_byte_or_char(text, pos, &len)) {
              if (run == e) run = pos;
            } else {
              run = e;
            }
          }
          e = run;
        }
        text = text.substr(b, e - b);
        break;
      }
      case NormalizerStep::Kind::Bert:
        bert_normalize(s.bert, text);
        break;
      case NormalizerStep::Kind::Precompiled:
        s.charsmap->normalize(text);
        break;
    }
  }
}

void bert_split(std::string_view text, const std::vector<Span>& in, std::vector<Span>& out) {
  for (const Span span : in) {
    size_t word = span.begin;  // start of the current word
    size_t len = 0;
    for (size_t pos = span.begin; pos < span.end; pos += len) {
      const uint32_t cp = unicode::decode_char(text.substr(0, span.end), pos, &len);
      if (unicode::is_whitespace(cp)) {
        if (pos > word) out.push_back({word, pos});
        word = pos + len;
      } else if (is_bert_punctuation(cp)) {
        if (pos > word) out.push_back({word, pos});
        out.push_back({pos, pos + len});
        word = pos + len;
      }
    }
    if (span.end > word) out.push_back({word, span.end});
  }
}

void apply_pre_tokenizers(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                          std::vector<Span>& pieces, std::vector<Span>& scratch) {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back({0, text.size()});
  for (const PreTokenizerStep& step : steps) {
    if (step.kind == PreTokenizerStep::Kind::Bert) {
      scratch.clear();
      bert_split(text, pieces, scratch);
      pieces.swap(scratch);
    } else {
      split_pieces(text, std::span<const SplitRule>(&step.rule, 1), pieces, scratch);
    }
  }
}

namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte{};  // code points used are all < 324
  ByteLevelTables() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      unicode::append_utf8(byte_to_utf8[b], byte_to_cp[b]);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& t = byte_level_tables();
  out.clear();
  for (char c : bytes) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
}

int byte_level_decode(uint32_t cp) {
  const auto& t = byte_level_tables();
  return cp < t.cp_to_byte.size() ? t.cp_to_byte[cp] : -1;
}

}  // namespace pagellm::tok
