// Grammar-constrained decoding on xgrammar's C++ core (the engine vLLM, SGLang
// and TensorRT-LLM use; built from its PyPI source package by tools/setup.sh).
//
//   validate(spec)            request time: spec -> grammar, no vocabulary (400s)
//   GrammarCompiler::compile  spec -> grammar + per-token tables for this
//                             vocabulary, on its own thread, cached (LRU)
//   GrammarMatcher            one sequence's state: the bitmask of allowed next
//                             tokens; advanced with every accepted token
//
// The scheduler and the runner never see any of this: the engine asks the
// matcher for a bitmask before sampling and feeds it the sampled token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"

namespace pagellm {
class Tokenizer;
}

namespace pagellm::structured {

// Throws InvalidRequest naming `param` when `spec` cannot become a grammar: a
// schema that is not JSON or not a valid schema, a keyword xgrammar would
// silently ignore (e.g. uniqueItems, not, if/then/else), a bad regex, EBNF or
// structural tag, an empty or non-string choice list. Costs no vocabulary
// work (milliseconds), so the API layer calls it before queueing.
void validate(const StructuredOutputs& spec, const char* param);

// An EBNF grammar whose only sentences are the given strings (choice).
std::string choice_grammar(const std::vector<std::string>& choices);

class CompiledGrammar;  // xgrammar's compiled grammar (grammar.cpp)

struct CompileResult {
  std::shared_ptr<const CompiledGrammar> grammar;  // null on failure
  std::string error;
};

struct GrammarCompilerStats {
  int64_t requests = 0, cache_hits = 0, compiled = 0, failed = 0;
  double compile_seconds = 0;  // total time spent compiling
  size_t cached = 0;           // entries held now
};

// Compiles specs for one vocabulary on a background thread so that a slow
// compile never stalls the engine's step loop. Results are cached by spec
// (bounded LRU); concurrent requests for one spec share one compile.
class GrammarCompiler {
 public:
  // vocab_size: the model's logits width (>= tokenizer vocabulary; the rest
  // are never allowed). stop_ids: tokens that end a sequence (EOS, EOT, ...);
  // the grammar allows them only where it may end.
  GrammarCompiler(const Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_ids,
                  size_t cache_capacity = 64);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Never blocks; the future becomes ready when the grammar is compiled (or
  // failed). Thread-safe.
  std::shared_future<CompileResult> compile(const StructuredOutputs& spec);
  GrammarCompilerStats stats() const;
  int32_t vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  int32_t vocab_size_;
  std::unique_ptr<Impl> impl_;
};

// 32 tokens per word: bit (id % 32) of word id / 32 set means "allowed".
inline int32_t bitmask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }

// One sequence's position in its grammar. Not thread-safe; cheap to create.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  // Advances by one sampled token; false (state unchanged) when the grammar
  // does not allow it.
  bool accept(int32_t token);
  // Writes the allowed next tokens into mask[bitmask_words(vocab_size)];
  // returns false when every token is allowed (the mask need not be applied).
  bool fill_next_token_bitmask(int32_t* mask, int32_t vocab_size);
  // A stop token was accepted: the output is complete.
  bool terminated() const;
  // The text so far is a whole sentence of the grammar (it may still go on).
  bool completed() const;
  void rollback(int32_t num_tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagellm::structured
