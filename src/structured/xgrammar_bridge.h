// What grammar.cpp and grammar_compiler.cpp share of xgrammar; nothing
// outside src/structured includes it.
#pragma once

#include <xgrammar/xgrammar.h>

#include <string>

#include "sampling/sampling_params.h"

namespace pagellm::structured {

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

// spec -> xgrammar grammar (no vocabulary); InvalidRequest naming `param` on
// any failure. The structural limits are the caller's (check_grammar_limits).
xgrammar::Grammar to_xgrammar(const StructuredOutputs& s, const char* param);

// Writes the allowed next tokens into mask[bitmask_words(vocab_size)];
// false when every token is allowed.
bool fill_bitmask(xgrammar::GrammarMatcher& matcher, int32_t* mask, int32_t vocab_size);

// xgrammar's errors read "[12:00:00] /path/file.cc:123: message"; the message.
std::string clean_message(const std::string& what);

}  // namespace pagellm::structured
