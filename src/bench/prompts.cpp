#include "bench/prompts.h"

#include <array>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::bench {

uint64_t PromptRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double PromptRng::unit() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }

int32_t first_random_token(int32_t vocab_size) {
  PAGELLM_CHECK(vocab_size > 1, "vocabulary of {} tokens is too small for random prompts", vocab_size);
  return vocab_size > 2000 ? 1000 : vocab_size / 2;
}

std::vector<int32_t> random_token_ids(int32_t n, int32_t vocab_size, uint64_t seed) {
  PAGELLM_CHECK(n >= 0, "negative prompt length {}", n);
  const int32_t lo = first_random_token(vocab_size);
  PromptRng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = lo + static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size - lo)));
  return ids;
}

namespace {

constexpr std::array<const char*, 64> kWords = {
    "the",  "of",    "and",   "to",    "in",    "is",   "was",   "that",  "for",   "on",    "with", "as",   "at",
    "by",   "from",  "it",    "his",   "her",   "they", "we",    "you",   "he",    "she",   "had",  "have", "be",
    "not",  "are",   "but",   "or",    "an",    "this", "which", "one",   "all",   "were",  "there", "can", "more",
    "their", "if",   "will",  "time",  "would", "so",   "about", "out",   "up",    "into",  "who",  "them", "some",
    "could", "than", "other", "been",  "first", "new",  "two",   "like",  "only",  "over",  "after", "people"};

std::string random_words(int32_t n_words, PromptRng& rng) {
  std::string text;
  for (int32_t i = 0; i < n_words; ++i) {
    if (i) text += ' ';
    text += kWords[rng.below(kWords.size())];
  }
  return text;
}

}  // namespace

std::string random_text(int32_t n_tokens, uint64_t seed, const Tokenizer* tokenizer) {
  PAGELLM_CHECK(n_tokens > 0, "prompt length must be positive, got {}", n_tokens);
  PromptRng rng(seed);
  if (!tokenizer) return random_words(n_tokens, rng);
  std::string text = random_words(n_tokens, rng);
  std::vector<int32_t> ids = tokenizer->encode(text, false, false);
  while (static_cast<int32_t>(ids.size()) < n_tokens) {
    text += ' ' + random_words(n_tokens - static_cast<int32_t>(ids.size()), rng);
    ids = tokenizer->encode(text, false, false);
  }
  ids.resize(static_cast<size_t>(n_tokens));
  return tokenizer->decode(ids, true);
}

}  // namespace pagellm::bench
