// Route table and the small endpoints; the generation endpoints are in
// openai_generate.cpp.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <functional>
#include <random>
#include <thread>

#include "api/json_fields.h"
#include "api/tool_request.h"
#include "api/utf8_check.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/openai_response.h"
#include "server/openai_server.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::server {

using namespace api;  // request parsing and UTF-8 checks (src/api)

using nlohmann::json;

json parse_json_body(const std::string& body, const JsonLimits& limits) {
  if (auto at = find_invalid_utf8(body))
    throw InvalidRequest(fmt::format("the request body is not valid UTF-8 (bad byte 0x{:02X} at offset {})",
                                     static_cast<unsigned char>(body[*at]), *at));
  json j;
  try {
    // The pre-scan refuses deep or DOM-heavy bodies before nlohmann allocates:
    // handlers copy and dump parts of the body, which recurses per level.
    j = parse_json_bounded(body, limits, "the request body");
  } catch (const Error& e) {
    throw InvalidRequest(e.what());
  }
  if (!j.is_object()) throw InvalidRequest("the request body must be a JSON object");
  return j;
}

std::string make_request_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}() ^ std::hash<std::thread::id>{}(std::this_thread::get_id())};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

OpenAIServer::OpenAIServer(AsyncEngine& engine, ServedModel model, OpenAIServerOptions options)
    : engine_(engine),
      model_(std::move(model)),
      options_(std::move(options)),
      response_store_(options_.responses_store_size, options_.responses_store_bytes),
      started_at_(std::time(nullptr)) {
  if (engine_.lora_enabled() && !model_.has_adapter)
    model_.has_adapter = [this](const std::string& name) {
      for (const LoraInfo& l : engine_.loras())
        if (l.name == name) return true;
      return false;
    };
}

bool OpenAIServer::wait_idle(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (active_ > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::optional<HttpRefusal> OpenAIServer::auth_refusal(std::string_view path,
                                                      std::optional<std::string_view> authorization) const {
  if (options_.api_key.empty() || !route_needs_api_key(path)) return std::nullopt;
  if (!authorization) return HttpRefusal{401, "missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key"};
  if (!authorization_matches(*authorization, options_.api_key))
    return HttpRefusal{401, "incorrect API key", "invalid_api_key"};
  return std::nullopt;
}

namespace {

// The key as an Authorization value: "Authorization: Bearer KEY", or
// Anthropic's clients' "x-api-key: KEY".
std::optional<std::string> authorization_of(const std::function<bool(const char*)>& has,
                                            const std::function<std::string(const char*)>& get) {
  if (has("Authorization")) return get("Authorization");
  if (has("x-api-key")) return "Bearer " + get("x-api-key");
  return std::nullopt;
}

}  // namespace

void OpenAIServer::authorize(const httplib::Request& req) const {
  const auto header = authorization_of([&](const char* k) { return req.has_header(k); },
                                       [&](const char* k) { return req.get_header_value(k); });
  std::optional<std::string_view> view;
  if (header) view = *header;
  if (auto r = auth_refusal(req.path, view)) throw HttpError(r->status, r->message, r->code);
}

void OpenAIServer::require_accepting() const {
  if (draining_ || !engine_.accepting()) throw ShuttingDown("the server is shutting down");
}

void OpenAIServer::register_routes(HttpServer& http) {
  // The key is checked on the head, before a body is read; again in each
  // handler, for callers that bypass the connection layer.
  http.set_head_check([this](const RequestHead& head) {
    const auto header = authorization_of([&](const char* k) { return head.has_header(k); },
                                         [&](const char* k) { return std::string(head.header(k)); });
    std::optional<std::string_view> view;
    if (header) view = *header;
    return auth_refusal(head.path(), view);
  });
  auto bind = [this](void (OpenAIServer::*fn)(const httplib::Request&, httplib::Response&)) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      ActiveRequest active(*this);
      authorize(req);
      (this->*fn)(req, res);
    };
  };
  http.post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ActiveRequest active(*this);
    authorize(req);
    require_task(ServeTask::Generate, "/v1/completions");
    generate(req, res, false);
  });
  http.post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ActiveRequest active(*this);
    authorize(req);
    require_task(ServeTask::Generate, "/v1/chat/completions");
    generate(req, res, true);
  });
  auto generation = [this, bind](void (OpenAIServer::*fn)(const httplib::Request&, httplib::Response&),
                                 const char* endpoint) {
    return [this, endpoint, handler = bind(fn)](const httplib::Request& req, httplib::Response& res) {
      authorize(req);
      require_task(ServeTask::Generate, endpoint);
      handler(req, res);
    };
  };
  http.post("/v1/responses", generation(&OpenAIServer::responses, "/v1/responses"));
  http.get("/v1/responses/([^/]+)", bind(&OpenAIServer::get_response));
  http.del("/v1/responses/([^/]+)", bind(&OpenAIServer::delete_response));
  http.get("/v1/responses/([^/]+)/input_items", bind(&OpenAIServer::list_input_items));
  http.post("/v1/messages", generation(&OpenAIServer::messages, "/v1/messages"));
  http.post("/v1/messages/count_tokens", generation(&OpenAIServer::count_message_tokens, "/v1/messages/count_tokens"));
  http.post("/v1/embeddings", bind(&OpenAIServer::embeddings));
  // vLLM's spellings (/v2/rerank: Cohere's v2 client; llama-server also /rerank).
  for (const char* path : {"/v1/rerank", "/rerank", "/v2/rerank"}) http.post(path, bind(&OpenAIServer::rerank));
  for (const char* path : {"/v1/score", "/score"}) http.post(path, bind(&OpenAIServer::score));
  http.get("/v1/models", bind(&OpenAIServer::list_models));
  http.post("/v1/load_lora_adapter", bind(&OpenAIServer::load_lora_adapter));
  http.post("/v1/unload_lora_adapter", bind(&OpenAIServer::unload_lora_adapter));
  http.get("/v1/models/(.+)", bind(&OpenAIServer::get_model));
  http.post("/tokenize", bind(&OpenAIServer::tokenize));
  http.post("/detokenize", bind(&OpenAIServer::detokenize));
  http.get("/tokenizer_info", bind(&OpenAIServer::tokenizer_info));
  http.get("/health", bind(&OpenAIServer::health));
  http.get("/metrics", bind(&OpenAIServer::metrics));
  http.get("/v1/kv_events", bind(&OpenAIServer::kv_events));
  http.get("/version", bind(&OpenAIServer::version));
}

