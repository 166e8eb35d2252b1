// The backend_option_* readers of backend/registry.h, in a file of their own:
// a plugin compiles them in (with backend.cpp and c_export.cpp) without the
// registry and its built-in backends.
#include <algorithm>
#include <charconv>

#include "backend/registry.h"
#include "core/error.h"

namespace pagellm {

int backend_option_int(const BackendOptions& o, const std::string& backend, const std::string& key, int fallback) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  int v = 0;
  const std::string& s = it->second;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty())
    fail("{} backend option {}='{}' is not an integer", backend, key, s);
  return v;
}

bool backend_option_bool(const BackendOptions& o, const std::string& backend, const std::string& key, bool fallback) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  const std::string& s = it->second;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  fail("{} backend option {}='{}' is not a boolean (true/false)", backend, key, s);
}

std::string backend_option_string(const BackendOptions& o, const std::string& key, const std::string& fallback) {
  auto it = o.find(key);
  return it == o.end() ? fallback : it->second;
}

void check_backend_options(const BackendOptions& o, const std::string& backend, const std::vector<std::string>& known) {
  for (const auto& [k, v] : o) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    fail("the {} backend has no option '{}' (its options: {})", backend, k, list.empty() ? "none" : list);
  }
}

}  // namespace pagellm
