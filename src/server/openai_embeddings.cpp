// POST /v1/embeddings: each input is one pooling request (prefill only) in
// the engine, batched with whatever else runs; the vectors come back in
// input order.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "api/embedding_request.h"
#include "server/generation_job.h"
#include "server/http_connections.h"
#include "server/http_errors.h"
#include "server/openai_response.h"
#include "server/openai_server.h"

namespace pagellm::server {

namespace {

// How the endpoint's task is asked for on the command line, and the server's
// endpoints for a task.
const char* task_flag(ServeTask t) {
  switch (t) {
    case ServeTask::Embed: return "--task embed";
    case ServeTask::Score: return "--task score";
    default: return "--task generate";
  }
}

const char* task_purpose(ServeTask t) {
  switch (t) {
    case ServeTask::Embed: return "for embeddings";
    case ServeTask::Score: return "for scores";
    default: return "for generation";
  }
}

const char* task_endpoints(ServeTask t) {
  switch (t) {
    case ServeTask::Embed: return "/v1/embeddings";
    case ServeTask::Score: return "/v1/rerank and /v1/score";
    default: return "/v1/completions, /v1/chat/completions, /v1/responses and /v1/messages";
  }
}

}  // namespace

void OpenAIServer::require_task(ServeTask task, const char* endpoint) const {
  if (model_.task == task) return;
  const char* what = task == ServeTask::Embed   ? "a pooling (embedding) model"
                     : task == ServeTask::Score ? "a score model (a reranker)"
                                                : "a generation model";
  throw HttpError(400, fmt::format("{} needs {}: this server serves the model {} ({}: {}); start one with {}",
                                   endpoint, what, task_purpose(model_.task), task_flag(model_.task),
                                   task_endpoints(model_.task), task_flag(task)),
                  "", "model");
}

void OpenAIServer::embeddings(const httplib::Request& req, httplib::Response& res) {
  require_task(ServeTask::Embed, "/v1/embeddings");
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const api::EmbeddingRequest e = api::parse_embedding_request(body, model_, engine_.pooling().output_size(engine_.model_config().n_embd));
  const std::string id = make_request_id("embd-");
  std::vector<EngineRequest> requests;
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    EngineRequest r;
    r.id = e.inputs.size() == 1 ? id : fmt::format("{}-{}", id, i);
    r.prompt_ids = e.inputs[i];
    r.embed = true;
    prompt_tokens += static_cast<int64_t>(r.prompt_ids.size());
    requests.push_back(std::move(r));
  }
  GenerationJob job(engine_, std::move(requests));
  ClientWatch watch = ClientWatch::current();
  std::vector<std::vector<float>> vectors(e.inputs.size());
  const bool complete = collect_outputs(job, watch, options_.poll_interval, [&](GenerationJob::Item& item) {
    if (!item.output.finished) return;
    if (item.output.embedding.empty())
      throw HttpError(503, "the request was aborted: the server is shutting down", "shutting_down");
    vectors[item.prompt_index] = std::move(item.output.embedding);
  });
  if (!complete) {
    res.status = 499;  // the client left: nobody reads it
    return;
  }
  if (e.dimensions)
    for (auto& v : vectors) v = truncate_embedding(std::move(v), *e.dimensions, engine_.pooling().normalize);
  if (options_.log_requests)
    spdlog::info("{} embeddings: {} inputs, {} tokens", id, vectors.size(), prompt_tokens);
  res.set_content(dump_json(api::embedding_response(vectors, e.base64, model_.name, prompt_tokens)),
                  "application/json");
}

}  // namespace pagellm::server
