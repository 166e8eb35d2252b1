// The chat template a user chose (serve's and generate's --chat-template, the
// Python package's chat_template): a file, an inline template, or (empty) the
// model's own / pagellm's built-in one.
#pragma once

#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "engine/engine.h"

namespace pagellm::embed {

// Throws Error when the flag names no file or does not parse; for the model's
// own template, a warning and nullptr (chat requests then get a 400).
std::shared_ptr<const ChatTemplate> load_chat_template(const std::string& flag, const Engine& engine);

}  // namespace pagellm::embed
