// The OpenAI-compatible API over one AsyncEngine:
//   POST /v1/completions, POST /v1/chat/completions   (JSON or SSE streaming)
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/responses (OpenAI Responses; GET and DELETE /v1/responses/{id}
//        and GET /v1/responses/{id}/input_items when stored),
//   POST /v1/messages, /v1/messages/count_tokens (Anthropic Messages)
//   POST /v1/embeddings (with --task embed; server/openai_embeddings.cpp)
//   POST /v1/rerank, /rerank, /v2/rerank, /v1/score, /score (with --task score; server/openai_score.cpp)
//   POST /tokenize, /detokenize                        (vLLM's shapes)
//   GET  /health, /metrics (Prometheus), /version
// Handlers run on the HTTP thread pool; each generation request is a
// GenerationJob whose streams it reads until the end or the client leaves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "api/openai_request.h"
#include "core/json_limits.h"
#include "engine/async_engine.h"
#include "server/http_request_reader.h"
#include "server/metrics_render.h"
#include "server/response_store.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagellm::server {

// Requests are parsed by src/api, which `pagellm generate --batch` shares.
using api::GenerationRequest;
using api::ServedModel;

class HttpServer;
class ChatTurn;
struct TurnRenderer;  // server/chat_dialects.cpp

struct OpenAIServerOptions {
  std::string api_key;                           // empty: no authentication
  bool log_requests = true;                      // one info line per generation request
  std::chrono::milliseconds poll_interval{100};  // how often waiting handlers look for a vanished client
  MetricsPrefix metrics_prefix = MetricsPrefix::Pagellm;  // --metrics-prefix
  // /v1/responses conversations kept for previous_response_id (--responses-store-size; 0: none).
  size_t responses_store_size = 100;
  size_t responses_store_bytes = size_t{256} << 20;
};

class OpenAIServer {
 public:
  OpenAIServer(AsyncEngine& engine, ServedModel model, OpenAIServerOptions options = {});
  void register_routes(HttpServer& http);

  // Shutdown, step 1: from now on requests get 503 and /health says so.
  void begin_draining() { draining_ = true; }
  bool draining() const { return draining_; }
  // Waits until no handler (streams included) is running, up to `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout) const;
  HttpCounters& http_counters() { return counters_; }
  const ServedModel& model() const { return model_; }

 private:
  friend class ActiveRequest;
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // A reply's `model`: the adapter the request named, as vLLM answers, else the served name.
  const std::string& reply_model_name(const std::string& lora) const { return lora.empty() ? model_.name : lora; }
  // server/chat_dialects.cpp: requests translated into a chat request, replies in their API's shapes.
  void responses(const httplib::Request& req, httplib::Response& res);
  void get_response(const httplib::Request& req, httplib::Response& res);
  void delete_response(const httplib::Request& req, httplib::Response& res);
  void list_input_items(const httplib::Request& req, httplib::Response& res);
  void messages(const httplib::Request& req, httplib::Response& res);
  void count_message_tokens(const httplib::Request& req, httplib::Response& res);
  void answer_as_anthropic(const httplib::Request& req, httplib::Response& res, const std::function<void()>& handler);
  void embeddings(const httplib::Request& req, httplib::Response& res);
  // server/openai_score.cpp (--task score).
  void rerank(const httplib::Request& req, httplib::Response& res);
  void score(const httplib::Request& req, httplib::Response& res);
  // Runs every prompt as a score request; the scores in prompt order.
  // Every pair's score, in order; nothing when the client left (the job is aborted).
  std::optional<std::vector<float>> run_scores(const std::vector<std::vector<int32_t>>& prompts,
                                               const std::string& id);
  // 400 naming the task when the endpoint is not the served task's.
  void require_task(ServeTask task, const char* endpoint) const;
  void run_turn(const GenerationRequest& g, const std::string& id, const std::function<TurnRenderer()>& make_renderer,
                const std::function<void(const ChatTurn&)>& reply, httplib::Response& res);
  void list_models(const httplib::Request& req, httplib::Response& res);
  // server/lora_routes.cpp (--enable-lora): vLLM's run-time adapter loading,
  // and the adapters' /v1/models cards.
  void load_lora_adapter(const httplib::Request& req, httplib::Response& res);
  void unload_lora_adapter(const httplib::Request& req, httplib::Response& res);
  std::vector<nlohmann::json> adapter_cards() const;
  void get_model(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void tokenizer_info(const httplib::Request& req, httplib::Response& res);
  void health(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);
  // server/kv_events_route.cpp (--kv-events): the engine's KV events as Server-Sent Events.
  void kv_events(const httplib::Request& req, httplib::Response& res);
  void version(const httplib::Request& req, httplib::Response& res);

  // 401 unless the request carries the key (for guarded routes).
  void authorize(const httplib::Request& req) const;
  std::optional<HttpRefusal> auth_refusal(std::string_view path, std::optional<std::string_view> authorization) const;
  // 503 while draining.
  void require_accepting() const;
  nlohmann::json model_card() const;

  AsyncEngine& engine_;
  ServedModel model_;
  OpenAIServerOptions options_;
  HttpCounters counters_;
  ResponseStore response_store_;
  int64_t started_at_;  // Unix seconds
  std::atomic<bool> draining_{false};
  mutable std::atomic<int64_t> active_{0};
};

// Counts a running handler (or stream) for wait_idle.
class ActiveRequest {
 public:
  explicit ActiveRequest(const OpenAIServer& s) : s_(s) { s_.active_++; }
  ~ActiveRequest() { s_.active_--; }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  const OpenAIServer& s_;
};

// The request body as a JSON object: 400 for invalid UTF-8 (with the byte
// offset), invalid JSON, a non-object, or a body past `limits` (nesting depth,
// element count, estimated DOM memory).
nlohmann::json parse_json_body(const std::string& body, const JsonLimits& limits = kRequestJsonLimits);

// "cmpl-" / "chatcmpl-" + 32 random hex digits.
std::string make_request_id(const char* prefix);

}  // namespace pagellm::server
