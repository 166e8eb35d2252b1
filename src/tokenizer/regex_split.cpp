#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace pagellm::tok {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Owns a match-data block for one split call (thread-local use only).
struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!code) fail("tokenizer regex /{}/ does not compile at offset {}: {}", pattern, err_offset, pcre2_message(err));
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, Span span, std::vector<Span>& matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  thread_local MatchData data;
  // The piece is the subject, so anchors and lookarounds see only the piece.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + span.begin);
  const size_t len = span.end - span.begin;
  size_t pos = 0;
  while (pos < len) {
    int rc = pcre2_match(code, subject, len, pos, jit_ ? 0 : PCRE2_NO_JIT, data.md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_))
      rc = pcre2_match(code, subject, len, pos, PCRE2_NO_JIT, data.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer regex /{}/ failed on the input: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      matches.push_back({span.begin + b, span.begin + e});
      pos = e;
    } else {
      // Empty match: step over one character (or one invalid byte).
      size_t step = 0;
      unicode::decode_char(std::string_view(text.data() + span.begin, len), b, &step);
      pos = b + step;
    }
  }
}

void split_pieces(std::string_view text, std::span<const SplitRule> rules, std::vector<Span>& pieces,
                  std::vector<Span>& scratch) {
  // Alternate gaps and matches; "delimiter" is what the behavior acts on.
  struct Part {
    Span span;
    bool delim;
  };
  thread_local std::vector<Span> matches;
  thread_local std::vector<Part> parts;
  for (const SplitRule& rule : rules) {
    scratch.clear();
    for (const Span piece : pieces) {
      matches.clear();
      parts.clear();
      rule.regex->find_all(text, piece, matches);
      size_t at = piece.begin;
      for (const Span m : matches) {
        if (m.begin > at) parts.push_back({{at, m.begin}, rule.invert});
        parts.push_back({m, !rule.invert});
        at = m.end;
      }
      if (piece.end > at) parts.push_back({{at, piece.end}, rule.invert});

      switch (rule.behavior) {
        case SplitBehavior::Isolated:
          for (const Part& p : parts) scratch.push_back(p.span);
          break;
        case SplitBehavior::Removed:
          for (const Part& p : parts)
            if (!p.delim) scratch.push_back(p.span);
          break;
        case SplitBehavior::MergedWithPrevious: {
          // Each delimiter joins the piece before it.
          bool prev_open = false;
          for (const Part& p : parts) {
            if (p.delim && prev_open) {
              scratch.back().end = p.span.end;
              prev_open = false;
            } else {
              scratch.push_back(p.span);
              prev_open = !p.delim;
            }
          }
          break;
        }
        case SplitBehavior::MergedWithNext: {
          // Each delimiter joins the piece after it.
          bool pending = false;
          for (const Part& p : parts) {
            if (pending && !p.delim) {
              scratch.back().end = p.span.end;
              pending = false;
            } else {
              scratch.push_back(p.span);
              pending = p.delim;
            }
          }
          break;
        }
        case SplitBehavior::Contiguous: {
          bool prev_delim = false;
          for (size_t i = 0; i < parts.size(); ++i) {
            if (i > 0 && parts[i].delim && prev_delim)
              scratch.back().end = parts[i].span.end;
            else
              scratch.push_back(parts[i].span);
            prev_delim = parts[i].delim;
          }
          break;
        }
      }
    }
    pieces.swap(scratch);
  }
}

// Patterns: the pre-tokenizer regexes published in each model's
// tokenizer.json (as collected by llama.cpp's llama-vocab.cpp per
// tokenizer.ggml.pre name), in PCRE2 syntax.
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kBloomPattern = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
const char* const kCjkPattern = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";

}  // namespace

PreTokenizerPreset gguf_pre_tokenizer(const std::string& pre) {
  auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (pre == n) return true;
    return false;
  };
  PreTokenizerPreset p;
  if (pre.empty() || pre == "default") {
    p.patterns = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Pattern, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else if (is({"llama3", "llama-v3", "llama-bpe", "falcon3"})) {
    p.patterns = {kLlama3Pattern};
    p.ignore_merges = true;
    p.add_bos = true;
  } else if (is({"dbrx", "smaug-bpe", "chatglm-bpe"})) {
    p.patterns = {kLlama3Pattern};
  } else if (is({"qwen2", "stablelm2", "megrez", "deepseek-r1-qwen"})) {
    p.patterns = {kQwen2Pattern};
  } else if (pre == "deepseek-llm") {
    p.patterns = {
        "[\r\n]",
        "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        "\\s+$",
        kCjkPattern,
        "\\p{N}+",
    };
  } else if (pre == "deepseek-coder") {
    p.patterns = {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkPattern, R"(\p{N})"};
  } else if (pre == "deepseek-v3") {
    p.patterns = {
        R"(\p{N}{1,3})",
        "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    };
  } else if (pre == "falcon") {
    p.patterns = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Pattern, "[0-9][0-9][0-9]"};
  } else if (is({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})) {
    p.patterns = {R"(\p{N})", kGpt2Pattern};
  } else if (is({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
                 "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"})) {
    p.patterns = {kGpt2Pattern};
  } else if (is({"poro-chat", "bloom", "gpt3-finnish"})) {
    p.patterns = {kBloomPattern};
  } else if (pre == "viking") {
    p.patterns = {kBloomPattern, R"(\p{N})"};
  } else if (pre == "tekken") {
    p.patterns = {kTekkenPattern};
    p.ignore_merges = true;
    p.add_bos = true;
  } else {
    fail("unsupported pre-tokenizer '{}' (tokenizer.ggml.pre)", pre);
  }
  return p;
}

}  // namespace pagellm::tok
