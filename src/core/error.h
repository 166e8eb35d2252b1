// Errors: throw inside, return status at boundaries (CLI exit code, HTTP error JSON).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace pagellm {

// Any failure the user can act on: bad files, bad arguments, unsupported models.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A request the engine refuses (bad sampling values, prompt too long): the
// server maps it to HTTP 400.
class InvalidRequest : public Error {
 public:
  explicit InvalidRequest(const std::string& msg, std::string param = "")
      : Error(msg), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace pagellm

// PAGELLM_CHECK(cond, "fmt {}", x): throws pagellm::Error with the message.
#define PAGELLM_CHECK(cond, ...)          \
  do {                                    \
    if (!(cond)) ::pagellm::fail(__VA_ARGS__); \
  } while (0)
