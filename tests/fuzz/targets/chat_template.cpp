// Chat templates, both ways round: the input as a template (lexer, parser,
// interpreter, builtins) rendered over a fixed conversation, and the input as
// message content for two real templates (Gemma 3's built-in one and Mistral
// Small 3.1's, which uses tools, strftime_now and raise_exception).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "api/utf8_check.h"
#include "chat/chat_template.h"
#include "common.h"
#include "targets.h"

namespace pagellm::fuzz {
namespace {

using nlohmann::ordered_json;

ChatRenderOptions render_options() {
  ChatRenderOptions o;
  o.now = std::tm{};
  o.now->tm_year = 124;
  o.now->tm_mon = 6;
  o.now->tm_mday = 26;
  // A fuzzed template may loop or grow strings right up to the limits; at the
  // defaults (5M steps, 64 MiB) one input takes seconds under ASan. The
  // limits are counted the same way at any size, so small ones find the same bugs.
  o.limits.max_steps = 200'000;
  o.limits.max_string_bytes = 1 << 20;
  o.limits.max_items = 100'000;
  return o;
}

ordered_json conversation(const std::string& content) {
  return ordered_json::array({
      {{"role", "system"}, {"content", "You are a helpful assistant."}},
      {{"role", "user"}, {"content", content}},
      {{"role", "assistant"}, {"content", "Sure: " + content}},
      {{"role", "user"}, {"content", ordered_json::array({{{"type", "text"}, {"text", content}}})}},
  });
}

ordered_json extras() {
  return {{"tools", ordered_json::array({{{"type", "function"},
                                          {"function",
                                           {{"name", "get_weather"},
                                            {"description", "Weather of a city"},
                                            {"parameters",
                                             {{"type", "object"},
                                              {"properties", {{"city", {{"type", "string"}}}}}}}}}}})},
          {"enable_thinking", true}};
}

std::string read_fixture(const std::string& rel) {
  const std::string path = std::string(PAGELLM_FIXTURES) + "/" + rel;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RealTemplates {
  ChatTemplate gemma{builtin_chat_template("gemma3")};
  ChatTemplate mistral{read_fixture("chat_templates/extra/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja")};
};

}  // namespace

int chat_template(const uint8_t* data, size_t size) {
  static const RealTemplates real;
  static const ChatRenderOptions options = render_options();
  const std::string input(reinterpret_cast<const char*>(data), size);

  // The template comes from a model file. ChatTemplate promises pagellm::Error
  // only, and the server turns any std::exception of rendering into a 400.
  refused(Refusal::AnyException, [&] {
    const ChatTemplate t(input);
    (void)apply_chat_template(t, conversation("Hello {{ 1 + 1 }} <s>"), true, "<s>", "</s>", extras(), options);
    (void)t.render(ordered_json::object(), options);
  });

  // Message content comes from a request, which the server has checked to be UTF-8.
  const std::string content = api::sanitize_utf8(input);
  for (const ChatTemplate* t : {&real.gemma, &real.mistral}) {
    refused(Refusal::AnyException, [&] {
      (void)apply_chat_template(*t, conversation(content), true, "<s>", "</s>", ordered_json::object(), options);
    });
  }
  return 0;
}

}  // namespace pagellm::fuzz
