// The error a chat template raises on purpose with raise_exception(msg), e.g.
// "Conversation roles must alternate user/assistant/user/assistant/...".
// what() is exactly the template's message, so the server can return it to
// the client as is (HTTP 400).
#pragma once

#include <string>

#include "core/error.h"

namespace pagellm {

class TemplateError : public Error {
 public:
  explicit TemplateError(const std::string& msg) : Error(msg) {}
};

}  // namespace pagellm
