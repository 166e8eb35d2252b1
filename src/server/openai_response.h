// Engine outputs -> OpenAI response JSON (non-streaming) and SSE chunks
// (streaming), for /v1/completions and /v1/chat/completions. What a response
// says comes from the shared renderer (src/api/output_render.h); this file
// gives it OpenAI's shapes. Pure: no I/O, so the shapes are unit-tested.
//
// Choices: prompt p's sample k is choice p * n + k, as OpenAI numbers them.
// vLLM extensions kept: choice.stop_reason (the stop string or token id that
// ended it), finish_reason "abort" for requests cut off by the server.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/output_render.h"
#include "chat/chat_output.h"
#include "engine/engine.h"

namespace pagellm::server {

using api::TokenPiece;

struct ResponseMeta {
  std::string id;       // cmpl-... / chatcmpl-...
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool chat = false;
};

struct Usage {
  int64_t prompt_tokens = 0;      // each prompt once, whatever n is
  int64_t completion_tokens = 0;  // every generated token of every choice
  int64_t cached_tokens = 0;      // prompt tokens found in the prefix cache
};

nlohmann::json usage_json(const Usage& u);
// "stop", "length", "abort"; null while running.
nlohmann::json finish_reason_json(FinishReason r);
// The stop string, else the stop token id, else null.
nlohmann::json stop_reason_json(const api::StopReason& r);
// Completions: {tokens, token_logprobs, top_logprobs, text_offset}; offsets
// count code points from `first_offset` (the text before these tokens).
// top_logprobs dicts hold the k most likely tokens plus the chosen one.
nlohmann::json completion_logprobs_json(const std::vector<api::PositionLogprobs>& lps, size_t first_offset);
// vLLM's prompt_logprobs: null for the first token, then per token a dict
// "token id" -> {logprob, rank, decoded_token} of the token itself and its
// `top` most likely alternatives.
nlohmann::json prompt_logprobs_json(const std::vector<TokenLogprob>& lps, int32_t top, const TokenPiece& piece);
// Completions with echo and logprobs: completion_logprobs_json's shape over
// the prompt (its first token with null logprob and top_logprobs; each
// other with its `top` alternatives) followed by the completion's tokens.
nlohmann::json echo_logprobs_json(int32_t first_token, const std::vector<TokenLogprob>& prompt,
                                  const std::vector<TokenLogprob>& completion, int32_t top, const TokenPiece& piece);
// Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}.
nlohmann::json chat_logprobs_json(const std::vector<api::PositionLogprobs>& lps);

// "data: <json>\n\n" (invalid UTF-8 replaced, never throws).
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// Compact JSON text, invalid UTF-8 replaced.
std::string dump_json(const nlohmann::json& j);

// What one choice produced so far.
struct ChoiceState {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  int64_t num_tokens = 0;
  size_t text_offset = 0;  // code points emitted so far (streaming text_offset)
  FinishReason finish = FinishReason::None;
  api::StopReason stop_reason;
  bool prompt_sent = false;  // streaming: its prompt's logprobs (and echo) went out
};

// Chat: reasoning_content, content and tool_calls of a choice's message, and
// finish_reason "tool_calls" when it called any (src/chat/chat_output.h).
// Tool-call ids are "chatcmpl-tool-" + 32 random hex digits.
nlohmann::json tool_call_json(const chat::ToolCall& call, const std::string& id);
std::string make_tool_call_id();

// What a reply shows of its prompts' logprobs (api::GenerationRequest).
struct PromptLogprobsView {
  int32_t prompt_logprobs = -1;  // >= 0: vLLM's prompt_logprobs, with this many top tokens
  int32_t echo_top = -1;         // >= 0: completions' choice logprobs start with the prompt's (echo)
  std::vector<int32_t> first_tokens;  // per prompt: its first token (which has no logprob)
  bool any() const { return prompt_logprobs >= 0 || echo_top >= 0; }
};

// Collects every output of a request (all its prompts) for one JSON reply.
// Prompt logprobs go on each completion choice (vLLM's place), and at the
// top of a chat reply.
class ResponseCollector {
 public:
  // echo_prefixes: per prompt, text put before each of its choices (empty: none).
  ResponseCollector(ResponseMeta meta, size_t num_prompts, int32_t n, bool logprobs,
                    std::vector<std::string> echo_prefixes = {}, chat::ChatOutputOptions output = {},
                    PromptLogprobsView prompt_view = {});
  void add(size_t prompt_index, const RequestOutput& out);
  nlohmann::json render(const TokenPiece& piece) const;
  const Usage& usage() const { return usage_; }
  const std::vector<ChoiceState>& choices() const { return choices_; }

 private:
  ResponseMeta meta_;
  int32_t n_;
  bool logprobs_;
  std::vector<std::string> echo_;
  chat::ChatOutputOptions output_;
  PromptLogprobsView prompt_view_;
  std::vector<std::vector<TokenLogprob>> prompt_logprobs_;  // per prompt
  std::vector<ChoiceState> choices_;
  std::vector<bool> prompt_seen_;
  Usage usage_;
};

// Turns outputs into SSE events as they come.
class StreamRenderer {
 public:
  // With prompt logprobs (prompt_view), each choice's first chunk after its
  // prompt was computed carries them: completions with echo and logprobs
  // send the prompt's text then (not in begin()), with logprobs over the
  // prompt and the first tokens; prompt_logprobs go on each completions
  // choice's first chunk, and on the first chunk of a chat reply.
  StreamRenderer(ResponseMeta meta, size_t num_prompts, int32_t n, bool logprobs, bool include_usage,
                 std::vector<std::string> echo_prefixes, TokenPiece piece, chat::ChatOutputOptions output = {},
                 PromptLogprobsView prompt_view = {});
  // The opening events: chat sends each choice's role; completions with echo
  // (and no logprobs) send each choice's prompt text.
  std::string begin();
  // The chunks for one output: one per choice with news (text, logprobs or a
  // finish reason); nothing for a step whose text is held back.
  std::string add(size_t prompt_index, const RequestOutput& out);
  // An error event (the request failed after the stream started).
  std::string error(const nlohmann::json& error_body) const;
  // The usage chunk (empty choices) when asked for, then [DONE].
  std::string end() const;
  const Usage& usage() const { return usage_; }
  const std::vector<ChoiceState>& choices() const { return choices_; }

 private:
  nlohmann::json chunk(nlohmann::json choice) const;

  ResponseMeta meta_;
  int32_t n_;
  bool logprobs_;
  bool include_usage_;
  std::vector<std::string> echo_;
  TokenPiece piece_;
  std::vector<ChoiceState> choices_;
  std::vector<std::unique_ptr<chat::ChatOutputStream>> outputs_;  // chat: one per choice
  std::vector<int32_t> calls_sent_;                                // chat: tool calls streamed per choice
  PromptLogprobsView prompt_view_;
  std::vector<std::optional<std::vector<TokenLogprob>>> prompt_logprobs_;  // per prompt, once computed
  std::vector<bool> prompt_seen_;
  Usage usage_;
};

}  // namespace pagellm::server
