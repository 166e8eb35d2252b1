// The C API (include/pagellm.h) over EmbeddedEngine. Every entry point
// catches everything: no exception crosses into C, and the message waits in
// this thread's last-error string.
#include "pagellm.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/output_render.h"
#include "api/utf8_check.h"
#include "core/error.h"
#include "embed/embedded_engine.h"

struct pagellm_engine {
  std::unique_ptr<pagellm::embed::EmbeddedEngine> engine;
  std::shared_ptr<pagellm::OutputQueue> queue = std::make_shared<pagellm::OutputQueue>();  // add_request's
  std::atomic<uint64_t> next_generate_id{1};
};

struct pagellm_output {
  pagellm::RequestOutput out;
  std::vector<std::vector<float>> logprobs;  // per completion, when asked
};

namespace {

using pagellm::InvalidRequest;
using nlohmann::json;

thread_local std::string t_last_error;

pagellm_status failed(pagellm_status status, const char* message) {
  t_last_error = message;
  return status;
}

// Runs `f` (returning a pagellm_status) with every exception turned into a status.
template <class F>
pagellm_status guarded(pagellm_status load_status, F&& f) {
  try {
    return f();
  } catch (const InvalidRequest& e) {
    return failed(PAGELLM_ERR_INVALID_ARGUMENT, e.what());
  } catch (const pagellm::QueueFull& e) {
    return failed(PAGELLM_ERR_BUSY, e.what());
  } catch (const pagellm::ShuttingDown& e) {
    return failed(PAGELLM_ERR_SHUTTING_DOWN, e.what());
  } catch (const pagellm::Error& e) {
    return failed(load_status, e.what());
  } catch (const std::bad_alloc&) {
    return failed(PAGELLM_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return failed(PAGELLM_ERR_INTERNAL, e.what());
  } catch (...) {
    return failed(PAGELLM_ERR_INTERNAL, "unknown error");
  }
}

json parse_json_arg(const char* text, const char* what) {
  if (!text || !*text) return json::object();
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    throw InvalidRequest(std::string(what) + " is not valid JSON: " + e.what());
  }
}

void require(bool ok, const char* message) {
  if (!ok) throw InvalidRequest(message);
}

// pagellm.h's strings are UTF-8: checked as they come in, so a bad byte is an
// invalid argument naming the parameter, not text the tokenizer guesses at or
// an id that no JSON output can carry. NULL is the caller's check.
void require_utf8(const char* s, const char* param) {
  if (s) pagellm::api::require_valid_utf8(s, param);
}

pagellm::EngineRequest make_request(const pagellm_engine* e, std::string id, const char* prompt,
                                    const int32_t* ids, size_t num_ids, const char* sampling_json) {
  std::vector<int32_t> prompt_ids;
  if (prompt) {
    require_utf8(prompt, "prompt");
    prompt_ids = e->engine->encode(prompt, /*add_special=*/true);
  } else {
    require(ids != nullptr || num_ids == 0, "prompt_token_ids is NULL but num_prompt_tokens is not 0");
    prompt_ids.assign(ids, ids + num_ids);
  }
  return e->engine->make_request(id, std::move(prompt_ids), parse_json_arg(sampling_json, "sampling_json"));
}

pagellm_output* wrap(pagellm::RequestOutput out) {
  auto* o = new pagellm_output;
  o->out = std::move(out);
  o->logprobs.resize(o->out.completions.size());
  for (size_t i = 0; i < o->out.completions.size(); ++i)
    for (const pagellm::TokenLogprob& lp : o->out.completions[i].logprobs) o->logprobs[i].push_back(lp.logprob);
  return o;
}

const pagellm::CompletionDelta* completion(const pagellm_output* o, size_t i) {
  return (o && i < o->out.completions.size()) ? &o->out.completions[i] : nullptr;
}

}  // namespace

