// tokenizer.json: the SAX reader of model.vocab / model.merges, the
// normalizer, pre-tokenizer, post-processor and added tokens, then a short
// text (specials, digits, accents, CJK, emoji, whitespace runs) encoded and
// decoded by whatever tokenizer came out.
#include "common.h"
#include "targets.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::fuzz {

int tokenizer_json(const uint8_t* data, size_t size) {
  static const ScratchDir dir;
  const std::string path = dir.write("tokenizer.json", data, size);
  // Loading runs at start-up: the CLI prints any std::exception as one error line.
  refused(Refusal::AnyException, [&] {
    const auto tok = Tokenizer::from_hf_dir(path);
    const auto ids = tok->encode("Hello world, <s></s><|endoftext|> 12345\n\t  héllo 你好 🙂", true, true);
    for (int32_t id : ids) FUZZ_INVARIANT(id >= 0 && id < tok->vocab_size());
    (void)tok->decode(ids, false);
    (void)tok->decode(ids, true);
    (void)tok->encode("plain text, no specials", false, false);
  });
  return 0;
}

}  // namespace pagellm::fuzz
