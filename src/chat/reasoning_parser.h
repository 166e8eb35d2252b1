// Reasoning parsers: a thinking model's output -> reasoning (the <think> section) and content, as vLLM's
// --reasoning-parser NAME does, whole or streamed.
//
//   deepseek_r1  Everything up to </think> is reasoning, the rest content. A leading <think> (after whitespace)
//                is dropped; R1's template opens <think> in the prompt, so an output without </think> is all
//                reasoning. prompt_ends_in_think is not needed and ignored.
//   qwen3        Reasoning only when thinking was opened: by the prompt (prompt_ends_in_think, as Qwen3.5's and
//                Qwen3-Thinking-2507's templates do) or by the output starting with <think> (older Qwen3
//                templates); the thinking section then runs to </think>. Otherwise the output is all content,
//                </think> included. Thinking that never reaches </think> (the output was cut off) is all
//                reasoning, as in vLLM's current Qwen3ReasoningParser (earlier versions, which needed both tags,
//                returned it as content, though their streaming had already sent it as reasoning).
//
// Text after </think> is content as generated (vLLM strips nothing). Streaming holds back only a possible partial
// <think> at the start or </think> in the thinking section, so each stream's reasoning and content, concatenated,
// equal parse() of the whole output.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::chat {

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

// Incremental splitting of one generated sequence, in time linear in the output.
class ReasoningStream {
 public:
  virtual ~ReasoningStream() = default;
  // Feed a text delta; returns the reasoning and content it decides.
  virtual ReasoningSplit feed(std::string_view delta) = 0;
  // End of output: flushes held-back text (a partial tag stays in its section).
  virtual ReasoningSplit finish() = 0;
};

class ReasoningParser {
 public:
  virtual ~ReasoningParser() = default;
  virtual const std::string& name() const = 0;
  // prompt_ends_in_think: the rendered prompt ends inside an open <think> (the template opened it).
  virtual std::unique_ptr<ReasoningStream> stream(bool prompt_ends_in_think) const = 0;
  // Whole output: stream() then feed(text) + finish(), merged, so it always agrees with streaming.
  ReasoningSplit parse(std::string_view text, bool prompt_ends_in_think) const;
};

// The parser for a --reasoning-parser name; throws pagellm::Error listing the known names.
std::unique_ptr<ReasoningParser> make_reasoning_parser(const std::string& name);
std::vector<std::string> reasoning_parser_names();

}  // namespace pagellm::chat
