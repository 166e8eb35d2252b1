#include "tokenizer/pipeline.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace pagellm::tok {

bool is_eot_like_text(std::string_view t) {
  return t == "<|eot_id|>" || t == "<|im_end|>" || t == "<|end|>" || t == "<end_of_turn>" || t == "<|endoftext|>" ||
         t == "<|eom_id|>" || t == "<EOT>" || t == "<|end_of_text|>" || t == "<｜end▁of▁sentence｜>";
}

void PipelineTokenizer::set_special(int32_t bos, int32_t eos, int32_t unk, bool add_bos, bool add_eos,
                                    std::vector<int32_t> eog, std::string chat_template) {
  add_bos_ = add_bos;
  add_eos_ = add_eos;
  bos_id_ = bos;
  eos_id_ = eos;
  unk_id_ = unk;
  if (eos >= 0) eog.push_back(eos);
  for (int32_t id = 0; id < vocab.size(); ++id)
    if (is_eot_like_text(vocab.text[id])) eog.push_back(id);
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  std::erase_if(eog, [&](int32_t id) { return id < 0 || id >= vocab.size(); });
  eog_ids_ = std::move(eog);
  chat_template_ = std::move(chat_template);
}

void PipelineTokenizer::build_special_matcher_from_types() {
  for (int32_t id = 0; id < vocab.size(); ++id) {
    const TokenType t = vocab.type[id];
    if (t == TokenType::Control || t == TokenType::Unknown)
      specials.add(vocab.text[id], id, /*always=*/false);
    else if (t == TokenType::UserDefined)
      specials.add(vocab.text[id], id, /*always=*/true);
  }
}

void PipelineTokenizer::encode_segment(std::string_view segment, bool is_first, Workspace& ws,
                                       std::vector<int32_t>& out) const {
  std::string& normalized = ws.normalized;
  std::string_view text = segment;
  if (!normalizers.empty()) {
    normalized.assign(segment);
    apply_normalizers(normalizers, normalized, is_first);
    text = normalized;
  }
  if (text.empty()) return;
  auto& pieces = ws.pieces;
  pieces.clear();
  if (pre_tokenizers.empty())
    pieces.push_back({0, text.size()});
  else
    apply_pre_tokenizers(pre_tokenizers, text, pieces, ws.scratch);
  std::string& mapped = ws.mapped;
  for (const Span p : pieces) {
    if (p.end <= p.begin) continue;
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (byte_level) {
      byte_level_encode(piece, mapped);
      model->encode(mapped, ws, out);
    } else {
      model->encode(piece, ws, out);
    }
  }
}

std::vector<int32_t> PipelineTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special) out = prefix_ids;
  Workspace ws;
  std::vector<SpecialTokenMatcher::Segment> segments;
  if (specials.empty()) {
    if (!text.empty()) segments.push_back({-1, 0, text.size()});
  } else {
    specials.split(text, parse_special, segments);
  }
  for (const auto& seg : segments) {
    if (seg.token >= 0)
      out.push_back(seg.token);
    else
      encode_segment(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, ws, out);
  }
  if (add_special) out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
  return out;
}

namespace {

void check_id(int32_t id, int32_t n) {
  if (id < 0 || id >= n) throw InvalidRequest(fmt::format("token id {} is outside the vocabulary [0, {})", id, n));
}

// "<0xAB>" -> 0xAB, -1 when text is not a byte token.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::string unescape_spaces(std::string_view t) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += t[i++];
    }
  }
  return out;
}

}  // namespace

std::string PipelineTokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id, vocab.size());
  const std::string& text = vocab.text[id];
  switch (vocab.type[id]) {
    case TokenType::Control:
    case TokenType::Unknown:
      return render_special ? text : std::string();
    case TokenType::UserDefined:
      return text;
    case TokenType::Byte:
      if (const int b = parse_byte_token(text); b >= 0) return std::string(1, static_cast<char>(b));
      break;
    default:
      break;
  }
  switch (piece_style) {
    case PieceStyle::SentencePiece: {
      if (const int b = parse_byte_token(text); b >= 0 && vocab.type[id] != TokenType::Normal)
        return std::string(1, static_cast<char>(b));
      return unescape_spaces(text);
    }
    case PieceStyle::WordPieceGguf:
      return unescape_spaces(text);
    case PieceStyle::WordPieceHf:
      if (text.starts_with("##")) return text.substr(2);
      return " " + text;
    case PieceStyle::ByteLevel: {
      std::string out;
      out.reserve(text.size());
      size_t len = 0;
      for (size_t pos = 0; pos < text.size(); pos += len) {
        const uint32_t cp = unicode::decode_char(text, pos, &len);
        const int b = byte_level_decode(cp);
        if (b >= 0)
          out += static_cast<char>(b);
        else
          out.append(text, pos, len);  // not in the alphabet: keep as written
      }
      return out;
    }
  }
  return text;
}

const std::string& PipelineTokenizer::token_text(int32_t id) const {
  check_id(id, vocab.size());
  return vocab.text[id];
}

TokenType PipelineTokenizer::token_type(int32_t id) const {
  check_id(id, vocab.size());
  return vocab.type[id];
}

std::optional<int32_t> PipelineTokenizer::find_token(std::string_view text) const {
  const int32_t id = vocab.find(text);
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace pagellm::tok
