#include "server/auth.h"

namespace pagellm::server {

bool route_needs_api_key(std::string_view path) {
  return path.starts_with("/v1/") || path == "/v1" || path == "/tokenize" || path == "/detokenize";
}

bool authorization_matches(std::string_view header_value, std::string_view key) {
  constexpr std::string_view kScheme = "Bearer ";
  if (header_value.size() < kScheme.size()) return false;
  // The scheme is case-insensitive (RFC 7235).
  for (size_t i = 0; i < kScheme.size(); ++i) {
    const char a = header_value[i], b = kScheme[i];
    if ((a | 0x20) != (b | 0x20)) return false;
  }
  std::string_view given = header_value.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const char g = i < given.size() ? given[i] : '\0';
    diff |= static_cast<unsigned>(static_cast<unsigned char>(g) ^ static_cast<unsigned char>(key[i]));
  }
  return diff == 0 && !key.empty();
}

}  // namespace pagellm::server
