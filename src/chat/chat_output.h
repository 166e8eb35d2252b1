// A chat choice's generated text -> what the API returns: reasoning (a
// thinking section, --reasoning-parser), content, and tool calls. The
// reasoning parser runs first; what it leaves as content goes to the tool
// handling of the request's tool_choice:
//   auto      the --tool-call-parser finds calls in the text as it streams
//   named     the grammar made the whole text the named function's arguments
//   required  the grammar made the whole text a JSON list of {name, parameters}
// Incremental, one per choice; feed() + finish() of a whole text equals the
// text parsed at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"

namespace pagellm::chat {

enum class ToolMode { None, Auto, Named, Required };

struct ChatOutputOptions {
  const ReasoningParser* reasoning = nullptr;  // null: no thinking section is split off
  bool prompt_ends_in_think = false;           // the template opened <think> in the prompt
  ToolMode tools = ToolMode::None;
  const ToolParser* tool_parser = nullptr;  // Auto
  std::string named_function;               // Named
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  // What came later, after this.
  void append(ChatDelta&& later);
};

class ChatOutputStream {
 public:
  explicit ChatOutputStream(const ChatOutputOptions& options);
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  // Calls returned so far (finish_reason becomes "tool_calls" when any).
  size_t num_calls() const { return num_calls_; }

 private:
  void content_in(std::string_view text, bool final, ChatDelta& out);

  ChatOutputOptions options_;
  std::unique_ptr<ReasoningStream> reasoning_;
  std::unique_ptr<ToolCallStream> tools_;
  std::string forced_;  // Named / Required: the whole constrained text
  size_t num_calls_ = 0;
};

// A whole output at once: feed(text) then finish().
ChatDelta parse_chat_output(const ChatOutputOptions& options, std::string_view text);

// Whether a rendered prompt ends inside an opened thinking section (the
// template wrote "<think>" last, as DeepSeek-R1's and Qwen3's do).
bool prompt_ends_in_think(std::string_view prompt);

}  // namespace pagellm::chat
