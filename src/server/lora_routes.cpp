// LoRA adapters over HTTP, with vLLM's routes and shapes: adapters are
// models of their own in /v1/models (parent: the base model), and
// POST /v1/load_lora_adapter {lora_name, lora_path} /
// /v1/unload_lora_adapter {lora_name} change them at run time (behind the API
// key; 400 unless the server runs with --enable-lora). The registry is the
// engine's: both run on its step thread between two steps.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "api/json_fields.h"
#include "api/utf8_check.h"
#include "server/http_errors.h"
#include "server/openai_server.h"

namespace pagellm::server {

using namespace api;  // request parsing and UTF-8 checks (src/api)
using nlohmann::json;

namespace {

std::string required_text(const json& body, const char* key) {
  if (!body.is_object() || !body.contains(key) || !body[key].is_string() || body[key].get<std::string>().empty())
    throw InvalidRequest(fmt::format("'{}' must be a non-empty string", key), key);
  return body[key].get<std::string>();
}

}  // namespace

std::vector<json> OpenAIServer::adapter_cards() const {
  std::vector<json> cards;
  if (!engine_.lora_enabled()) return cards;
  for (const LoraInfo& l : engine_.loras())
    cards.push_back({{"id", l.name},
                     {"object", "model"},
                     {"created", started_at_},
                     {"owned_by", "pagellm"},
                     {"root", l.path},
                     {"parent", model_.name},
                     {"max_model_len", model_.max_model_len}});
  return cards;
}

void OpenAIServer::load_lora_adapter(const httplib::Request& req, httplib::Response& res) {
  require_accepting();
  if (!engine_.lora_enabled())
    throw InvalidRequest("LoRA adapters are not enabled on this server (start it with --enable-lora)");
  const json body = parse_json_body(req.body);
  const std::string name = required_text(body, "lora_name"), path = required_text(body, "lora_path");
  if (model_.answers_to(name))
    throw InvalidRequest(fmt::format("'{}' is the base model's name", sanitize_utf8(name)), "lora_name");
  try {
    engine_.run_on_step_thread([&](Engine& e) { e.lora()->load(name, path); });
  } catch (const InvalidRequest&) {
    throw;
  } catch (const ShuttingDown&) {
    throw;
  } catch (const Error& e) {
    // A file that does not fit the model: the client's to fix.
    throw InvalidRequest(e.what(), "lora_path");
  }
  res.set_content(fmt::format("Success: LoRA adapter '{}' added successfully.", sanitize_utf8(name)), "text/plain");
}

void OpenAIServer::unload_lora_adapter(const httplib::Request& req, httplib::Response& res) {
  require_accepting();
  if (!engine_.lora_enabled())
    throw InvalidRequest("LoRA adapters are not enabled on this server (start it with --enable-lora)");
  const json body = parse_json_body(req.body);
  const std::string name = required_text(body, "lora_name");
  bool found = false;
  engine_.run_on_step_thread([&](Engine& e) { found = e.lora()->unload(name); });
  if (!found)
    throw HttpError(404, fmt::format("The lora adapter '{}' cannot be found.", sanitize_utf8(name)), "NotFoundError",
                    "lora_name");
  res.set_content(fmt::format("Success: LoRA adapter '{}' removed successfully.", sanitize_utf8(name)),
                  "text/plain");
}

}  // namespace pagellm::server
