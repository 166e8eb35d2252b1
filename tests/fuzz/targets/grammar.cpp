// A structured-output spec from bytes: the first byte picks the kind (JSON
// schema, regex, EBNF grammar, choice list, structural tag), the rest is its
// text. It goes through validate() under the default limits, as a request's
// spec does, and, when accepted, through the compiler against a synthetic
// vocabulary: in a worker process under a budget below libFuzzer's time-out,
// then the first token mask. A refusal, an empty language or a budget passed
// is a clean answer; a crashed worker or an exception other than
// pagellm::Error is a finding.
#include <cstdlib>
#include <memory>

#include "common.h"
#include "core/request_limits.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "structured/grammar.h"
#include "targets.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::fuzz {
namespace {

struct Vocab {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<structured::GrammarCompiler> compiler;

  Vocab() {
    const ScratchDir dir;
    GGUFWriter w;
    add_synthetic_vocab(w, 320);
    w.write(dir.path() + "/vocab.gguf");
    file = GGUFFile::open(dir.path() + "/vocab.gguf");
    tokenizer = Tokenizer::from_gguf(*file);
    structured::GrammarCompilerOptions o;
    o.workers = 1;
    o.budget.time = std::chrono::milliseconds(4000);  // libFuzzer's time-out here is 10 s
    o.budget.memory_bytes = size_t{512} << 20;
    o.cache_entries = 1;
    compiler = std::make_unique<structured::GrammarCompiler>(*tokenizer, tokenizer->vocab_size(),
                                                             tokenizer->eog_ids(), o);
  }
};

}  // namespace

int grammar(const uint8_t* data, size_t size) {
  static Vocab vocab;
  if (size < 1) return 0;
  using Kind = StructuredOutputs::Kind;
  static constexpr Kind kKinds[] = {Kind::Json, Kind::Regex, Kind::Grammar, Kind::Choice, Kind::StructuralTag};
  StructuredOutputs spec;
  spec.kind = kKinds[data[0] % 5];
  spec.any_whitespace = (data[0] / 5) % 2 == 0;
  spec.spec.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (refused(Refusal::Error, [&] { structured::validate(spec, GrammarLimits{}, "fuzz"); })) return 0;
  const structured::CompileResult r = vocab.compiler->compile(spec)->get();
  using E = structured::CompileResult::Error;
  if (r.error_kind == E::Internal) {
    std::fprintf(stderr, "grammar compile failed inside: %s\n", r.error.c_str());
    std::abort();
  }
  if (!r.grammar) return 0;  // the client's error: an empty language, or over the budget
  structured::GrammarMatcher m(r.grammar);
  std::vector<int32_t> mask(static_cast<size_t>(structured::bitmask_words(vocab.compiler->vocab_size())));
  m.fill_next_token_bitmask(mask.data(), vocab.compiler->vocab_size());
  if (!structured::any_allowed(mask.data(), vocab.compiler->vocab_size())) std::abort();  // the compile promised one
  return 0;
}

}  // namespace pagellm::fuzz
