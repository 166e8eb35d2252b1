#include "embed/embedded_engine.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <mutex>

#include "api/json_fields.h"
#include "api/request_params.h"
#include "api/structured_request.h"
#include "api/tool_request.h"
#include "core/util.h"
#include "embed/chat_template_source.h"

namespace pagellm::embed {
namespace {

using nlohmann::json;

// Per-request seeds from the engine seed: distinct (a golden-ratio step per
// request), well mixed.
uint64_t derive_seed(uint64_t seed, uint64_t n) { return mix64(seed + (n + 1) * 0x9e3779b97f4a7c15ULL); }

// Each id in [0, limit), or InvalidRequest naming the first that is not.
void check_token_ids(const std::vector<int32_t>& ids, int32_t limit, const char* what, const char* param) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= limit)
      throw InvalidRequest(
          fmt::format("{} id {} (at {}) is outside the vocabulary [0, {})", what, ids[i], i, limit), param);
}

// A library caller queues as much as it likes: the waiting limits guard a
// server against its clients, not a program against itself.
AsyncEngineOptions unlimited() {
  AsyncEngineOptions o;
  o.max_waiting_requests = std::numeric_limits<size_t>::max() / 2;
  o.max_waiting_sequences = std::numeric_limits<size_t>::max() / 2;
  o.max_sequences_per_request = std::numeric_limits<size_t>::max() / 2;
  return o;
}

// The host program owns stdout: log to stderr, as the CLI does, unless the
// host installed a logger of its own.
void log_to_stderr() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (spdlog::default_logger()->name() != "") return;
    auto logger = spdlog::stderr_color_mt("pagellm");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%^%l%$ %v");
  });
}

}  // namespace

EmbeddedEngine::EmbeddedEngine(const json& engine_args, const LoadProgress& progress) {
  log_to_stderr();
  EngineArgs args = parse_engine_args(engine_args);
  auto engine = std::make_unique<Engine>(args.config, progress);
  served_.name = args.config.model;
  served_.tokenizer = &engine->tokenizer();
  served_.chat_template = load_chat_template(args.chat_template, *engine);
  served_.vocab_size = engine->model_config().n_vocab;
  served_.max_model_len = engine->max_model_len();
  served_.limits.grammar = args.config.grammar.limits;
  seed_ = args.seed;
  engine_ = std::make_unique<AsyncEngine>(std::move(engine), unlimited());
}

EmbeddedEngine::~EmbeddedEngine() { engine_->shutdown(std::chrono::milliseconds(0)); }

EngineRequest EmbeddedEngine::make_request(const std::string& id, std::vector<int32_t> prompt_ids,
                                           const json& sampling) const {
  if (!sampling.is_object() && !sampling.is_null())
    throw InvalidRequest(fmt::format("sampling parameters must be an object, got {}", json_type_name(sampling)));
  json body = sampling.is_null() ? json::object() : sampling;
  // The LoRA adapter (a name load_lora gave), beside vLLM's sampling fields.
  std::string lora;
  if (body.contains("lora") && !body["lora"].is_null()) {
    if (!body["lora"].is_string()) throw InvalidRequest("'lora' must be an adapter's name (a string)", "lora");
    lora = body["lora"].get<std::string>();
  }
  body.erase("lora");
  const bool room_left = body.contains("max_tokens") && body["max_tokens"].is_null();
  check_token_ids(prompt_ids, served_.vocab_size, "prompt token", "prompt");
  ParsedParams parsed = parse_request_params(body, /*chat=*/false, served_.vocab_size, /*default_max_tokens=*/16,
                                             served_.limits);
  parsed.sampling.structured = api::parse_structured_outputs(body, served_.limits.grammar);
  EngineRequest r;
  r.id = id;
  r.params = std::move(parsed.sampling);
  r.priority = parsed.priority;
  r.lora = std::move(lora);
  if (room_left) {
    const int64_t room = static_cast<int64_t>(max_model_len()) - static_cast<int64_t>(prompt_ids.size());
    r.params.max_tokens = static_cast<int32_t>(std::max<int64_t>(1, room));
  }
  const uint64_t n = submitted_.fetch_add(1);
  if (seed_ && !r.params.seed) r.params.seed = derive_seed(*seed_, n);
  r.prompt_ids = std::move(prompt_ids);
  return r;
}

