// Chat templates: a model's Jinja2 template (GGUF tokenizer.chat_template or
// tokenizer_config.json chat_template) rendered byte for byte as Hugging Face
// transformers' apply_chat_template does with Python's jinja2
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// tojson without ASCII escaping, raise_exception, strftime_now).
//
// Key order: templates print dicts (e.g. `tools | tojson`) in insertion
// order like Python. nlohmann::json sorts object keys; pass
// nlohmann::ordered_json (e.g. parse requests with ordered_json::parse) to
// keep the client's order.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja/errors.h"  // pagellm::TemplateError
#include "chat/jinja/template.h"

namespace pagellm {

using ChatRenderOptions = jinja::RenderOptions;  // limits, fixed clock for strftime_now
using ChatTemplateLimits = jinja::Limits;       // see jinja::Limits for each bound and its default

class ChatTemplate {
 public:
  // Parses once; throws pagellm::Error naming line and column on syntax errors
  // (and on sources beyond limits.max_nesting / max_expr_depth). `limits` also
  // bound every render that is not given its own options.
  explicit ChatTemplate(std::string source, const ChatTemplateLimits& limits = {});

  // context: a JSON object of variables (messages, add_generation_prompt,
  // bos_token, eos_token, tools, ...). Thread-safe.
  // Throws pagellm::TemplateError when the template calls raise_exception(msg)
  // (what() == msg), pagellm::Error for any other failure (undefined
  // variables used in arithmetic, type errors, exceeded limits, context nested
  // deeper than jinja::kMaxDepth), with the template line in the message.
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context, const ChatRenderOptions& options) const;
  std::string render(const nlohmann::ordered_json& context, const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }
  const jinja::Template& compiled() const { return *tmpl_; }
  const ChatTemplateLimits& limits() const { return limits_; }
  // Options for render(): this template's limits, the local clock.
  ChatRenderOptions default_options() const;

 private:
  std::string source_;
  ChatTemplateLimits limits_;
  std::shared_ptr<const jinja::Template> tmpl_;
};

// messages: a JSON array of {role, content, ...} (content a string or a list
// of parts such as {"type":"text","text":...}; templates handle both).
// Like transformers, `tools` and `documents` are none unless `extra` sets
// them; other keys of `extra` (date_string, enable_thinking, ...) are merged
// into the context and override the defaults. The JSON is read in place (never
// copied), in time linear in its size. Without options, renders with
// t.default_options().
std::string apply_chat_template(const ChatTemplate& t, const nlohmann::json& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token,
                                const nlohmann::json& extra = nlohmann::json::object());
std::string apply_chat_template(const ChatTemplate& t, const nlohmann::json& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token,
                                const nlohmann::json& extra, const ChatRenderOptions& options);
std::string apply_chat_template(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const std::string& bos_token,
                                const std::string& eos_token,
                                const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());
std::string apply_chat_template(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const std::string& bos_token,
                                const std::string& eos_token, const nlohmann::ordered_json& extra,
                                const ChatRenderOptions& options);

// Whether `j` nests deeper than max_depth levels (each array or object is one
// level), found without recursion. nlohmann::json copies and compares
// recursively, so callers check request JSON with this before copying it.
bool json_deeper_than(const nlohmann::json& j, size_t max_depth);
bool json_deeper_than(const nlohmann::ordered_json& j, size_t max_depth);

// Built-in templates for architectures whose GGUF files ship none (Gemma 3's
// official template for "gemma3"); nullptr when there is none.
const char* builtin_chat_template(const std::string& arch);

}  // namespace pagellm
