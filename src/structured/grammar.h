// Grammar-constrained decoding on xgrammar's C++ core (the engine vLLM, SGLang
// and TensorRT-LLM use; built from its PyPI source package by tools/setup.sh).
//
//   validate(spec, limits)    request time: structural limits, then spec ->
//                             grammar, no vocabulary (400s)
//   GrammarCompiler::compile  spec -> grammar + per-token tables for this
//                             vocabulary, in a worker process under a time and
//                             memory budget, cached (LRU by entries and bytes)
//   GrammarMatcher            one sequence's state: the bitmask of allowed next
//                             tokens; advanced with every accepted token
//
// The scheduler and the runner never see any of this: the engine asks the
// matcher for a bitmask before sampling and feeds it the sampled token.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/bounded_child.h"
#include "core/histogram.h"
#include "core/request_limits.h"
#include "sampling/sampling_params.h"

namespace pagellm {
class Tokenizer;
}

namespace pagellm::structured {

// Throws InvalidRequest naming `param` when `spec` cannot become a grammar: a
// spec over `limits` (size, nesting, nodes), a schema that is not JSON or not
// a valid schema, a keyword xgrammar would silently ignore (e.g. uniqueItems,
// not, if/then/else, allOf of several schemas, an external $ref), an empty
// anyOf / oneOf / enum, a bad regex, EBNF or structural tag, an empty or
// non-string choice list. Costs no vocabulary work (milliseconds within the
// limits), so the API layer calls it before queueing.
void validate(const StructuredOutputs& spec, const GrammarLimits& limits, const char* param);

// The structural limits alone (validate's first step); a linear scan.
void check_grammar_limits(const StructuredOutputs& spec, const GrammarLimits& limits, const char* param);

// What a spec is, for messages: "JSON schema", "regex", "grammar", "choice
// list" or "structural tag".
const char* kind_name(StructuredOutputs::Kind k);

// An EBNF grammar whose only sentences are the given strings (choice).
std::string choice_grammar(const std::vector<std::string>& choices);

class CompiledGrammar;  // xgrammar's compiled grammar (grammar.cpp)

struct CompileResult {
  enum class Error {
    None,
    Invalid,      // the spec is no grammar, or its language is empty: the client's error (400)
    OverBudget,   // the compile passed its time or memory budget (400: too complex)
    Unavailable,  // the compiler is stopping (503)
    Internal,     // the worker process crashed (500)
  };
  std::shared_ptr<const CompiledGrammar> grammar;  // null on failure
  Error error_kind = Error::None;
  std::string error;
};

struct GrammarCompilerStats {
  int64_t requests = 0, cache_hits = 0, compiled = 0, failed = 0;
  int64_t over_budget = 0, cancelled = 0;  // of the failed: budget passed; dropped because nobody waited
  double compile_seconds = 0;  // total time spent compiling
  size_t cached = 0;           // entries held now
  size_t cached_bytes = 0;     // their memory (xgrammar's estimate)
  int64_t in_progress = 0;     // compiles running in worker processes now
  int64_t queued = 0;          // compiles waiting for a worker
  Histogram compile_time;      // seconds per finished compile (worker process start to result)
};

struct GrammarCompilerOptions {
  GrammarLimits limits;
  int workers = 4;                        // compiles at once, each a process (--grammar-compile-workers)
  ChildBudget budget;                     // per compile (--grammar-compile-timeout, --grammar-compile-memory)
  size_t cache_entries = 64;              // compiled grammars kept
  size_t cache_bytes = size_t{128} << 20;  // and their memory (--grammar-cache-memory)
};

// A compile in progress or done. The engine holds one per waiting request;
// when every holder has dropped it, the compile is cancelled (its worker
// process killed, or its queue entry skipped).
class PendingGrammar {
 public:
  explicit PendingGrammar(std::shared_future<CompileResult> result) : result_(std::move(result)) {}
  bool ready() const { return result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  bool wait_for(std::chrono::milliseconds d) const { return result_.wait_for(d) == std::future_status::ready; }
  // Blocks until ready.
  const CompileResult& get() const { return result_.get(); }

 private:
  std::shared_future<CompileResult> result_;
};

// Compiles specs for one vocabulary on worker threads, each compile in a
// child process (core/bounded_child.h), so that a slow or huge compile never
// stalls the engine's step loop, never blocks another request's compile
// beyond the worker count, and can always be stopped. Results are cached by
// spec; concurrent requests for one spec share one compile.
class GrammarCompiler {
 public:
  // vocab_size: the model's logits width (>= tokenizer vocabulary; the rest
  // are never allowed). stop_ids: tokens that end a sequence (EOS, EOT, ...);
  // the grammar allows them only where it may end.
  GrammarCompiler(const Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_ids,
                  GrammarCompilerOptions options = {});
  // Kills compiles in progress; their waiters get Unavailable.
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Never blocks. Thread-safe.
  std::shared_ptr<PendingGrammar> compile(const StructuredOutputs& spec);
  GrammarCompilerStats stats() const;
  int32_t vocab_size() const { return vocab_size_; }
  const GrammarCompilerOptions& options() const { return options_; }

 private:
  struct Impl;
  int32_t vocab_size_;
  GrammarCompilerOptions options_;
  std::unique_ptr<Impl> impl_;
};

// 32 tokens per word: bit (id % 32) of word id / 32 set means "allowed".
inline int32_t bitmask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }
// Whether the mask allows any token below vocab_size.
inline bool any_allowed(const int32_t* mask, int32_t vocab_size) {
  for (int32_t w = 0; w < vocab_size / 32; ++w)
    if (mask[w] != 0) return true;
  for (int32_t id = vocab_size / 32 * 32; id < vocab_size; ++id)
    if ((mask[id / 32] >> (id % 32)) & 1) return true;
  return false;
}

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
