#include "tokenizer/models.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace pagellm::tok {

namespace {

// Splits piece into one symbol per UTF-8 character (an invalid byte is a
// symbol of its own).
void split_chars(std::string_view piece, std::vector<Symbol>& symbols) {
  symbols.clear();
  for (size_t pos = 0; pos < piece.size();) {
    size_t len = unicode::valid_char_len(piece, pos);
    if (len == 0) len = 1;
    const auto i = static_cast<int32_t>(symbols.size());
    symbols.push_back({i - 1, -1, static_cast<uint32_t>(pos), static_cast<uint32_t>(len), -1});
    if (i > 0) symbols[i - 1].next = i;
    pos += len;
  }
}

void heap_push(std::vector<Bigram>& heap, const Bigram& b) {
  heap.push_back(b);
  std::push_heap(heap.begin(), heap.end(), BigramOrder{});
}

Bigram heap_pop(std::vector<Bigram>& heap) {
  std::pop_heap(heap.begin(), heap.end(), BigramOrder{});
  Bigram b = heap.back();
  heap.pop_back();
  return b;
}

// Runs the merge loop shared by both BPE flavours. try_pair(l, r) pushes the
// bigram of adjacent symbols l and r when they can merge.
template <typename TryPair>
void merge_symbols(std::vector<Symbol>& symbols, std::vector<Bigram>& heap, TryPair try_pair) {
  heap.clear();
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);
  while (!heap.empty()) {
    const Bigram b = heap_pop(heap);
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Stale: one side merged away or grew since the pair was queued.
    if (left.len == 0 || right.len == 0 || left.len != b.left_len || right.len != b.right_len) continue;
    left.len += right.len;
    left.id = b.merged_id;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    if (left.prev >= 0) try_pair(left.prev, b.left);
    if (left.next >= 0) try_pair(b.left, left.next);
  }
}

}  // namespace

std::vector<int32_t> find_byte_tokens(const Vocabulary& vocab) {
  static const char* hex = "0123456789ABCDEF";
  std::vector<int32_t> ids(256, -1);
  for (int b = 0; b < 256; ++b) {
    const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    ids[b] = vocab.find(std::string_view(name, 6));
  }
  return ids;
}

// ---------------------------------------------------------------- SentencePiece

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

