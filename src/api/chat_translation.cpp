#include "api/chat_translation.h"

#include "chat/jinja/errors.h"
#include "core/error.h"

namespace pagellm::api {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

[[noreturn]] void rethrow_renamed(const std::string& message, const std::string& param, const FieldRenames& renames) {
  std::string msg = message;
  std::string renamed = param;
  for (const auto& [from, to] : renames.params) {
    if (param == from) renamed = to;
    replace_all(msg, "'" + from + "'", "'" + to + "'");
  }
  for (const auto& [from, to] : renames.phrases) replace_all(msg, from, to);
  throw InvalidRequest(msg, renamed);
}

}  // namespace

nlohmann::ordered_json to_ordered(const nlohmann::json& j) { return nlohmann::ordered_json::parse(j.dump()); }

GenerationRequest parse_translated_chat(const std::string& chat_body_text, const ServedModel& m,
                                        const FieldRenames& renames) {
  const nlohmann::json body = nlohmann::json::parse(chat_body_text);
  try {
    return parse_chat_request(body, m, chat_body_text);
  } catch (const ModelNotFound&) {
    throw;
  } catch (const InvalidRequest& e) {
    rethrow_renamed(e.what(), e.param(), renames);
  } catch (const TemplateError& e) {
    rethrow_renamed(e.what(), "messages", renames);
  }
}

}  // namespace pagellm::api
