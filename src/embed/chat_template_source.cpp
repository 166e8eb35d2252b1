#include "embed/chat_template_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/model_config.h"

namespace pagellm::embed {

std::shared_ptr<const ChatTemplate> load_chat_template(const std::string& flag, const Engine& engine) {
  std::string source;
  if (!flag.empty()) {
    if (std::filesystem::is_regular_file(flag)) {
      std::ifstream in(flag, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      source = ss.str();
    } else if (flag.find("{{") != std::string::npos || flag.find("{%") != std::string::npos) {
      source = flag;  // an inline template, as vLLM allows
    } else {
      fail("--chat-template: no such file '{}'", flag);
    }
    try {
      return std::make_shared<ChatTemplate>(source);
    } catch (const Error& e) {
      fail("--chat-template '{}' does not parse: {}", flag, e.what());
    }
  }
  source = engine.tokenizer().chat_template();
  const char* origin = "the model's";
  if (source.empty()) {
    const char* builtin = builtin_chat_template(arch_name(engine.model_config().arch));
    if (!builtin) {
      spdlog::warn("the model has no chat template: chat requests get a 400 (use --chat-template FILE)");
      return nullptr;
    }
    source = builtin;
    origin = "the built-in";
  }
  try {
    auto t = std::make_shared<ChatTemplate>(source);
    spdlog::info("chat template: {} ({} bytes)", origin, source.size());
    return t;
  } catch (const Error& e) {
    spdlog::warn("{} chat template does not parse ({}): chat completions disabled", origin, e.what());
    return nullptr;
  }
}

}  // namespace pagellm::embed