// Sorted code points that come right before U+2581 inside some token.
std::vector<uint32_t> chars_before_space(const Vocabulary& vocab) {
  std::vector<uint32_t> out;
  for (const std::string& t : vocab.text) {
    for (size_t at = t.find(kSpaceMarker, 1); at != std::string::npos; at = t.find(kSpaceMarker, at + 1)) {
      size_t start = at - 1;  // back to the start of the preceding character
      while (start > 0 && (static_cast<uint8_t>(t[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      out.push_back(unicode::decode_char(t, start, &len));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Calls fn on the chunks of piece between safe cuts: before a U+2581 whose
// preceding character is not in before_space. Since every merged symbol is a
// vocabulary token, no merge can span such a cut.
template <typename Fn>
void for_each_chunk(std::string_view piece, const std::vector<uint32_t>& before_space, Fn fn) {
  size_t chunk = 0;
  size_t prev_char = 0;  // start of the character before pos
  for (size_t pos = 0, len = 0; pos < piece.size(); pos += len) {
    len = unicode::valid_char_len(piece, pos);
    if (len == 0) len = 1;
    if (pos > chunk && piece.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      size_t n = 0;
      const uint32_t before = unicode::decode_char(piece, prev_char, &n);
      if (!std::binary_search(before_space.begin(), before_space.end(), before)) {
        fn(piece.substr(chunk, pos - chunk));
        chunk = pos;
      }
    }
    prev_char = pos;
  }
  if (piece.size() > chunk) fn(piece.substr(chunk));
}

}  // namespace

SentencePieceModel::SentencePieceModel(const Vocabulary& vocab, int32_t unk_id)
    : vocab_(vocab), before_space_(chars_before_space(vocab)), byte_tokens_(find_byte_tokens(vocab)), unk_id_(unk_id) {}

void SentencePieceModel::encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  for_each_chunk(piece, before_space_, [&](std::string_view chunk) { encode_chunk(chunk, ws, out); });
}

void SentencePieceModel::encode_chunk(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  auto& symbols = ws.symbols;
  split_chars(piece, symbols);
  merge_symbols(symbols, ws.heap, [&](int32_t l, int32_t r) {
    const Symbol& a = symbols[l];
    const Symbol& b = symbols[r];
    const int32_t id = vocab_.find(piece.substr(a.begin, a.len + b.len));
    if (id < 0) return;
    heap_push(ws.heap, {vocab_.score[id], l, r, a.len, b.len, id});
  });
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    int32_t id = s.id >= 0 ? s.id : vocab_.find(piece.substr(s.begin, s.len));
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < s.len; ++k) {
      const auto byte = static_cast<uint8_t>(piece[s.begin + k]);
      int32_t bt = byte_tokens_[byte];
      if (bt < 0) bt = vocab_.find(piece.substr(s.begin + k, 1));
      if (bt < 0) bt = unk_id_;
      if (bt >= 0) out.push_back(bt);
    }
  }
}

// ---------------------------------------------------------------- BPE

BpeModel::BpeModel(const Vocabulary& vocab, Options options)
    : vocab_(vocab), opt_(options), byte_tokens_(find_byte_tokens(vocab)), before_space_(chars_before_space(vocab)) {}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t merged, uint32_t rank) {
  if (merges_.empty()) merge_index_.reserve(1024);
  const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  if (!merge_index_.insert(key, static_cast<uint32_t>(merges_.size()))) return;  // the first (lowest) rank wins
  merges_.push_back({rank, merged});
  ++n_merges_;
}

void BpeModel::encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (opt_.ignore_merges || (opt_.whole_newline_runs && piece.find_first_not_of('\n') == std::string_view::npos)) {
    const int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  for_each_chunk(piece, before_space_, [&](std::string_view chunk) { encode_chunk(chunk, ws, out); });
}

void BpeModel::encode_chunk(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  // One symbol per character; characters outside the vocabulary become byte
  // tokens (byte_fallback), else unk (consecutive ones fused), else stay -1.
  auto& symbols = ws.symbols;
  symbols.clear();
  bool prev_unk = false;
  for (size_t pos = 0; pos < piece.size();) {
    size_t len = unicode::valid_char_len(piece, pos);
    if (len == 0) len = 1;
    const auto begin = static_cast<uint32_t>(pos);
    pos += len;
    const int32_t id = vocab_.find(piece.substr(begin, len));
    if (id >= 0) {
      symbols.push_back({0, 0, begin, static_cast<uint32_t>(len), id});
      prev_unk = false;
      continue;
    }
    bool all_bytes = opt_.byte_fallback;
    for (size_t k = 0; all_bytes && k < len; ++k) all_bytes = byte_tokens_[static_cast<uint8_t>(piece[begin + k])] >= 0;
    if (all_bytes) {
      for (uint32_t k = 0; k < len; ++k)
        symbols.push_back({0, 0, begin + k, 1, byte_tokens_[static_cast<uint8_t>(piece[begin + k])]});
      prev_unk = false;
    } else if (opt_.unk_id >= 0 && opt_.fuse_unk && prev_unk) {
      symbols.back().len += static_cast<uint32_t>(len);
    } else {
      symbols.push_back({0, 0, begin, static_cast<uint32_t>(len), opt_.unk_id});
      prev_unk = opt_.unk_id >= 0;
    }
  }
  for (size_t i = 0; i < symbols.size(); ++i) {
    symbols[i].prev = static_cast<int32_t>(i) - 1;
    symbols[i].next = i + 1 < symbols.size() ? static_cast<int32_t>(i + 1) : -1;
  }
  merge_symbols(symbols, ws.heap, [&](int32_t l, int32_t r) {
    const Symbol& a = symbols[l];
    const Symbol& b = symbols[r];
    if (a.id < 0 || b.id < 0) return;
    const uint32_t* m = merge_index_.find((uint64_t(uint32_t(a.id)) << 32) | uint32_t(b.id));
    if (!m) return;
    const MergeInfo& info = merges_[*m];
    heap_push(ws.heap, {-static_cast<float>(info.rank), l, r, a.len, b.len, info.merged});
  });
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Not a token and no fallback: whatever single bytes are tokens (llama.cpp).
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t id = vocab_.find(piece.substr(s.begin + k, 1));
      if (id >= 0) out.push_back(id);
    }
  }
}

// ---------------------------------------------------------------- WordPiece

WordPieceModel::WordPieceModel(const Vocabulary& vocab, int32_t unk_id, bool gguf_style,
                               std::string continuing_prefix, size_t max_chars_per_word)
    : vocab_(vocab),
      unk_id_(unk_id),
      gguf_style_(gguf_style),
      prefix_(std::move(continuing_prefix)),
      max_chars_(max_chars_per_word) {
  for (const auto& t : vocab.text) max_token_len_ = std::max(max_token_len_, t.size());
}