extern "C" {

uint32_t pagellm_abi_version(void) { return PAGELLM_ABI_VERSION; }
const char* pagellm_version(void) { return PAGELLM_VERSION; }
const char* pagellm_last_error(void) { return t_last_error.c_str(); }

const char* pagellm_status_string(pagellm_status status) {
  switch (status) {
    case PAGELLM_OK: return "ok";
    case PAGELLM_TIMEOUT: return "timeout";
    case PAGELLM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case PAGELLM_ERR_LOAD: return "model load failed";
    case PAGELLM_ERR_BUSY: return "busy";
    case PAGELLM_ERR_SHUTTING_DOWN: return "shutting down";
    case PAGELLM_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case PAGELLM_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

pagellm_status pagellm_engine_create(const char* model, const char* options_json, pagellm_engine** out) {
  return guarded(PAGELLM_ERR_LOAD, [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    json args = parse_json_arg(options_json, "options_json");
    require(args.is_object(), "options_json must be a JSON object");
    if (model && *model) {
      require_utf8(model, "model");
      require(!args.contains("model"), "give the model as the argument or in options_json, not both");
      args["model"] = model;
    }
    auto e = std::make_unique<pagellm_engine>();
    e->engine = std::make_unique<pagellm::embed::EmbeddedEngine>(args);
    *out = e.release();
    return PAGELLM_OK;
  });
}

void pagellm_engine_destroy(pagellm_engine* engine) { delete engine; }

int32_t pagellm_engine_max_model_len(const pagellm_engine* engine) {
  return engine ? engine->engine->max_model_len() : 0;
}

int32_t pagellm_engine_vocab_size(const pagellm_engine* engine) { return engine ? engine->engine->vocab_size() : 0; }

pagellm_status pagellm_add_request(pagellm_engine* engine, const char* request_id, const char* prompt,
                                   const int32_t* prompt_token_ids, size_t num_prompt_tokens,
                                   const char* sampling_json) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr, "engine is NULL");
    require(request_id != nullptr && *request_id, "request_id is NULL or empty");
    require_utf8(request_id, "request_id");
    std::vector<pagellm::EngineRequest> reqs;
    reqs.push_back(make_request(engine, request_id, prompt, prompt_token_ids, num_prompt_tokens, sampling_json));
    engine->engine->submit(std::move(reqs), engine->queue);
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_next_output(pagellm_engine* engine, int32_t timeout_ms, pagellm_output** out) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && out != nullptr, "engine or out is NULL");
    *out = nullptr;
    // "Forever" in slices, so that a huge wait cannot overflow the clock.
    for (;;) {
      const int32_t slice = timeout_ms < 0 ? 1000 : timeout_ms;
      if (auto o = engine->queue->next(std::chrono::milliseconds(slice))) {
        *out = wrap(std::move(*o));
        return PAGELLM_OK;
      }
      if (timeout_ms >= 0) return PAGELLM_TIMEOUT;
    }
  });
}

pagellm_status pagellm_abort(pagellm_engine* engine, const char* request_id) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && request_id != nullptr, "engine or request_id is NULL");
    require_utf8(request_id, "request_id");
    engine->engine->abort(request_id);
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_generate(pagellm_engine* engine, const char* prompt, const int32_t* prompt_token_ids,
                                size_t num_prompt_tokens, const char* sampling_json,
                                pagellm_output_callback callback, void* user_data) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr, "engine is NULL");
    // A private queue: this call's outputs never mix with the polled ones.
    auto queue = std::make_shared<pagellm::OutputQueue>();
    const std::string id = "pagellm-generate-" + std::to_string(engine->next_generate_id.fetch_add(1));
    std::vector<pagellm::EngineRequest> reqs;
    reqs.push_back(make_request(engine, id, prompt, prompt_token_ids, num_prompt_tokens, sampling_json));
    engine->engine->submit(std::move(reqs), queue);
    bool aborted = false;
    for (;;) {
      auto o = queue->next(std::chrono::milliseconds(1000));
      if (!o) continue;
      std::unique_ptr<pagellm_output> out(wrap(std::move(*o)));
      if (callback && callback(out.get(), user_data) != 0 && !aborted) {
        engine->engine->abort(id);
        aborted = true;
      }
      if (!out->out.finished) continue;
      if (!out->out.error.empty()) return failed(PAGELLM_ERR_INTERNAL, out->out.error.c_str());
      return PAGELLM_OK;
    }
  });
}

