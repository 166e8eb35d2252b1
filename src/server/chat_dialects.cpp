// POST /v1/responses (OpenAI Responses API; GET, DELETE and .../input_items
// of a stored one) and POST /v1/messages (Anthropic Messages API, and
// /v1/messages/count_tokens): each request is translated into a chat completions request
// (src/api/responses_request.h, anthropic_request.h) and runs as one
// GenerationJob, exactly as /v1/chat/completions does; only the reply is told
// in the API's own shapes (server/responses_render.h, anthropic_render.h).
// A client that goes away gets its request aborted.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <ctime>
#include <functional>

#include "api/anthropic_request.h"
#include "api/responses_request.h"
#include "api/utf8_check.h"
#include "server/anthropic_render.h"
#include "server/chat_turn.h"
#include "server/generation_job.h"
#include "server/http_connections.h"
#include "server/http_errors.h"
#include "server/openai_server.h"
#include "server/responses_render.h"

namespace pagellm::server {

using namespace api;

// One API's stream: its opening events, the events of each output, the
// closing ones, an error event; `done` runs after a whole turn.
struct TurnRenderer {
  std::function<std::string(const ChatTurn&)> begin;
  std::function<std::string(const std::vector<BlockEvent>&, const ChatTurn&)> add;
  std::function<std::string(const ChatTurn&)> end;
  std::function<std::string(const HttpError&)> error;
  std::function<void(const ChatTurn&)> done;
};

namespace {

using Clock = std::chrono::steady_clock;

void log_turn(bool enabled, const std::string& id, const char* outcome, const ChatTurn& turn, Clock::time_point start) {
  if (!enabled) return;
  const Usage& u = turn.usage();
  spdlog::info("{} {}: prompt {} tokens ({} cached), completion {} tokens, finish {}, {:.3f} s", id, outcome,
               u.prompt_tokens, u.cached_tokens, u.completion_tokens,
               turn.finished() ? to_string(turn.finish()) : "none",
               std::chrono::duration<double>(Clock::now() - start).count());
}

struct TurnStream {
  TurnStream(const OpenAIServer& server, std::unique_ptr<GenerationJob> j, ChatTurn t, TurnRenderer r,
             ClientWatch w, std::optional<GenerationJob::Item> f, std::string i, bool l)
      : active(server),
        job(std::move(j)),
        turn(std::move(t)),
        renderer(std::move(r)),
        watch(std::move(w)),
        first(std::move(f)),
        id(std::move(i)),
        log(l) {}
  ActiveRequest active;
  std::unique_ptr<GenerationJob> job;
  ChatTurn turn;
  TurnRenderer renderer;
  ClientWatch watch;
  std::optional<GenerationJob::Item> first;
  std::string id;
  bool log;
  Clock::time_point start = Clock::now();
};

bool run_turn_stream(TurnStream& s, httplib::DataSink& sink, std::chrono::milliseconds poll) {
  auto write = [&](const std::string& data) { return data.empty() || sink.write(data.data(), data.size()); };
  const StreamEvents events{[&] { return s.renderer.begin(s.turn); },
                            [&](GenerationJob::Item& item) { return s.renderer.add(s.turn.add(item.output), s.turn); },
                            [&] { return s.renderer.end(s.turn); },
                            [&](const HttpError& e) { return s.renderer.error(e); }};
  const StreamEnd end = stream_outputs(*s.job, s.first, s.watch, poll, write, events);
  if (end == StreamEnd::ClientGone) {
    log_turn(s.log, s.id, "aborted (client disconnected)", s.turn, s.start);
    return false;
  }
  sink.done();
  if (end == StreamEnd::Finished && s.renderer.done && s.turn.finish() != FinishReason::Abort) s.renderer.done(s.turn);
  log_turn(s.log, s.id, end == StreamEnd::Failed ? "failed" : "streamed", s.turn, s.start);
  return true;
}

}  // namespace

// Runs a translated chat request: streamed through `renderer`, or collected
// and handed to `reply` (the whole turn) for one JSON body.
void OpenAIServer::run_turn(const GenerationRequest& g, const std::string& id,
                            const std::function<TurnRenderer()>& make_renderer,
                            const std::function<void(const ChatTurn&)>& reply, httplib::Response& res) {
  auto job = std::make_unique<GenerationJob>(engine_, to_engine_requests(g, id, model_));
  ClientWatch watch = ClientWatch::current();
  ChatTurn turn(g.output);
  res.set_header("X-Request-Id", id);
  const auto start = Clock::now();
  if (g.stream) {
    // A grammar that fails to compile is the client's fault: a 400 status,
    // not an error event after a 200.
    std::optional<GenerationJob::Item> first;
    if (g.params.structured.active() && !read_first_output(*job, watch, options_.poll_interval, first)) {
      res.status = 499;
      return;
    }
    auto state = std::make_shared<TurnStream>(*this, std::move(job), std::move(turn), make_renderer(),
                                              std::move(watch), std::move(first), id, options_.log_requests);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const auto poll = options_.poll_interval;
    res.set_chunked_content_provider("text/event-stream", [state, poll](size_t, httplib::DataSink& sink) {
      return run_turn_stream(*state, sink, poll);
    });
    return;
  }
  if (!collect_outputs(*job, watch, options_.poll_interval, [&](GenerationJob::Item& item) { turn.add(item.output); })) {
    log_turn(options_.log_requests, id, "aborted (client disconnected)", turn, start);
    res.status = 499;
    return;
  }
  if (turn.finish() == FinishReason::Abort) {
    log_turn(options_.log_requests, id, "aborted (shutdown)", turn, start);
    throw HttpError(503, "the request was aborted: the server is shutting down", "shutting_down");
  }
  log_turn(options_.log_requests, id, "done", turn, start);
  reply(turn);
}

namespace {

// An input item's id: its kind's prefix and the response's own suffix.
std::string input_item_id(const nlohmann::json& item, const std::string& response_id, size_t index) {
  const std::string type = item.value("type", "message");
  const char* prefix = type == "function_call" ? "fc" : type == "function_call_output" ? "fco"
                       : type == "reasoning"   ? "rs" : "msg";
  const std::string suffix = response_id.starts_with("resp_") ? response_id.substr(5) : response_id;
  return fmt::format("{}_{}_{}", prefix, suffix, index);
}

}  // namespace

void OpenAIServer::responses(const httplib::Request& req, httplib::Response& res) {
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const std::string lora = check_model_field(body, model_);
  nlohmann::json history = nlohmann::json::array();
  const std::string previous = read_previous_response_id(body);
  if (!previous.empty()) {
    auto stored = response_store_.get(previous);
    if (!stored)
      throw HttpError(404, fmt::format("the response '{}' is not stored here (unknown, evicted, or made with store: "
                                       "false)", sanitize_utf8(previous)), "previous_response_not_found",
                      "previous_response_id");
    history = std::move(*stored);
  }
  ResponsesRequest r = parse_responses_request(body, req.body, history);
  GenerationRequest g = parse_responses_chat(r, model_);
  g.lora = lora;
  g.stream = r.stream;

  ResponsesMeta meta{make_request_id("resp_"), static_cast<int64_t>(std::time(nullptr)), reply_model_name(lora), r.store,
                     r.previous_response_id, r.echo};
  nlohmann::json items = r.input_items;
  for (size_t i = 0; i < items.size(); ++i)
    if (!items[i].contains("id")) items[i]["id"] = input_item_id(items[i], meta.id, i);
  auto remember = [this, meta, conversation = r.conversation, items](const ChatTurn& turn) {
    if (!meta.store) return;
    nlohmann::json all = conversation;
    for (nlohmann::json& m : responses_chat_messages(turn)) all.push_back(std::move(m));
    response_store_.put(meta.id, std::move(all), responses_object(meta, turn), items);
  };
  auto make_renderer = [meta, remember] {
    auto s = std::make_shared<ResponsesStream>(meta);
    return TurnRenderer{[s](const ChatTurn& t) { return s->begin(t); },
                        [s](const std::vector<BlockEvent>& e, const ChatTurn& t) { return s->add(e, t); },
                        [s](const ChatTurn& t) { return s->end(t); },
                        [s](const HttpError& e) { return s->error(e.what(), e.code(), e.param()); }, remember};
  };
  run_turn(g, meta.id, make_renderer, [&](const ChatTurn& turn) {
    remember(turn);
    res.set_content(dump_json(responses_object(meta, turn)), "application/json");
  }, res);
}

namespace {

std::string stored_id(const httplib::Request& req) { return req.matches.size() > 1 ? std::string(req.matches[1]) : ""; }

HttpError not_stored(const std::string& id) {
  return HttpError(404, fmt::format("the response '{}' is not stored here (unknown, evicted, deleted, or made with "
                                    "store: false)", sanitize_utf8(id)), "not_found");
}

}  // namespace

void OpenAIServer::get_response(const httplib::Request& req, httplib::Response& res) {
  const std::string id = stored_id(req);
  auto stored = response_store_.response(id);
  if (!stored) throw not_stored(id);
  res.set_content(dump_json(*stored), "application/json");
}

void OpenAIServer::delete_response(const httplib::Request& req, httplib::Response& res) {
  const std::string id = stored_id(req);
  if (!response_store_.erase(id)) throw not_stored(id);
  res.set_content(dump_json({{"id", id}, {"object", "response"}, {"deleted", true}}), "application/json");
}

// OpenAI's list shape: `order` desc (newest first, the default) or asc,
// `limit` 1..100 (20), `after` an item id to continue from.
void OpenAIServer::list_input_items(const httplib::Request& req, httplib::Response& res) {
  const std::string id = stored_id(req);
  auto items = response_store_.input_items(id);
  if (!items) throw not_stored(id);
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  if (order != "asc" && order != "desc") throw InvalidRequest("'order' must be \"asc\" or \"desc\"", "order");
  int limit = 20;
  if (req.has_param("limit")) {
    const std::string text = req.get_param_value("limit");
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), limit);
    if (ec != std::errc() || end != text.data() + text.size() || limit < 1 || limit > 100)
      throw InvalidRequest("'limit' must be an integer from 1 to 100", "limit");
  }
  std::vector<nlohmann::json> list(items->begin(), items->end());
  if (order == "desc") std::reverse(list.begin(), list.end());
  size_t first = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    auto it = std::find_if(list.begin(), list.end(), [&](const nlohmann::json& item) { return item["id"] == after; });
    if (it == list.end())
      throw InvalidRequest(fmt::format("'after': no input item '{}' in this response", sanitize_utf8(after)), "after");
    first = static_cast<size_t>(it - list.begin()) + 1;
  }
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = first; i < list.size() && data.size() < static_cast<size_t>(limit); ++i) data.push_back(list[i]);
  const bool more = first + data.size() < list.size();
  nlohmann::json out = {{"object", "list"}, {"data", data}, {"has_more", more}};
  out["first_id"] = data.empty() ? nlohmann::json(nullptr) : data.front()["id"];
  out["last_id"] = data.empty() ? nlohmann::json(nullptr) : data.back()["id"];
  res.set_content(dump_json(out), "application/json");
}

