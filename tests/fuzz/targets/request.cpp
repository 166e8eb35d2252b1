// A request body as the server gets it: parse_json_body, the model field,
// then both endpoints' parsers (sampling fields, prompts, chat messages
// through a real template) down to EngineRequests, checked as the engine
// checks them on submit; and the same body as a Responses API and as an
// Anthropic Messages API request, translated and parsed as chat; and as a
// rerank and a score request, each pair formatted by a rerank template. The model is a synthetic SentencePiece vocabulary
// (specials, 256 byte tokens, fillers) with Gemma 3's chat template.
#include <memory>
#include <nlohmann/json.hpp>

#include "api/anthropic_request.h"
#include "api/openai_request.h"
#include "api/responses_request.h"
#include "api/score_request.h"
#include "chat/chat_template.h"
#include "common.h"
#include "core/request_limits.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "server/openai_server.h"
#include "targets.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::fuzz {
namespace {

struct FakeModel {
  std::unique_ptr<GGUFFile> vocab_file;
  std::unique_ptr<Tokenizer> tokenizer;
  api::ServedModel served;

  FakeModel() {
    const ScratchDir dir;
    GGUFWriter w;
    add_synthetic_vocab(w, 320);
    w.write(dir.path() + "/vocab.gguf");
    vocab_file = GGUFFile::open(dir.path() + "/vocab.gguf");  // the mapping outlives the file
    tokenizer = Tokenizer::from_gguf(*vocab_file);
    served.name = "fuzz-model";
    served.aliases = {"/models/fuzz.gguf"};
    served.tokenizer = tokenizer.get();
    served.chat_template = std::make_shared<ChatTemplate>(builtin_chat_template("gemma3"));
    served.vocab_size = tokenizer->vocab_size();
    served.max_model_len = 512;
    served.score_format.template_text = "<s>Query: {query}\nDocument: {document}</s>";
  }
};

// What the server answers 4xx to (http_errors.cpp): pagellm::Error (InvalidRequest,
// HttpError, TemplateError) and JSON type errors. Anything else is a 500
// "internal error", i.e. a finding.
template <class F>
bool rejected(F&& f) {
  try {
    f();
    return false;
  } catch (const Error&) {
    return true;
  } catch (const nlohmann::json::exception&) {
    return true;
  }
}

// What Engine::validate_params checks without an engine: the params (may throw
// InvalidRequest) and, as invariants the parsers promise, the id and prompt ids.
void check_like_the_engine(const EngineRequest& r, const api::ServedModel& m) {
  FUZZ_INVARIANT(!r.id.empty());
  r.params.validate(m.vocab_size);
  for (int32_t t : r.prompt_ids) FUZZ_INVARIANT(t >= 0 && t < m.vocab_size);
}

// What the score parsers promise: a prompt per pair, each non-empty, within
// the context and the vocabulary; and a response for any scores.
void check_scores(const api::ScoreRequest& r, const api::ServedModel& m, bool rerank) {
  FUZZ_INVARIANT(!r.prompts.empty());
  FUZZ_INVARIANT(!rerank || r.documents.size() == r.prompts.size());
  for (const auto& p : r.prompts) {
    FUZZ_INVARIANT(!p.empty() && static_cast<int64_t>(p.size()) < m.max_model_len);
    for (int32_t t : p) FUZZ_INVARIANT(t >= 0 && t < m.vocab_size);
  }
  const std::vector<float> scores(r.prompts.size(), 0.5f);
  if (rerank) api::rerank_response(r, scores, "rerank-fuzz", m.name).dump();
  else api::score_response(r, scores, "score-fuzz", 0, m.name).dump();
}

}  // namespace

int request(const uint8_t* data, size_t size) {
  static const FakeModel model;
  const api::ServedModel& m = model.served;
  nlohmann::json body;
  if (rejected([&] { body = server::parse_json_body(std::string(reinterpret_cast<const char*>(data), size)); }))
    return 0;
  if (rejected([&] { api::check_model_field(body, m); })) return 0;
  for (bool chat : {false, true}) {
    rejected([&] {
      const api::GenerationRequest g = chat ? api::parse_chat_request(body, m) : api::parse_completion_request(body, m);
      FUZZ_INVARIANT(!g.prompts.empty() && g.prompts.size() <= RequestLimits{}.max_prompts);
      for (const EngineRequest& r : api::to_engine_requests(g, chat ? "chatcmpl-fuzz" : "cmpl-fuzz", m))
        check_like_the_engine(r, m);
    });
  }
  const std::string raw(reinterpret_cast<const char*>(data), size);
  auto check_chat = [&](const api::GenerationRequest& g, const char* id) {
    FUZZ_INVARIANT(g.chat && g.prompts.size() == 1);
    for (const EngineRequest& r : api::to_engine_requests(g, id, m)) check_like_the_engine(r, m);
  };
  rejected([&] {
    const api::ResponsesRequest r = api::parse_responses_request(body, raw, nlohmann::json::array());
    check_chat(api::parse_responses_chat(r, m), "resp_fuzz");
  });
  rejected([&] { check_chat(api::parse_anthropic_chat(api::parse_anthropic_request(body, raw), m), "msg_fuzz"); });
  rejected([&] { check_scores(api::parse_rerank_request(body, m), m, true); });
  rejected([&] { check_scores(api::parse_score_request(body, m), m, false); });
  return 0;
}

}  // namespace pagellm::fuzz