void WordPieceModel::encode(std::string_view word, Workspace& ws, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  // Character boundaries of the word.
  auto& bounds = ws.cps;
  bounds.clear();
  for (size_t pos = 0; pos < word.size();) {
    bounds.push_back(static_cast<uint32_t>(pos));
    const size_t len = unicode::valid_char_len(word, pos);
    pos += len == 0 ? 1 : len;
  }
  bounds.push_back(static_cast<uint32_t>(word.size()));
  const size_t n_chars = bounds.size() - 1;
  const size_t first_out = out.size();
  if (n_chars > max_chars_) {
    if (unk_id_ >= 0) out.push_back(unk_id_);
    return;
  }
  static const std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
  std::string& candidate = ws.buffer;
  for (size_t i = 0; i < n_chars;) {
    int32_t found = -1;
    size_t found_end = 0;
    for (size_t j = n_chars; j > i; --j) {
      const std::string_view sub = word.substr(bounds[i], bounds[j] - bounds[i]);
      candidate.clear();
      if (gguf_style_ ? i == 0 : i > 0) candidate += gguf_style_ ? kWordStart : std::string_view(prefix_);
      candidate += sub;
      if (candidate.size() > max_token_len_) continue;
      const int32_t id = vocab_.find(candidate);
      if (id >= 0) {
        found = id;
        found_end = j;
        break;
      }
    }
    if (found < 0) {  // the whole word is unknown
      out.resize(first_out);
      if (unk_id_ >= 0) out.push_back(unk_id_);
      return;
    }
    out.push_back(found);
    i = found_end;
  }
}

}  // namespace pagellm::tok

// ---------------------------------------------------------------- Unigram

namespace pagellm::tok {

UnigramModel::UnigramModel(const Vocabulary& vocab, int32_t unk_id, bool byte_fallback, bool by_token_type)
    : vocab_(vocab),
      unk_id_(unk_id),
      byte_fallback_(byte_fallback),
      by_token_type_(by_token_type),
      byte_tokens_(find_byte_tokens(vocab)) {
  float min_score = 0;
  bool any = false;
  // HF: every piece of the model's vocabulary is in the lattice, specials
  // included (HF's trie holds them: "<s>" written as text is that piece).
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (vocab.text[id].empty() || !is_piece(id)) continue;
    max_piece_bytes_ = std::max(max_piece_bytes_, vocab.text[id].size());
    if (by_token_type_ && vocab.type[id] != TokenType::Normal) continue;
    min_score = any ? std::min(min_score, vocab.score[id]) : vocab.score[id];
    any = true;
  }
  unk_score_ = min_score - 10.0f;  // HF's and SentencePiece's unknown-piece penalty
}

bool UnigramModel::is_piece(int32_t id) const {
  if (!by_token_type_) return true;
  const TokenType t = vocab_.type[id];
  return t == TokenType::Normal || t == TokenType::UserDefined || t == TokenType::Unused;
}

double UnigramModel::piece_score(int32_t id) const {
  // llama.cpp scores user-defined tokens 0, so they win over their pieces.
  return by_token_type_ && vocab_.type[id] == TokenType::UserDefined ? 0.0 : vocab_.score[id];
}

void UnigramModel::encode(std::string_view piece, Workspace&, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  // best[i]: the best segmentation of piece[0, i) (byte offsets at character
  // starts): its score, the start of its last piece and that piece's id
  // (-1: unk).
  struct Best {
    double score = 0;
    size_t start = 0;
    int32_t id = -1;
    bool reached = false;
  };
  const size_t n = piece.size();
  std::vector<Best> best(n + 1);
  best[0].reached = true;
  size_t pos = 0;
  while (pos < n) {
    size_t char_len = unicode::valid_char_len(piece, pos);
    if (char_len == 0) char_len = 1;  // a stray byte is a character of its own
    if (best[pos].reached) {
      bool single = false;
      auto offer = [&](size_t end, int32_t id, double score) {
        const double total = best[pos].score + score;
        if (!best[end].reached || total > best[end].score) best[end] = {total, pos, id, true};
      };
      // Every piece starting here, shortest first (HF's trie order).
      for (size_t end = pos + char_len; end <= n && end - pos <= max_piece_bytes_;) {
        const int32_t id = vocab_.find(piece.substr(pos, end - pos));
        if (id >= 0 && is_piece(id)) {
          offer(end, id, piece_score(id));
          single = single || end == pos + char_len;
        }
        const size_t next = unicode::valid_char_len(piece, end);
        end += next == 0 ? 1 : next;
      }
      if (!single) offer(pos + char_len, -1, unk_score_);
    }
    pos += char_len;
  }
  // Back from the end, then forward: unks fuse (or fall back to bytes).
  std::vector<std::pair<size_t, size_t>> spans;  // [start, end)
  std::vector<int32_t> ids;
  for (size_t end = n; end > 0; end = best[end].start) {
    spans.push_back({best[end].start, end});
    ids.push_back(best[end].id);
  }
  for (size_t k = spans.size(); k-- > 0;) {
    const int32_t id = ids[k];
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    size_t begin = spans[k].first, end = spans[k].second;
    while (k > 0 && ids[k - 1] < 0) end = spans[--k].second;
    bool bytes = byte_fallback_;
    for (size_t b = begin; bytes && b < end; ++b) bytes = byte_tokens_[static_cast<unsigned char>(piece[b])] >= 0;
    if (bytes) {
      for (size_t b = begin; b < end; ++b) out.push_back(byte_tokens_[static_cast<unsigned char>(piece[b])]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
}

}  // namespace pagellm::tok
