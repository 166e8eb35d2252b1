// The word-level tokenizer algorithms. Each turns one pre-tokenized piece of
// text into ids, using only the immutable Vocabulary plus a per-call Workspace
// (so one model serves concurrent encode() calls).
#pragma once

#include <cstdint>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex_split.h"
#include "tokenizer/vocab.h"

namespace pagellm::tok {

// A run of bytes of the piece being merged; symbols form a linked list.
struct Symbol {
  int32_t prev, next;
  uint32_t begin, len;  // byte range in the piece; len 0 once merged away
  int32_t id;           // vocabulary id of the text, -1 when none
};

struct Bigram {
  float priority;  // higher merges first (SentencePiece score, or -rank for BPE)
  int32_t left, right;
  uint32_t left_len, right_len;  // lengths at push time: a stale entry no longer matches
  int32_t merged_id;
};

struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
  }
};

// Scratch buffers reused across the pieces of one encode() call.
struct Workspace {
  // models
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
  std::string buffer;
  std::vector<uint32_t> cps;
  // pipeline
  std::string normalized, mapped;
  std::vector<Span> pieces, scratch;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual void encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const = 0;
};

// Byte tokens "<0xAB>" (SentencePiece byte fallback); -1 where missing.
std::vector<int32_t> find_byte_tokens(const Vocabulary& vocab);

// SentencePiece BPE as llama.cpp runs it: start from UTF-8 characters, merge
// the adjacent pair whose concatenation is the highest-scoring vocabulary
// token (ties: leftmost), until none is left; characters that are not tokens
// become byte tokens <0xNN> (or unk).
//
// A long piece is cut before each U+2581 whose preceding character never
// precedes U+2581 inside any token: no merge can span such a cut (every merged
// symbol is a token), so the chunks merge independently with the same result
// and the queue stays small.
class SentencePieceModel final : public Model {
 public:
  SentencePieceModel(const Vocabulary& vocab, int32_t unk_id);
  void encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const override;

 private:
  void encode_chunk(std::string_view chunk, Workspace& ws, std::vector<int32_t>& out) const;
  const Vocabulary& vocab_;
  std::vector<uint32_t> before_space_;  // code points seen right before U+2581 inside a token
  std::vector<int32_t> byte_tokens_;  // [256]
  int32_t unk_id_;
};

// Rank-based BPE (GPT-2 byte-level and Hugging Face BPE models). Long pieces
// are cut like SentencePieceModel's.
class BpeModel final : public Model {
 public:
  struct Options {
    bool ignore_merges = false;  // a piece that is a whole token skips merging (Llama 3)
    bool byte_fallback = false;  // unknown characters become <0xNN> tokens
    bool whole_newline_runs = false;  // a piece of newlines only that is a token stays whole (Gemma 4)
    int32_t unk_id = -1;
    bool fuse_unk = false;
  };
  BpeModel(const Vocabulary& vocab, Options options);
  // Merge `rank` joins tokens left and right (ids) into merged (id).
  void add_merge(int32_t left, int32_t right, int32_t merged, uint32_t rank);
  size_t merge_count() const { return n_merges_; }
  void encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const override;

 private:
  struct MergeInfo {
    uint32_t rank;
    int32_t merged;
  };
  void encode_chunk(std::string_view chunk, Workspace& ws, std::vector<int32_t>& out) const;
  const Vocabulary& vocab_;
  Options opt_;
  FlatMap64 merge_index_;         // (left << 32 | right) -> index into merges_
  std::vector<MergeInfo> merges_;
  size_t n_merges_ = 0;
  std::vector<int32_t> byte_tokens_;
  std::vector<uint32_t> before_space_;
};

// WordPiece, greedy longest-match-first within a word. GGUF vocabularies mark
// word starts with U+2581 ("▁hello", "ing"); Hugging Face ones mark
// continuations with "##" ("hello", "##ing").
class WordPieceModel final : public Model {
 public:
  WordPieceModel(const Vocabulary& vocab, int32_t unk_id, bool gguf_style, std::string continuing_prefix = "##",
                 size_t max_chars_per_word = 100);
  void encode(std::string_view word, Workspace& ws, std::vector<int32_t>& out) const override;

 private:
  const Vocabulary& vocab_;
  int32_t unk_id_;
  bool gguf_style_;
  std::string prefix_;
  size_t max_chars_;
  size_t max_token_len_ = 0;
};

// SentencePiece Unigram (Hugging Face "Unigram", llama.cpp's UGM): the
// segmentation of highest total piece score (Viterbi over the piece lattice;
// ties keep the longest last piece, as HF's lattice does). A character no
// piece starts with becomes unk, scored min_score - 10; adjacent unks fuse
// into one (HF's fuse_unk), or become byte tokens <0xNN> with byte_fallback.
// by_token_type: llama.cpp's UGM reading of a GGUF vocabulary: only normal,
// user-defined (scored 0) and unused tokens are pieces, and the unk score is
// the normal tokens' minimum - 10 (control tokens and the padding rows its
// converter adds, scored -10000, take no part).
class UnigramModel final : public Model {
 public:
  UnigramModel(const Vocabulary& vocab, int32_t unk_id, bool byte_fallback, bool by_token_type = false);
  void encode(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const override;

 private:
  // Whether a token is a piece of the lattice, and its score there.
  bool is_piece(int32_t id) const;
  double piece_score(int32_t id) const;

  const Vocabulary& vocab_;
  int32_t unk_id_;
  bool byte_fallback_;
  bool by_token_type_;
  std::vector<int32_t> byte_tokens_;
  size_t max_piece_bytes_ = 0;
  float unk_score_ = 0;
};

}  // namespace pagellm::tok
