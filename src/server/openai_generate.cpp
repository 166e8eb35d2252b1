// POST /v1/completions and /v1/chat/completions: parse, submit, then either
// collect every output into one JSON reply or stream SSE chunks as outputs
// arrive. A client that goes away (failed write, or its socket hung up while
// we wait) gets its request aborted, so its KV blocks return to the pool.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <set>

#include "server/generation_job.h"
#include "server/http_connections.h"
#include "server/http_errors.h"
#include "server/openai_response.h"
#include "server/openai_server.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::server {

using namespace api;  // request parsing and UTF-8 checks (src/api)
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A failed request's output as an HTTP error: the client's fault (a grammar
// that admits no output, or too complex to compile) is a 400 naming its field.
// echo with max_tokens 0: the one token the engine sampled is no part of the reply.
void drop_completion_tokens(RequestOutput& out) {
  for (CompletionDelta& d : out.completions) {
    d.text.clear();
    d.token_ids.clear();
    d.logprobs.clear();
    d.num_output_tokens = 0;
    d.stop_string.clear();
    d.stop_token = -1;
    if (d.finish_reason == FinishReason::Stop) d.finish_reason = FinishReason::Length;
  }
}

PromptLogprobsView prompt_view(const GenerationRequest& g) {
  PromptLogprobsView view;
  view.prompt_logprobs = g.prompt_logprobs;
  if (g.echo_logprobs) view.echo_top = g.params.logprobs;
  for (const PromptInput& p : g.prompts) view.first_tokens.push_back(p.ids.empty() ? 0 : p.ids.front());
  return view;
}

// What the one log line per request says.
struct RequestLog {
  bool enabled = true;
  std::string id;
  Clock::time_point start = Clock::now();
  std::optional<double> first_token;

  void saw(const RequestOutput& out) {
    if (first_token) return;
    for (const auto& c : out.completions)
      if (!c.token_ids.empty()) {
        first_token = seconds_since(start);
        return;
      }
  }
  void write(const char* outcome, const Usage& u, const std::vector<ChoiceState>& choices) const {
    if (!enabled) return;
    std::set<std::string> reasons;
    for (const auto& c : choices) reasons.insert(c.finish == FinishReason::None ? "none" : to_string(c.finish));
    std::string finish;
    for (const auto& r : reasons) finish += (finish.empty() ? "" : ",") + r;
    spdlog::info(
        "{} {}: prompt {} tokens ({} cached), completion {} tokens, finish {}, {:.3f} s (first token {:.3f} s)", id,
        outcome, u.prompt_tokens, u.cached_tokens, u.completion_tokens, finish, seconds_since(start),
        first_token.value_or(0.0));
  }
};

// Everything a streaming reply needs after the handler returned: httplib calls
// the content provider later, on the same connection thread.
struct StreamingReply {
  StreamingReply(const OpenAIServer& server, std::unique_ptr<GenerationJob> j, StreamRenderer r, ClientWatch w,
                 RequestLog l, std::optional<GenerationJob::Item> first)
      : active(server),
        job(std::move(j)),
        first(std::move(first)),
        renderer(std::move(r)),
        watch(std::move(w)),
        log(std::move(l)) {}

  ActiveRequest active;
  std::unique_ptr<GenerationJob> job;
  std::optional<GenerationJob::Item> first;  // read before the stream began
  StreamRenderer renderer;
  ClientWatch watch;
  RequestLog log;
  bool prompt_only = false;  // echo with max_tokens 0
};

bool run_stream(StreamingReply& s, httplib::DataSink& sink, std::chrono::milliseconds poll) {
  auto write = [&](const std::string& data) { return data.empty() || sink.write(data.data(), data.size()); };
  const StreamEvents events{
      [&] { return s.renderer.begin(); },
      [&](GenerationJob::Item& item) {
        s.log.saw(item.output);
        if (s.prompt_only) drop_completion_tokens(item.output);
        return s.renderer.add(item.prompt_index, item.output);
      },
      [&] { return s.renderer.end(); },
      [&](const HttpError& e) {
        return s.renderer.error(error_body(e.status(), e.what(), e.param(), e.code())) + std::string(kSseDone);
      }};
  const StreamEnd end = stream_outputs(*s.job, s.first, s.watch, poll, write, events);
  if (end == StreamEnd::ClientGone) {
    s.log.write("aborted (client disconnected)", s.renderer.usage(), s.renderer.choices());
    return false;  // httplib closes the connection
  }
  sink.done();
  s.log.write(end == StreamEnd::Failed ? "failed" : "streamed", s.renderer.usage(), s.renderer.choices());
  return true;
}

}  // namespace

void OpenAIServer::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const std::string lora = check_model_field(body, model_);
  GenerationRequest g =
      chat ? parse_chat_request(body, model_, req.body) : parse_completion_request(body, model_, req.body);
  g.lora = lora;

  ResponseMeta meta{make_request_id(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)),
                    reply_model_name(lora), chat};
  std::vector<std::string> echo;
  if (g.echo)
    for (const PromptInput& p : g.prompts) echo.push_back(p.text);
  RequestLog log;
  log.enabled = options_.log_requests;
  log.id = meta.id;
  auto job = std::make_unique<GenerationJob>(engine_, to_engine_requests(g, meta.id, model_));
  const Tokenizer* tok = model_.tokenizer;
  TokenPiece piece = [tok](int32_t id) { return tok->token_to_piece(id, true); };
  ClientWatch watch = ClientWatch::current();
  res.set_header("X-Request-Id", meta.id);

  if (g.stream) {
    // A grammar still compiling may fail for the client's reasons: wait for
    // its first output, so that such a failure is a 400 status, not an
    // error event after a 200.
    std::optional<GenerationJob::Item> first;
    if (g.params.structured.active() && !read_first_output(*job, watch, options_.poll_interval, first)) {
      log.write("aborted (client disconnected)", {}, {});
      res.status = 499;
      return;
    }
    StreamRenderer renderer(meta, g.prompts.size(), g.params.n, g.logprobs(), g.include_usage, std::move(echo),
                            std::move(piece), g.output, prompt_view(g));
    auto state = std::make_shared<StreamingReply>(*this, std::move(job), std::move(renderer), std::move(watch),
                                                  std::move(log), std::move(first));
    state->prompt_only = g.prompt_only;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const auto poll = options_.poll_interval;
    res.set_chunked_content_provider(
        "text/event-stream", [state, poll](size_t, httplib::DataSink& sink) { return run_stream(*state, sink, poll); });
    return;
  }

  ResponseCollector collector(meta, g.prompts.size(), g.params.n, g.logprobs(), std::move(echo), g.output,
                              prompt_view(g));
  const bool complete = collect_outputs(*job, watch, options_.poll_interval, [&](GenerationJob::Item& item) {
    log.saw(item.output);
    if (g.prompt_only) drop_completion_tokens(item.output);
    collector.add(item.prompt_index, item.output);
  });
  if (!complete) {
    log.write("aborted (client disconnected)", collector.usage(), collector.choices());
    res.status = 499;  // nginx's "client closed request": nobody reads it
    return;
  }
  for (const ChoiceState& c : collector.choices())
    if (c.finish == FinishReason::Abort) {
      log.write("aborted (shutdown)", collector.usage(), collector.choices());
      throw HttpError(503, "the request was aborted: the server is shutting down", "shutting_down");
    }
  log.write("done", collector.usage(), collector.choices());
  res.set_content(dump_json(collector.render(piece)), "application/json");
}

}  // namespace pagellm::server
