// Names of an enum's values as users write them (CLI flags, YAML, the Python
// and C engine arguments): one table per enum, read by every front end.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/error.h"

namespace pagellm {

template <typename E>
struct EnumName {
  const char* name;
  E value;
};

template <typename E, size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const auto& e : table) out.emplace_back(e.name);
  return out;
}

// Throws InvalidRequest naming `field` and the accepted names.
template <typename E, size_t N>
E enum_from_name(const EnumName<E> (&table)[N], const std::string& name, const char* field) {
  for (const auto& e : table)
    if (name == e.name) return e.value;
  std::string known;
  for (const auto& e : table) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw InvalidRequest(fmt::format("{} is '{}'; expected one of {}", field, name, known), field);
}

}  // namespace pagellm
