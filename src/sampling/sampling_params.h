// Per-request generation settings, by their OpenAI / vLLM names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagellm {

// Constrained decoding (vLLM's StructuredOutputsParams): the output must match
// one grammar, given as a JSON schema, a regex, a list of choices, an EBNF
// grammar or an xgrammar structural tag. src/structured compiles and runs it.
struct StructuredOutputs {
  enum class Kind : uint8_t { None, Json, JsonObject, Regex, Choice, Grammar, StructuralTag };
  Kind kind = Kind::None;
  // Json: the schema; Regex: the pattern; Grammar: EBNF (GBNF) text with a
  // `root` rule; StructuralTag: its JSON; Choice: a JSON array of strings;
  // JsonObject: empty (any JSON object).
  std::string spec;
  // JSON may hold whitespace between tokens (runs of at most 8); false: compact
  // (vLLM's disable_any_whitespace).
  bool any_whitespace = true;
  // The request field that gave it (response_format, guided_json, ...), for
  // errors found after the request was queued.
  std::string field = "structured_outputs";

  bool active() const { return kind != Kind::None; }
};

struct SamplingParams {
  // Sampling. temperature 0 means greedy.
  float temperature = 1.0f;
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 or -1: off
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; applies to prompt + output tokens
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens only
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens only
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias in [-100, 100]
  std::optional<uint64_t> seed;     // reproducible sampling when set
  int32_t logprobs = -1;            // -1: none; k >= 0: the chosen token's logprob + top-k
  int32_t prompt_logprobs = -1;

  // Stopping.
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;

  int32_t n = 1;  // parallel samples from one prompt

  StructuredOutputs structured;

  // Throws InvalidRequest (with the offending parameter's name) for values out
  // of range. vocab_size bounds logit_bias / stop_token_ids when > 0.
  void validate(int32_t vocab_size = 0) const;
  bool greedy() const { return temperature == 0.0f; }
};

}  // namespace pagellm