void EmbeddedEngine::load_lora(const std::string& name, const std::string& path) {
  if (!engine_->lora_enabled()) throw InvalidRequest("LoRA adapters are not enabled (engine argument enable_lora)");
  engine_->run_on_step_thread([&](Engine& e) { e.lora()->load(name, path); });
}

bool EmbeddedEngine::unload_lora(const std::string& name) {
  if (!engine_->lora_enabled()) throw InvalidRequest("LoRA adapters are not enabled (engine argument enable_lora)");
  bool found = false;
  engine_->run_on_step_thread([&](Engine& e) { found = e.lora()->unload(name); });
  return found;
}

std::vector<std::string> EmbeddedEngine::lora_names() const {
  std::vector<std::string> names;
  for (const LoraInfo& l : engine_->loras()) names.push_back(l.name);
  return names;
}

std::vector<std::shared_ptr<RequestStream>> EmbeddedEngine::submit(std::vector<EngineRequest> reqs,
                                                                   std::shared_ptr<OutputQueue> sink) {
  return engine_->submit_group(std::move(reqs), std::move(sink));
}

api::OutputData EmbeddedEngine::render(const RequestOutput& out) const {
  const Tokenizer& tok = tokenizer();
  return api::render_output(out, [&tok](int32_t id) { return tok.token_to_piece(id, /*render_special=*/true); });
}

std::vector<int32_t> EmbeddedEngine::encode(const std::string& text, bool add_special) const {
  return tokenizer().encode(text, add_special, /*parse_special=*/true);
}

std::vector<int32_t> EmbeddedEngine::score_prompt(const std::string& query, const std::string& document) const {
  const ScoreModel* m = engine_->score_model();
  if (!m) throw InvalidRequest(engine_->score_error(), "model");
  return m->format.tokens(tokenizer(), query, document);
}

std::string EmbeddedEngine::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  check_token_ids(ids, tokenizer().vocab_size(), "token", "token_ids");
  return tokenizer().decode(ids, skip_special);
}

std::string EmbeddedEngine::render_chat(const json& messages, const json& options) const {
  if (!options.is_object() && !options.is_null())
    throw InvalidRequest(fmt::format("chat options must be an object, got {}", json_type_name(options)));
  json body = options.is_null() ? json::object() : options;
  body["messages"] = messages;
  return api::render_chat_prompt(body, served_, api::parse_tool_list(body, served_.limits.grammar));
}

json EmbeddedEngine::stats() const {
  const EngineStats s = engine_->stats();
  const EngineMetrics& m = s.metrics;
  return {{"num_requests_running", m.num_requests_running},
          {"num_requests_waiting", m.num_requests_waiting},
          {"kv_cache_usage", m.kv_cache_usage},
          {"kv_blocks_total", m.kv_blocks_total},
          {"kv_blocks_used", m.kv_blocks_used},
          {"prompt_tokens", m.prompt_tokens},
          {"generation_tokens", m.generation_tokens},
          {"prefix_cache_queries", m.prefix_cache_queries},
          {"prefix_cache_hits", m.prefix_cache_hits},
          {"num_preemptions", m.num_preemptions},
          {"num_steps", m.num_steps},
          {"spec_decode_num_drafts", m.spec_decode_num_drafts},
          {"spec_decode_num_draft_tokens", m.spec_decode_num_draft_tokens},
          {"spec_decode_num_accepted_tokens", m.spec_decode_num_accepted_tokens}};
}

}  // namespace pagellm::embed