int32_t pagellm_engine_embedding_size(const pagellm_engine* engine) {
  return engine ? engine->engine->embedding_size() : 0;
}

namespace {

// Runs one pooled request (embedding or score) to its end; the finished output.
pagellm::RequestOutput run_pooled(pagellm_engine* engine, pagellm::EngineRequest req) {
  auto queue = std::make_shared<pagellm::OutputQueue>();
  std::vector<pagellm::EngineRequest> reqs;
  reqs.push_back(std::move(req));
  engine->engine->submit(std::move(reqs), queue);
  for (;;) {
    auto o = queue->next(std::chrono::milliseconds(1000));
    if (o && o->finished) return std::move(*o);
  }
}

pagellm_status pooled_failure(const pagellm::RequestOutput& o) {
  if (o.error_kind == pagellm::RequestError::Invalid && !o.error.empty())
    return failed(PAGELLM_ERR_INVALID_ARGUMENT, o.error.c_str());
  return failed(PAGELLM_ERR_INTERNAL, o.error.empty() ? "the request was aborted" : o.error.c_str());
}

}  // namespace

pagellm_status pagellm_embed(pagellm_engine* engine, const char* prompt, const int32_t* prompt_token_ids,
                             size_t num_prompt_tokens, float* embedding, size_t capacity, size_t* dim) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && dim != nullptr, "engine or dim is NULL");
    *dim = static_cast<size_t>(engine->engine->embedding_size());
    if (!embedding || capacity < *dim)
      return failed(PAGELLM_ERR_BUFFER_TOO_SMALL, "the vector does not fit: call again with *dim floats of room");
    pagellm::EngineRequest req =
        make_request(engine, "pagellm-embed-" + std::to_string(engine->next_generate_id.fetch_add(1)), prompt,
                     prompt_token_ids, num_prompt_tokens, nullptr);
    req.embed = true;
    const pagellm::RequestOutput o = run_pooled(engine, std::move(req));
    if (!o.error.empty() || o.embedding.size() != *dim) return pooled_failure(o);
    std::copy(o.embedding.begin(), o.embedding.end(), embedding);
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_score(pagellm_engine* engine, const char* query, const char* document, float* score) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && query != nullptr && document != nullptr && score != nullptr,
            "engine, query, document or score is NULL");
    require_utf8(query, "query");
    require_utf8(document, "document");
    std::vector<int32_t> ids = engine->engine->score_prompt(query, document);
    pagellm::EngineRequest req = engine->engine->make_request(
        "pagellm-score-" + std::to_string(engine->next_generate_id.fetch_add(1)), std::move(ids), nullptr);
    req.score = true;
    const pagellm::RequestOutput o = run_pooled(engine, std::move(req));
    if (!o.error.empty() || o.embedding.empty()) return pooled_failure(o);
    *score = o.score;
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_load_lora_adapter(pagellm_engine* engine, const char* name, const char* path) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && name != nullptr && path != nullptr, "engine, name or path is NULL");
    require_utf8(name, "name");
    try {
      engine->engine->load_lora(name, path);
    } catch (const pagellm::InvalidRequest&) {
      throw;
    } catch (const pagellm::Error& e) {
      throw pagellm::InvalidRequest(e.what(), "path");  // a file that does not fit the model
    }
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_unload_lora_adapter(pagellm_engine* engine, const char* name) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && name != nullptr, "engine or name is NULL");
    if (!engine->engine->unload_lora(name))
      throw pagellm::InvalidRequest(fmt::format("no LoRA adapter named '{}'", name), "name");
    return PAGELLM_OK;
  });
}

