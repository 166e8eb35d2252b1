// Pre-tokenizer regex splitting over PCRE2 (UTF + UCP, JIT when available).
// Invalid UTF-8 never matches (PCRE2_MATCH_INVALID_UTF), so stray bytes end
// up in the gaps between matches and reach the model as their own pieces.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::tok {

struct Span {
  size_t begin = 0, end = 0;
};

// What happens to the matches when splitting (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

class Regex {
 public:
  // Throws Error naming the pattern and PCRE2's message when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }
  // Non-empty matches in text[span] as spans of text (absolute offsets).
  void find_all(std::string_view text, Span span, std::vector<Span>& matches) const;

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

struct SplitRule {
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
};

// Applies each rule in turn to every piece the previous rules produced.
// pieces holds spans of text; scratch is reused between calls.
void split_pieces(std::string_view text, std::span<const SplitRule> rules, std::vector<Span>& pieces,
                  std::vector<Span>& scratch);

// The regex list llama.cpp associates with a GGUF tokenizer.ggml.pre value
// (Isolated splits). Throws Error for an unknown name. Also tells whether the
// vocabulary ignores merges for whole-word tokens (Llama 3 style).
struct PreTokenizerPreset {
  std::vector<std::string> patterns;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default when the GGUF does not say
};
PreTokenizerPreset gguf_pre_tokenizer(const std::string& pre);

// The GPT-2 pattern of Hugging Face's ByteLevel pre-tokenizer (use_regex).
extern const char* const kGpt2Pattern;

}  // namespace pagellm::tok
