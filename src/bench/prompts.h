// Seeded random prompts for benchmarks: token ids for the engine, and plain
// text for servers that take only strings. The same seed gives the same
// prompt on every machine (integer-only generator).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagellm {
class Tokenizer;
}

namespace pagellm::bench {

// splitmix64: tiny, portable, good enough to pick token ids.
class PromptRng {
 public:
  explicit PromptRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, n) (n > 0); the modulo bias is irrelevant here.
  uint64_t below(uint64_t n) { return next() % n; }
  // Uniform in (0, 1].
  double unit();

 private:
  uint64_t state_;
};

// The range random prompt ids are drawn from: above the low ids where most
// vocabularies keep their special and byte tokens.
int32_t first_random_token(int32_t vocab_size);

// `n` ids in [first_random_token(vocab), vocab).
std::vector<int32_t> random_token_ids(int32_t n, int32_t vocab_size, uint64_t seed);

// Text of about `n_tokens` tokens: common English words that most vocabularies
// hold as one token each. With a tokenizer, exactly n_tokens of it (random
// words encoded, cut to n_tokens ids, decoded back), give or take the merges
// re-encoding may make.
std::string random_text(int32_t n_tokens, uint64_t seed, const Tokenizer* tokenizer = nullptr);

}  // namespace pagellm::bench