// Anthropic's clients read errors in Anthropic's shape.
void OpenAIServer::answer_as_anthropic(const httplib::Request& req, httplib::Response& res,
                                       const std::function<void()>& handler) {
  try {
    handler();
  } catch (...) {
    const ErrorReply reply = error_reply_for_current_exception();
    const nlohmann::json& e = reply.body["error"];
    std::string message = e["message"].get<std::string>();
    spdlog::info("{} {} -> {}: {}", req.method, req.path, reply.status, message);
    res.status = reply.status;
    res.set_content(dump_json(anthropic_error_body(reply.status, message)), "application/json");
    if (reply.status == 503) res.set_header("Retry-After", "1");
  }
}

void OpenAIServer::messages(const httplib::Request& req, httplib::Response& res) {
  answer_as_anthropic(req, res, [&] {
    require_accepting();
    const nlohmann::json body = parse_json_body(req.body);
    const std::string lora = check_model_field(body, model_);
    AnthropicRequest r = parse_anthropic_request(body, req.body);
    GenerationRequest g = parse_anthropic_chat(r, model_);
    g.lora = lora;
    g.stream = r.stream;
    AnthropicMeta meta{make_request_id("msg_"), reply_model_name(lora), static_cast<int64_t>(g.prompts.front().ids.size())};
    auto make_renderer = [meta] {
      auto s = std::make_shared<AnthropicStream>(meta);
      return TurnRenderer{[s](const ChatTurn& t) { return s->begin(t); },
                          [s](const std::vector<BlockEvent>& e, const ChatTurn& t) { return s->add(e, t); },
                          [s](const ChatTurn& t) { return s->end(t); },
                          [s](const HttpError& e) { return s->error(e.status(), e.what()); }, nullptr};
    };
    run_turn(g, meta.id, make_renderer, [&](const ChatTurn& turn) {
      res.set_content(dump_json(anthropic_message(meta, turn)), "application/json");
    }, res);
  });
}

// The prompt a Messages request would be (same template, tools and system
// text), counted; nothing is generated. The body has no max_tokens.
void OpenAIServer::count_message_tokens(const httplib::Request& req, httplib::Response& res) {
  answer_as_anthropic(req, res, [&] {
    require_accepting();
    nlohmann::json body = parse_json_body(req.body);
    check_model_field(body, model_);
    if (!body.is_object()) throw InvalidRequest("the request body must be a JSON object");
    // The raw text keeps the key order that tool schemas render in.
    auto ordered = nlohmann::ordered_json::parse(req.body);
    body["max_tokens"] = ordered["max_tokens"] = 1;
    const AnthropicRequest r = parse_anthropic_request(body, ordered.dump());
    const GenerationRequest g = parse_anthropic_chat(r, model_);
    res.set_content(dump_json({{"input_tokens", g.prompts.front().ids.size()}}), "application/json");
  });
}

}  // namespace pagellm::server
