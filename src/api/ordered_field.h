// nlohmann::json sorts object keys; where the client's key order is meaning
// (a JSON schema's properties are the order a model writes them in, as
// pydantic declares them), the field is read again from the raw body text.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::api {

// body[path[0]][path[1]]... re-read from `raw` (the text `body` came from)
// with its key order. Nothing when raw is empty, the path is not there, or an
// object on it holds more than 1,000 keys (ordered_json inserts in linear
// time: a hostile body must not cost quadratic time).
std::optional<nlohmann::ordered_json> ordered_field(const nlohmann::json& body, std::string_view raw,
                                                    const std::vector<std::string>& path);

}  // namespace pagellm::api
