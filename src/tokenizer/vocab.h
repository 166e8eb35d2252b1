// Vocabulary storage shared by every tokenizer model: token texts, scores and
// types, a text -> id index, and the special-token matcher that splits input
// text on added / control tokens before the model sees it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace pagellm::tok {

// Open-addressing hash from text to id over a fixed list of strings (the
// strings must outlive the index and not move).
class TokenIndex {
 public:
  // Later duplicates win (as llama.cpp's token_to_id map); empty texts are not indexed.
  void build(const std::vector<std::string>& texts);
  int32_t find(std::string_view text) const;  // -1 when absent

 private:
  struct Slot {
    int32_t id = -1;   // -1: empty
    uint32_t tag = 0;  // high hash bits: most mismatches never touch the text
  };
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_;  // [capacity]
  uint64_t mask_ = 0;
};

// uint64 key -> uint32 value, open addressing (BPE merge table).
class FlatMap64 {
 public:
  void reserve(size_t n);
  bool insert(uint64_t key, uint32_t value);  // keeps the first value of a key; false if present
  const uint32_t* find(uint64_t key) const;

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t value = 0;
    bool used = false;
  };
  void grow();
  std::vector<Slot> slots_;
  size_t size_ = 0;
  uint64_t mask_ = 0;
};

uint64_t hash_bytes(std::string_view s);

struct Vocabulary {
  std::vector<std::string> text;  // [n_vocab]
  std::vector<float> score;       // [n_vocab]; SentencePiece merge priority, 0 when absent
  std::vector<TokenType> type;    // [n_vocab]
  TokenIndex index;

  int32_t size() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const { return index.find(s); }
};

// Splits text on special-token strings, leftmost-longest (as Hugging Face's
// added-vocabulary matcher). "Always" tokens (user-defined / non-special added
// tokens) match even when parse_special is false; the others only when true.
class SpecialTokenMatcher {
 public:
  struct Segment {
    int32_t token = -1;  // -1: raw text [begin, end)
    size_t begin = 0, end = 0;
  };
  void add(std::string_view text, int32_t id, bool always, bool lstrip = false, bool rstrip = false);
  bool empty() const { return nodes_.size() <= 1; }
  void split(std::string_view text, bool parse_special, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // sorted by byte
    int32_t token = -1;
    bool always = false, lstrip = false, rstrip = false;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

}  // namespace pagellm::tok
