// API keys (--api-key): requests to /v1/*, /tokenize and /detokenize must
// carry "Authorization: Bearer <key>" (or "x-api-key: <key>", as Anthropic's
// clients send it); /health, /metrics and /version stay
// open for probes and scrapers (as in vLLM, which guards /v1 only).
#pragma once

#include <string>
#include <string_view>

namespace pagellm::server {

// Whether `path` needs the key when one is set.
bool route_needs_api_key(std::string_view path);

// Whether an Authorization header value carries `key` (compared in time
// independent of where they differ).
bool authorization_matches(std::string_view header_value, std::string_view key);

}  // namespace pagellm::server