json OpenAIServer::model_card() const {
  return {{"id", model_.name},
          {"object", "model"},
          {"created", started_at_},
          {"owned_by", "pagellm"},
          {"root", model_.aliases.empty() ? model_.name : model_.aliases.front()},
          {"parent", nullptr},
          {"max_model_len", model_.max_model_len}};
}

void OpenAIServer::list_models(const httplib::Request&, httplib::Response& res) {
  json data = json::array({model_card()});
  for (json& card : adapter_cards()) data.push_back(std::move(card));
  res.set_content(dump_json({{"object", "list"}, {"data", data}}), "application/json");
}

void OpenAIServer::get_model(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches.size() > 1 ? std::string(req.matches[1]) : "";
  if (model_.answers_to(id)) return res.set_content(dump_json(model_card()), "application/json");
  for (const json& card : adapter_cards())
    if (card["id"] == id) return res.set_content(dump_json(card), "application/json");
  throw HttpError(404, fmt::format("The model '{}' does not exist", sanitize_utf8(id)), "model_not_found", "model");
}

void OpenAIServer::tokenize(const httplib::Request& req, httplib::Response& res) {
  require_accepting();
  const json body = parse_json_body(req.body);
  check_model_field(body, model_);
  const Tokenizer& tok = *model_.tokenizer;
  std::vector<int32_t> ids;
  auto flag = [&](const char* key, bool fallback) {
    if (!body.contains(key) || body[key].is_null()) return fallback;
    if (!body[key].is_boolean()) throw InvalidRequest(fmt::format("'{}' must be a boolean", key), key);
    return body[key].get<bool>();
  };
  if (body.contains("messages")) {
    ids = tok.encode(render_chat_prompt(body, model_, parse_tool_list(body, model_.limits.grammar)), flag("add_special_tokens", false), true);
  } else if (body.contains("prompt")) {
    if (!body["prompt"].is_string()) throw InvalidRequest("'prompt' must be a string", "prompt");
    const std::string& text = body["prompt"].get_ref<const std::string&>();
    require_valid_utf8(text, "prompt");
    ids = tok.encode(text, flag("add_special_tokens", true), true);
  } else {
    throw InvalidRequest("give 'prompt' (a string) or 'messages'", "prompt");
  }
  json out = {{"count", ids.size()}, {"max_model_len", model_.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (flag("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(sanitize_utf8(tok.token_to_piece(id, true)));
    out["token_strs"] = strs;
  }
  res.set_content(dump_json(out), "application/json");
}

void OpenAIServer::detokenize(const httplib::Request& req, httplib::Response& res) {
  require_accepting();
  const json body = parse_json_body(req.body);
  check_model_field(body, model_);
  if (!body.contains("tokens") || !body["tokens"].is_array())
    throw InvalidRequest("'tokens' must be a list of token ids", "tokens");
  const std::vector<int32_t> ids = json_to_token_ids(body["tokens"], "tokens", "tokens", model_.vocab_size);
  res.set_content(dump_json({{"prompt", sanitize_utf8(model_.tokenizer->decode(ids, false))}}), "application/json");
}

// vLLM's: what a client needs to tokenize as the server does through
// /tokenize (lm-evaluation-harness's remote tokenizer reads it).
void OpenAIServer::tokenizer_info(const httplib::Request&, httplib::Response& res) {
  const Tokenizer& tok = *model_.tokenizer;
  const auto text = [&tok](int32_t id) {
    return id >= 0 && id < tok.vocab_size() ? json(sanitize_utf8(tok.token_text(id))) : json(nullptr);
  };
  res.set_content(dump_json({{"tokenizer_class", "pagellm"},
                             {"bos_token", text(tok.bos_id())},
                             {"eos_token", text(tok.eos_id())},
                             {"pad_token", nullptr},
                             {"model_max_length", model_.max_model_len},
                             {"vocab_size", tok.vocab_size()}}),
                  "application/json");
}

void OpenAIServer::health(const httplib::Request&, httplib::Response& res) {
  require_accepting();
  res.status = 200;
  res.set_content("", "text/plain");
}

void OpenAIServer::metrics(const httplib::Request&, httplib::Response& res) {
  res.set_content(render_metrics(engine_.stats(), model_.name, counters_.snapshot(), options_.metrics_prefix),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void OpenAIServer::version(const httplib::Request&, httplib::Response& res) {
  res.set_content(dump_json({{"version", PAGELLM_VERSION}}), "application/json");
}

}  // namespace pagellm::server
