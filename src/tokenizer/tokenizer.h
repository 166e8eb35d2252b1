// Text <-> token ids for every vocabulary family we load: SentencePiece-style
// (GGUF tokenizer.ggml.model = "llama"), byte-level BPE ("gpt2" with its
// pre-tokenizer regexes), WordPiece ("bert"), from GGUF metadata or from a
// Hugging Face tokenizer.json. The vocabulary is immutable after loading, so one
// Tokenizer serves concurrent requests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm {

class GGUFFile;

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From a GGUF file's tokenizer.* metadata (model files and vocab-only files).
  // Throws Error naming the problem for a missing or unsupported vocabulary.
  static std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& file);
  // From a Hugging Face folder: tokenizer.json (+ tokenizer_config.json and
  // generation_config.json when present). `dir` may also name tokenizer.json itself.
  static std::unique_ptr<Tokenizer> from_hf_dir(const std::string& dir);
  // Either of the above, chosen by what `path` is: a GGUF file (model or
  // vocab-only), a folder holding tokenizer.json, or a tokenizer.json file.
  static std::unique_ptr<Tokenizer> load(const std::string& path);

  // text -> ids. Thread-safe; "" gives [] (plus BOS/EOS with add_special).
  // add_special: add what the vocabulary puts around a text: BOS when add_bos(),
  //   EOS when add_eos() (BERT: [CLS] ... [SEP]; tokenizer.json: its
  //   post-processor template).
  // parse_special: control / special tokens written in the text (e.g.
  //   "<start_of_turn>") become their ids, leftmost-longest; when false they
  //   are plain text. User-defined tokens (GGUF type 4, non-special added
  //   tokens such as Qwen's <think>) always match, as in llama.cpp and HF.
  // Invalid UTF-8 never fails: SentencePiece keeps the bytes as <0xNN> byte
  // tokens, byte-level BPE as byte symbols (if the vocabulary has them);
  // BERT and NFC-normalizing tokenizers see U+FFFD instead.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // A text pair as the tokenizer's pair template joins one (what a
  // cross-encoder reads: BERT [CLS] a [SEP] b [SEP], RoBERTa / XLM-R <s> a
  // </s></s> b </s>); specials in the texts stay plain text. A tokenizer
  // without a pair template: a with add_special's tokens, then b without
  // (the two texts' tokens joined, as vLLM joins a decoder's pair).
  std::vector<int32_t> encode_pair(std::string_view first, std::string_view second) const;
  // The first token between a pair's two texts (BERT's [SEP]), after which
  // the second segment (token type 1) begins; -1 without a pair template.
  int32_t segment_separator() const { return pair_.found && !pair_.middle.empty() ? pair_.middle.front() : -1; }

  // The bytes token `id` stands for in text (throws InvalidRequest for an id
  // outside [0, vocab_size())): SentencePiece's U+2581 becomes a
  // space, byte tokens <0xAB> become the byte, byte-level BPE symbols map back
  // to bytes. Control tokens render as their text unless render_special is
  // false (then ""); user-defined tokens render as their text.
  virtual std::string token_to_piece(int32_t id, bool render_special) const = 0;

  // ids -> text (concatenated pieces; may contain invalid UTF-8 when ids end
  // mid-character). No space is stripped: SentencePiece "▁Hi" gives " Hi".
  // skip_special drops control / unknown tokens, else renders them.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;

  virtual int32_t vocab_size() const = 0;
  // The raw vocabulary string of a token (e.g. "▁Hello", "Ġworld", "<0x0A>").
  virtual const std::string& token_text(int32_t id) const = 0;
  virtual TokenType token_type(int32_t id) const = 0;
  // The id whose raw text is exactly `text` (the later one of duplicates).
  virtual std::optional<int32_t> find_token(std::string_view text) const = 0;

  int32_t bos_id() const { return bos_id_; }  // -1 when the vocabulary has none
  int32_t eos_id() const { return eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // Every end-of-generation token, sorted: EOS, GGUF eot/eom/fim_pad/rep/sep
  // ids, generation_config.json eos_token_id(s), and tokens whose text is
  // EOT-like (<|eot_id|>, <|eom_id|>, <|im_end|>, <|end|>, <end_of_turn>,
  // <|endoftext|>, <|end_of_text|>, <EOT>, <｜end▁of▁sentence｜>).
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool is_eog(int32_t id) const;
  // Control / unknown tokens (HF: special added tokens), skipped by
  // skip_special. False for ids out of range.
  bool is_special(int32_t id) const;
  // The model's chat template (GGUF tokenizer.chat_template or
  // tokenizer_config.json chat_template); empty when it has none.
  const std::string& chat_template() const { return chat_template_; }
  // One line for logs: vocabulary kind, size, pre-tokenizer.
  virtual std::string describe() const = 0;

 protected:
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  std::vector<int32_t> eog_ids_;
  std::string chat_template_;
  // The pair template: prefix first middle second suffix.
  struct PairTemplate {
    bool found = false;
    std::vector<int32_t> prefix, middle, suffix;
  };
  PairTemplate pair_;
};

// Turns a stream of generated ids into text deltas, never emitting half a
// UTF-8 code point (bytes are held until the character completes; flush()
// emits what is left, replacing an unfinished character with U+FFFD). Bytes
// that can never start or continue a character become U+FFFD at once, so
// every delta is valid UTF-8. One instance per sequence (not thread-safe).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an unfinished code point
};

}  // namespace pagellm
