// OpenAI request bodies -> checked generation requests -> EngineRequests, for
// the HTTP server and `pagellm generate --batch` alike.
// Sampling fields are read by api/request_params.h; this file adds what is
// specific to the two endpoints: prompts (strings, token ids, batches), chat
// messages through the chat template, streaming options, echo, and a clear
// 400 for features the server does not have (tools, structured outputs, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_output.h"
#include "core/error.h"
#include "core/request_limits.h"
#include "engine/engine.h"
#include "sampling/sampling_params.h"

namespace pagellm {
class ChatTemplate;
class Tokenizer;
}  // namespace pagellm

namespace pagellm::api {

// The model this server serves, as requests see it. Borrowed pointers live as
// long as the engine.
struct ServedModel {
  std::string name;                  // what `model` must say (--served-model-name)
  std::vector<std::string> aliases;  // also accepted, e.g. the --model path
  const Tokenizer* tokenizer = nullptr;
  std::shared_ptr<const ChatTemplate> chat_template;  // null: chat requests get a 400
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;
  int32_t default_max_tokens = 16;  // completions that name none (OpenAI's default)
  RequestLimits limits;
  // Chat output handling (--enable-auto-tool-choice, --tool-call-parser,
  // --reasoning-parser); borrowed, null when not given.
  bool enable_auto_tool_choice = false;
  const chat::ToolParser* tool_parser = nullptr;
  const chat::ReasoningParser* reasoning_parser = nullptr;
  // --task embed: /v1/embeddings is served and the other endpoints answer
  // 400; score: /v1/rerank and /v1/score; generate: the generation ones.
  ServeTask task = ServeTask::Generate;
  // With task score: how a query and a document become one prompt.
  ScoreFormat score_format;

  // LoRA adapters served on the model (--enable-lora): whether a name is
  // one, now (adapters load and unload at run time). Null: none.
  std::function<bool(const std::string&)> has_adapter;

  bool answers_to(const std::string& model) const;
};

// A request for a model this server does not serve: the server answers 404
// with code model_not_found.
class ModelNotFound : public InvalidRequest {
 public:
  explicit ModelNotFound(const std::string& msg) : InvalidRequest(msg, "model") {}
};

// A missing or null `model` means the served one; the name of a LoRA adapter
// served on it selects that adapter (returned; "" for the model itself);
// another name throws ModelNotFound; a non-string is an InvalidRequest.
std::string check_model_field(const nlohmann::json& body, const ServedModel& m);

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // the prompt as text (echo)
};

// One /v1/completions or /v1/chat/completions request, checked.
struct GenerationRequest {
  bool chat = false;
  std::vector<PromptInput> prompts;  // chat: exactly one
  SamplingParams params;
  int32_t priority = 0;
  bool max_tokens_given = false;  // else each prompt gets the default (see to_engine_requests)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt text before the output
  // Completions with echo and max_tokens 0: the prompt alone (the engine's
  // one sampled token is left out of the reply).
  bool prompt_only = false;
  // What the reply shows of the prompt's logprobs (the engine computes
  // params.prompt_logprobs, the larger of the two): vLLM's prompt_logprobs
  // field with this many top tokens (-1: none), and OpenAI's legacy echo
  // with logprobs, whose choice logprobs then start with the prompt's.
  int32_t prompt_logprobs = -1;
  bool echo_logprobs = false;
  chat::ChatOutputOptions output;  // chat: reasoning and tool-call handling of each choice
  std::string lora;  // the LoRA adapter `model` named (check_model_field); "": the model itself
  bool logprobs() const { return params.logprobs >= 0; }
};

// `prompt`: a string, a list of strings, a list of token ids, or a list of
// token-id lists. Strings are tokenized (add_special: BOS as the vocabulary
// says; special-token text is recognised); ids are checked against the
// vocabulary. One list of ids is one prompt whatever its length (the context
// bounds it later); a batch holds at most max_prompts. Throws InvalidRequest
// naming `prompt`.
std::vector<PromptInput> parse_prompt_field(const nlohmann::json& prompt, const Tokenizer& tok, bool add_special,
                                            int32_t vocab_size, size_t max_prompts = RequestLimits{}.max_prompts);

// `messages` (+ add_generation_prompt, continue_final_message,
// chat_template_kwargs) rendered by the model's chat template. Content is a
// string or a list of text parts (joined with newlines). At most
// limits.max_messages messages and max_chat_template_kwargs keys. Throws
// InvalidRequest for malformed messages and template failures, TemplateError
// for the template's own raise_exception.
// tools: the request's checked `tools` (api/tool_request.h), given to the
// template; null for none. Assistant tool_calls whose arguments are JSON text
// reach the template as objects (what HF templates expect).
std::string render_chat_prompt(const nlohmann::json& body, const ServedModel& m,
                               const nlohmann::json& tools = nullptr);

// raw_body: the text `body` came from, if at hand (keeps the key order of
// JSON schemas; see api/structured_request.h).
GenerationRequest parse_completion_request(const nlohmann::json& body, const ServedModel& m,
                                           std::string_view raw_body = {});
GenerationRequest parse_chat_request(const nlohmann::json& body, const ServedModel& m, std::string_view raw_body = {});

// One EngineRequest per prompt, with ids "<id>-<prompt index>" (just <id> for
// one prompt). Without an explicit max_tokens, completions get
// min(default_max_tokens, room left in the context) and chat all the room left.
std::vector<EngineRequest> to_engine_requests(const GenerationRequest& g, const std::string& id, const ServedModel& m);

}  // namespace pagellm::api
