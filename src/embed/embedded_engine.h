// The engine as a library: the Python package and the C API both stand on
// this. One AsyncEngine (its step loop on its own thread), engine arguments
// and sampling parameters as JSON objects with vLLM's names, prompts as text,
// token ids or chat messages. Every method is safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/openai_request.h"
#include "api/output_render.h"
#include "embed/engine_args.h"
#include "engine/async_engine.h"

namespace pagellm::embed {

class EmbeddedEngine {
 public:
  // Throws InvalidRequest for bad arguments, Error when the model does not load.
  explicit EmbeddedEngine(const nlohmann::json& engine_args, const LoadProgress& progress = {});
  ~EmbeddedEngine();  // aborts what is still running

  // Sampling parameters with vLLM's SamplingParams names (n, temperature,
  // top_p, top_k, min_p, seed, stop, stop_token_ids, max_tokens, min_tokens,
  // logprobs, presence/frequency/repetition_penalty, logit_bias, ignore_eos,
  // skip_special_tokens, include_stop_str_in_output, structured_outputs,
  // guided_*, response_format) plus priority. A missing max_tokens is vLLM's
  // default, 16; null means all the room the context has left.
  // Throws InvalidRequest naming the field.
  EngineRequest make_request(const std::string& id, std::vector<int32_t> prompt_ids,
                             const nlohmann::json& sampling) const;

  // Queues requests, all or none (see AsyncEngine::submit_group); their
  // outputs go to `sink`, or wait in the returned streams when it is null.
  std::vector<std::shared_ptr<RequestStream>> submit(std::vector<EngineRequest> reqs,
                                                     std::shared_ptr<OutputQueue> sink = nullptr);
  void abort(const std::string& id) { engine_->abort(id); }
  // LoRA adapters (engine argument enable_lora): a request names one with
  // "lora" beside its sampling fields. load_lora throws InvalidRequest for a
  // taken name, Error for a file that does not fit; unload_lora: false for
  // an unknown name (requests using it finish with it).
  void load_lora(const std::string& name, const std::string& path);
  bool unload_lora(const std::string& name);
  std::vector<std::string> lora_names() const;
  // An output as plain data (src/api/output_render.h), token pieces from this
  // engine's tokenizer: what the Python package makes its objects of.
  api::OutputData render(const RequestOutput& out) const;
  // Stops accepting; running requests get `grace` to finish, then are aborted.
  void shutdown(std::chrono::milliseconds grace) { engine_->shutdown(grace); }

  // Text -> ids as a prompt is tokenized (add_special: BOS as the vocabulary
  // says; special-token text is recognised).
  std::vector<int32_t> encode(const std::string& text, bool add_special) const;
  // The prompt of a (query, document) pair as the model's score format makes
  // it (score requests); InvalidRequest when the model has no score head.
  std::vector<int32_t> score_prompt(const std::string& query, const std::string& document) const;
  // Throws InvalidRequest for ids outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;

  // A conversation rendered by the chat template: `messages` as in a chat
  // completions request; `options` may hold add_generation_prompt,
  // continue_final_message, chat_template_kwargs and tools.
  std::string render_chat(const nlohmann::json& messages, const nlohmann::json& options) const;

  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  int32_t max_model_len() const { return engine_->max_model_len(); }
  int32_t vocab_size() const { return served_.vocab_size; }
  // The length of a pooled vector (the model's hidden size).
  int32_t embedding_size() const { return engine_->model_config().n_embd; }
  std::string describe() const { return engine_->describe(); }
  size_t num_in_flight() const { return engine_->num_in_flight(); }
  // Counters and gauges (requests, tokens, KV usage, speculative decoding).
  nlohmann::json stats() const;

 private:
  std::unique_ptr<AsyncEngine> engine_;
  api::ServedModel served_;  // what the shared request parsers check against
  std::optional<uint64_t> seed_;
  mutable std::atomic<uint64_t> submitted_{0};  // numbers requests for the derived seeds
};

}  // namespace pagellm::embed
