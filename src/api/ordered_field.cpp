#include "api/ordered_field.h"

namespace pagellm::api {
namespace {

constexpr size_t kMaxOrderedKeys = 1000;

bool small_objects(const nlohmann::json& v) {
  if (v.is_object()) {
    if (v.size() > kMaxOrderedKeys) return false;
    for (const auto& [k, x] : v.items())
      if (!small_objects(x)) return false;
  } else if (v.is_array()) {
    for (const auto& x : v)
      if (!small_objects(x)) return false;
  }
  return true;
}

}  // namespace

std::optional<nlohmann::ordered_json> ordered_field(const nlohmann::json& body, std::string_view raw,
                                                    const std::vector<std::string>& path) {
  if (raw.empty() || path.empty()) return std::nullopt;
  const nlohmann::json* sorted = &body;
  for (const std::string& k : path) {
    if (!sorted->is_object() || !sorted->contains(k)) return std::nullopt;
    sorted = &(*sorted)[k];
  }
  if (!small_objects(*sorted)) return std::nullopt;
  // Only the top-level field on the path is kept; the rest is parsed and dropped.
  const std::string& top = path.front();
  nlohmann::ordered_json::parser_callback_t keep = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                                                       nlohmann::ordered_json& parsed) {
    return !(depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && parsed != top);
  };
  nlohmann::ordered_json ordered;
  try {
    ordered = nlohmann::ordered_json::parse(raw.begin(), raw.end(), keep);
  } catch (const nlohmann::ordered_json::exception&) {
    return std::nullopt;
  }
  const nlohmann::ordered_json* v = &ordered;
  for (const std::string& k : path) {
    if (!v->is_object() || !v->contains(k)) return std::nullopt;
    v = &(*v)[k];
  }
  return *v;
}

}  // namespace pagellm::api
