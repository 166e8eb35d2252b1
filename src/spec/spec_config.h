// Speculative decoding settings, given the vLLM way:
//   --speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
//                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
//   --speculative-config '{"model": "draft.gguf", "num_speculative_tokens": 4}'
#pragma once

#include <cstdint>
#include <string>

namespace pagellm {

enum class SpecMethod : uint8_t { None, Ngram, DraftModel };
const char* to_string(SpecMethod m);

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::None;
  int32_t num_speculative_tokens = 0;  // proposals per step at most (k)
  // ngram: the longest suffix of 2..4 tokens (by default) found earlier in
  // the prompt + output proposes the tokens that followed it.
  int32_t prompt_lookup_min = 2;
  int32_t prompt_lookup_max = 4;
  // draft_model: a GGUF file or HF folder with the target's vocabulary.
  std::string model;
  // > 0: no speculation in a step with more running sequences than this
  // (vLLM's disable_by_batch_size).
  int32_t disable_by_batch_size = 0;
  // Per sequence, pause speculation while recent drafts are mostly rejected
  // (see spec/adaptive.h); false: always propose.
  bool adaptive = true;

  bool enabled() const { return method != SpecMethod::None; }
  std::string describe() const;
};

// Parses the JSON object of --speculative-config. Throws Error naming the bad
// key: unknown keys, wrong types, values out of range, a method without what
// it needs. An empty string gives a disabled config.
SpeculativeConfig parse_speculative_config(const std::string& json_text);

}  // namespace pagellm
