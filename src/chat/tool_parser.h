// Tool-call parsers: a model's generated text -> OpenAI tool calls plus the
// remaining content, as vLLM's --tool-call-parser NAME does, whole or streamed.
//
//   hermes       Qwen 2.5/3, Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, with
//                content before, between and after. A last call missing its </tool_call> still counts when its
//                JSON is complete (vLLM accepts it too: the closing tag may have been a stop string).
//   llama3_json  Llama 3.x: the whole output (after whitespace and an optional <|python_tag|>) is
//                {"name": ..., "parameters": {...}} ("arguments" also read), or several joined by ';'.
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]name[ARGS]{...} (also
//                name{...}), repeated; text before and after is content.
//   pythonic     Llama 3.2/4: the whole output is [f(a=1, b="x"), g()] with Python literal keyword arguments
//                (optionally wrapped in <|python_start|> ... <|python_end|>).
//
// Anything malformed (bad JSON, no name, arguments that are not an object, an unfinished call at the end) is
// returned as content, verbatim: the content of a result is always the output minus its calls. Whitespace that
// only separates calls from each other or from the ends of the output is dropped, so an output made only of calls
// has empty content. Arguments keep the model's key order and are compact JSON ("{}" when there are none);
// JSON nested deeper than 64 levels counts as malformed.
//
// llama3_json and pythonic decide from the first non-whitespace characters whether the output is a call list;
// when it may be, they hold the whole output and return the calls (or the text) at finish(), since a list only
// proves well-formed at its end.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::chat {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object as compact text, "{}" when none
};

struct ToolParseResult {
  std::string content;          // text outside tool calls (may be empty)
  std::vector<ToolCall> calls;  // in output order
  // What came later: its content and calls after these.
  void append(ToolParseResult&& later) {
    content += later.content;
    for (ToolCall& c : later.calls) calls.push_back(std::move(c));
  }
};

// Incremental parsing of one generated sequence. Work is linear in the output: each delta is scanned once,
// and only the unfinished call (or a possible partial marker) is kept between deltas.
class ToolCallStream {
 public:
  virtual ~ToolCallStream() = default;
  // Feed a text delta; returns content that is safe to show now and any calls completed by this delta.
  // Text that may be the start of a tool call (e.g. a partial "<tool_") is held back until it is decided.
  virtual ToolParseResult feed(std::string_view delta) = 0;
  // End of output: flushes held-back text; an unfinished or malformed call is returned as content.
  virtual ToolParseResult finish() = 0;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  virtual const std::string& name() const = 0;
  virtual std::unique_ptr<ToolCallStream> stream() const = 0;
  // Whole output: stream() then feed(text) + finish(), merged, so it always agrees with streaming.
  ToolParseResult parse(std::string_view text) const;
};

// The parser for a --tool-call-parser name; throws pagellm::Error listing the known names.
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name);
std::vector<std::string> tool_parser_names();

}  // namespace pagellm::chat
