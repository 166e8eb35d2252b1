// One chat choice (n = 1) read as a sequence of output blocks, for the APIs
// whose replies are lists of typed parts rather than one message: OpenAI's
// Responses (output items) and Anthropic's Messages (content blocks).
// The chat output parsers (src/chat/chat_output.h) split the text into
// reasoning, content and tool calls; this turns their deltas into blocks that
// open, grow and close, so a stream and the final object tell the same story.
// Pure: no I/O.
#pragma once

#include <string>
#include <vector>

#include "api/output_render.h"
#include "chat/chat_output.h"
#include "engine/engine.h"
#include "server/openai_response.h"

namespace pagellm::server {

struct TurnBlock {
  enum class Kind { Reasoning, Text, ToolCall };
  Kind kind = Kind::Text;
  std::string id;    // 24 random hex digits; each API puts its own prefix on it
  std::string text;  // reasoning or text so far; a call's arguments (JSON text)
  std::string name;  // ToolCall: the function
  bool open = true;
};

// What an output did to the blocks, in order.
struct BlockEvent {
  enum class Type { Open, Append, Close };
  Type type;
  size_t index;      // into blocks()
  std::string text;  // Append: the new text
};

class ChatTurn {
 public:
  explicit ChatTurn(chat::ChatOutputOptions options);
  // Sample 0's delta of one engine output. A finishing output flushes the
  // parsers and closes the last block; a turn that produced nothing gets one
  // empty text block, so every reply has something to show.
  std::vector<BlockEvent> add(const RequestOutput& out);

  bool finished() const { return finish_ != FinishReason::None; }
  FinishReason finish() const { return finish_; }
  const api::StopReason& stop_reason() const { return stop_reason_; }
  const std::vector<TurnBlock>& blocks() const { return blocks_; }
  const Usage& usage() const { return usage_; }
  bool has_calls() const;
  // The text blocks joined (what a plain chat message's content would be).
  std::string text() const;

 private:
  void push(chat::ChatDelta&& d, std::vector<BlockEvent>& events);
  void open(TurnBlock::Kind kind, std::vector<BlockEvent>& events);
  void close_last(std::vector<BlockEvent>& events);

  chat::ChatOutputStream parser_;
  std::vector<TurnBlock> blocks_;
  FinishReason finish_ = FinishReason::None;
  api::StopReason stop_reason_;
  Usage usage_;
  bool prompt_counted_ = false;
};

// 24 random hex digits.
std::string make_block_id();

}  // namespace pagellm::server
