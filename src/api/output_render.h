// Engine outputs as plain data: the one place that decides what a response
// says (finish and stop reasons, logprobs with their token pieces and ranks).
// The OpenAI server builds its JSON from it (src/server/openai_response) and
// the Python package its objects (python/src/core_module.cpp), so the two
// never tell the same output differently.
//
// Text stays raw bytes here (a token's piece may end inside a character):
// each surface makes its own text of them (JSON: U+FFFD per bad byte; Python:
// its "replace" decoder).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/engine.h"

namespace pagellm::api {

// The raw bytes a token stands for (may be part of a character).
using TokenPiece = std::function<std::string(int32_t)>;

// One candidate token at a position.
struct RankedToken {
  int32_t token = 0;
  float logprob = 0;
  std::optional<int32_t> rank;  // 1: the most likely; none when not among the top tokens
  std::string piece;
};

// One generated token's logprobs.
struct PositionLogprobs {
  RankedToken chosen;
  std::vector<RankedToken> top;  // most likely first; may hold the chosen token
};

// What ended a sample: the stop string, else the stop token id, else nothing
// (vLLM's stop_reason).
using StopReason = std::variant<std::monostate, std::string, int32_t>;

// One sample's news in one output.
struct CompletionData {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::optional<std::vector<PositionLogprobs>> logprobs;  // none when the output carries none
  double logprob_sum = 0;                                  // of the chosen tokens, added in order
  const char* finish_reason = nullptr;                     // see finish_reason_name
  StopReason stop_reason;                                  // nothing until finished
  int32_t num_output_tokens = 0;  // the sample's total so far
};

// One engine output (deltas: what each sample produced since the last one).
struct OutputData {
  std::string request_id;
  bool finished = false;
  std::string error;  // empty unless the request failed
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;
  double queue_seconds = 0, ttft_seconds = 0, e2e_seconds = 0;
  std::vector<CompletionData> completions;
  // Prompt logprobs (RequestOutput::prompt_logprobs), once: entry i scores
  // prompt token i + 1; none in other outputs.
  std::optional<std::vector<PositionLogprobs>> prompt_logprobs;
};

// "stop", "length", "abort"; null while running.
const char* finish_reason_name(FinishReason r);
StopReason stop_reason(const std::string& stop_string, int32_t stop_token);
// A token's rank comes from the top list, or from TokenLogprob::rank where computed.
std::vector<PositionLogprobs> render_logprobs(const std::vector<TokenLogprob>& lps, const TokenPiece& piece);
CompletionData render_completion(const CompletionDelta& d, const TokenPiece& piece);
OutputData render_output(const RequestOutput& out, const TokenPiece& piece);

}  // namespace pagellm::api
