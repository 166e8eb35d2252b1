// POST /v1/rerank, /rerank, /v2/rerank, /v1/score, /score (--task score): every (query,
// document) pair is one score request (prefill only) in the engine, batched
// with whatever else runs; its pooled last hidden state goes through the
// model's score head (engine/score_head.h).
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <ctime>

#include "api/score_request.h"
#include "server/generation_job.h"
#include "server/http_connections.h"
#include "server/http_errors.h"
#include "server/openai_response.h"
#include "server/openai_server.h"

namespace pagellm::server {

std::optional<std::vector<float>> OpenAIServer::run_scores(const std::vector<std::vector<int32_t>>& prompts,
                                                            const std::string& id) {
  std::vector<EngineRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.id = prompts.size() == 1 ? id : fmt::format("{}-{}", id, i);
    r.prompt_ids = prompts[i];
    r.score = true;
    requests.push_back(std::move(r));
  }
  GenerationJob job(engine_, std::move(requests));
  ClientWatch watch = ClientWatch::current();
  std::vector<float> scores(prompts.size());
  const bool complete = collect_outputs(job, watch, options_.poll_interval, [&](GenerationJob::Item& item) {
    if (!item.output.finished) return;
    if (item.output.embedding.empty())
      throw HttpError(503, "the request was aborted: the server is shutting down", "shutting_down");
    scores[item.prompt_index] = item.output.score;
  });
  if (!complete) return std::nullopt;  // the client left: the job is aborted
  return scores;
}

void OpenAIServer::rerank(const httplib::Request& req, httplib::Response& res) {
  require_task(ServeTask::Score, req.path.c_str());
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const api::ScoreRequest s = api::parse_rerank_request(body, model_);
  const std::string id = make_request_id("rerank-");
  const auto scores = run_scores(s.prompts, id);
  if (!scores) {
    res.status = 499;  // nobody reads it
    return;
  }
  if (options_.log_requests)
    spdlog::info("{} rerank: {} documents, {} tokens", id, scores->size(), api::total_tokens(s));
  res.set_content(dump_json(api::rerank_response(s, *scores, id, model_.name)), "application/json");
}

void OpenAIServer::score(const httplib::Request& req, httplib::Response& res) {
  require_task(ServeTask::Score, req.path.c_str());
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const api::ScoreRequest s = api::parse_score_request(body, model_);
  const std::string id = make_request_id("score-");
  const auto scores = run_scores(s.prompts, id);
  if (!scores) {
    res.status = 499;
    return;
  }
  if (options_.log_requests) spdlog::info("{} score: {} pairs, {} tokens", id, scores->size(), api::total_tokens(s));
  res.set_content(
      dump_json(api::score_response(s, *scores, id, static_cast<int64_t>(std::time(nullptr)), model_.name)),
      "application/json");
}

}  // namespace pagellm::server
