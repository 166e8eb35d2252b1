// POST /v1/embeddings: each input is one pooling request (prefill only) in
// the engine, batched with whatever else runs; the vectors come back in
// input order.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "api/embedding_request.h"
#include "server/generation_job.h"
#include "server/http_errors.h"
#include "server/openai_response.h"
#include "server/openai_server.h"

namespace pagellm::server {

void OpenAIServer::require_task(bool embed, const char* endpoint) const {
  if (model_.embed_task == embed) return;
  if (embed)
    throw HttpError(400, fmt::format("{} needs a pooling model: this server serves the model for generation "
                                     "(start it with --task embed)",
                                     endpoint),
                    "", "model");
  throw HttpError(400, fmt::format("{} is a generation endpoint: this server serves the model for the embed task "
                                   "(--task embed); use /v1/embeddings",
                                   endpoint),
                  "", "model");
}

void OpenAIServer::embeddings(const httplib::Request& req, httplib::Response& res) {
  require_task(true, "/v1/embeddings");
  require_accepting();
  const nlohmann::json body = parse_json_body(req.body);
  const api::EmbeddingRequest e = api::parse_embedding_request(body, model_, engine_.model_config().n_embd);
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
  std::vector<std::vector<float>> vectors(e.inputs.size());
  while (!job.done()) {
    auto item = job.next(options_.poll_interval);
    if (!item) continue;
    const RequestOutput& out = item->output;
    if (!out.error.empty()) {
      job.abort();
      if (out.error_kind == RequestError::Invalid) throw HttpError(400, out.error, "", "input");
      throw HttpError(out.error_kind == RequestError::Unavailable ? 503 : 500, out.error);
    }
    if (!out.finished) continue;
    if (out.embedding.empty())
      throw HttpError(503, "the request was aborted: the server is shutting down", "shutting_down");
    vectors[item->prompt_index] = out.embedding;
  }
  if (e.dimensions)
    for (auto& v : vectors) v = truncate_embedding(std::move(v), *e.dimensions, engine_.pooling().normalize);
  if (options_.log_requests)
    spdlog::info("{} embeddings: {} inputs, {} tokens", id, vectors.size(), prompt_tokens);
  res.set_content(dump_json(api::embedding_response(vectors, e.base64, model_.name, prompt_tokens)),
                  "application/json");
}

}  // namespace pagellm::server