size_t pagellm_num_unfinished(const pagellm_engine* engine) { return engine ? engine->engine->num_in_flight() : 0; }

void pagellm_output_free(pagellm_output* output) { delete output; }
const char* pagellm_output_request_id(const pagellm_output* o) { return o ? o->out.request_id.c_str() : ""; }
int pagellm_output_finished(const pagellm_output* o) { return o && o->out.finished ? 1 : 0; }
const char* pagellm_output_error(const pagellm_output* o) {
  return (o && !o->out.error.empty()) ? o->out.error.c_str() : nullptr;
}
int32_t pagellm_output_num_prompt_tokens(const pagellm_output* o) { return o ? o->out.num_prompt_tokens : 0; }
int32_t pagellm_output_num_cached_tokens(const pagellm_output* o) { return o ? o->out.num_cached_tokens : 0; }
size_t pagellm_output_num_completions(const pagellm_output* o) { return o ? o->out.completions.size() : 0; }

int32_t pagellm_output_index(const pagellm_output* o, size_t i) {
  const auto* c = completion(o, i);
  return c ? c->index : -1;
}

const char* pagellm_output_text(const pagellm_output* o, size_t i, size_t* length) {
  const auto* c = completion(o, i);
  if (length) *length = c ? c->text.size() : 0;
  return c ? c->text.c_str() : "";
}

const int32_t* pagellm_output_token_ids(const pagellm_output* o, size_t i, size_t* count) {
  const auto* c = completion(o, i);
  if (count) *count = c ? c->token_ids.size() : 0;
  return c ? c->token_ids.data() : nullptr;
}

const float* pagellm_output_logprobs(const pagellm_output* o, size_t i, size_t* count) {
  const bool has = completion(o, i) && !o->logprobs[i].empty();
  if (count) *count = has ? o->logprobs[i].size() : 0;
  return has ? o->logprobs[i].data() : nullptr;
}

const char* pagellm_output_finish_reason(const pagellm_output* o, size_t i) {
  const auto* c = completion(o, i);
  return c ? pagellm::api::finish_reason_name(c->finish_reason) : nullptr;
}

int32_t pagellm_output_num_output_tokens(const pagellm_output* o, size_t i) {
  const auto* c = completion(o, i);
  return c ? c->num_output_tokens : 0;
}

pagellm_status pagellm_tokenize(const pagellm_engine* engine, const char* text, int add_special, int32_t* ids,
                                size_t capacity, size_t* count) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && text != nullptr && count != nullptr, "engine, text or count is NULL");
    require_utf8(text, "text");
    const std::vector<int32_t> v = engine->engine->encode(text, add_special != 0);
    *count = v.size();
    if (v.size() > capacity || (!ids && !v.empty()))
      return failed(PAGELLM_ERR_BUFFER_TOO_SMALL, "the ids do not fit: call again with *count ids of room");
    std::copy(v.begin(), v.end(), ids);
    return PAGELLM_OK;
  });
}

pagellm_status pagellm_detokenize(const pagellm_engine* engine, const int32_t* ids, size_t count, int skip_special,
                                  char* text, size_t capacity, size_t* length) {
  return guarded(PAGELLM_ERR_INTERNAL, [&] {
    require(engine != nullptr && length != nullptr, "engine or length is NULL");
    require(ids != nullptr || count == 0, "ids is NULL but count is not 0");
    const std::string s = engine->engine->decode(std::vector<int32_t>(ids, ids + count), skip_special != 0);
    *length = s.size();
    if (!text || s.size() + 1 > capacity)
      return failed(PAGELLM_ERR_BUFFER_TOO_SMALL, "the text does not fit: call again with *length + 1 bytes");
    std::copy(s.begin(), s.end(), text);
    text[s.size()] = '\0';
    return PAGELLM_OK;
  });
}

}  // extern "C"
