#include "chat/reasoning_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace pagellm::chat {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `tag`: text that may still become it.
size_t partial_tag_len(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// Both parsers: an optional leading <think>, then thinking up to </think>, then content. They differ only in
// whether an output that does not open with <think> is thinking (the prompt opened it) or content.
class ThinkStream final : public ReasoningStream {
 public:
  explicit ThinkStream(bool thinking_without_open_tag) : thinking_without_open_tag_(thinking_without_open_tag) {}

  ReasoningSplit feed(std::string_view delta) override {
    ReasoningSplit out;
    held_.append(delta);
    if (phase_ == Phase::kOpening) open();
    if (phase_ == Phase::kThinking) think(out);
    if (phase_ == Phase::kAnswer) {
      out.content += held_;
      held_.clear();
    }
    return out;
  }

  ReasoningSplit finish() override {
    ReasoningSplit out;
    const bool reasoning = phase_ == Phase::kThinking || (phase_ == Phase::kOpening && thinking_without_open_tag_);
    (reasoning ? out.reasoning : out.content) += held_;
    held_.clear();
    return out;
  }

 private:
  enum class Phase { kOpening, kThinking, kAnswer };

  // Decides from the output's first non-whitespace characters whether it opens with <think>.
  void open() {
    while (space_end_ < held_.size() && is_space(held_[space_end_])) ++space_end_;
    const std::string_view rest = std::string_view(held_).substr(space_end_);
    if (rest.size() < kThinkOpen.size() && rest == kThinkOpen.substr(0, rest.size())) return;  // undecided
    if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
      held_.erase(0, space_end_ + kThinkOpen.size());  // vLLM drops the tag and what comes before it
      phase_ = Phase::kThinking;
      return;
    }
    phase_ = thinking_without_open_tag_ ? Phase::kThinking : Phase::kAnswer;
  }

  // Moves held_ to reasoning up to </think>; keeps a possible partial </think>.
  void think(ReasoningSplit& out) {
    const size_t close = held_.find(kThinkClose);
    if (close == std::string::npos) {
      const size_t keep = partial_tag_len(held_, kThinkClose);
      out.reasoning.append(held_, 0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    out.reasoning.append(held_, 0, close);
    held_.erase(0, close + kThinkClose.size());
    phase_ = Phase::kAnswer;
  }

  bool thinking_without_open_tag_;
  Phase phase_ = Phase::kOpening;
  std::string held_;      // undecided text: the output's start, or a possible partial </think>
  size_t space_end_ = 0;  // while opening: the leading whitespace already scanned
};

class ThinkParser final : public ReasoningParser {
 public:
  // always_thinking: the output is thinking until </think> whatever the prompt (DeepSeek R1).
  ThinkParser(std::string name, bool always_thinking) : name_(std::move(name)), always_thinking_(always_thinking) {}
  const std::string& name() const override { return name_; }
  std::unique_ptr<ReasoningStream> stream(bool prompt_ends_in_think) const override {
    return std::make_unique<ThinkStream>(always_thinking_ || prompt_ends_in_think);
  }

 private:
  std::string name_;
  bool always_thinking_;
};

struct ReasoningParserEntry {
  const char* name;
  bool always_thinking;
};

constexpr ReasoningParserEntry kReasoningParsers[] = {
    {"deepseek_r1", true},
    {"qwen3", false},
};

}  // namespace

ReasoningSplit ReasoningParser::parse(std::string_view text, bool prompt_ends_in_think) const {
  std::unique_ptr<ReasoningStream> s = stream(prompt_ends_in_think);
  ReasoningSplit split = s->feed(text);
  ReasoningSplit rest = s->finish();
  split.reasoning += rest.reasoning;
  split.content += rest.content;
  return split;
}

std::unique_ptr<ReasoningParser> make_reasoning_parser(const std::string& name) {
  for (const ReasoningParserEntry& entry : kReasoningParsers)
    if (name == entry.name) return std::make_unique<ThinkParser>(name, entry.always_thinking);
  fail("unknown reasoning parser '{}' (known: {})", name, fmt::join(reasoning_parser_names(), ", "));
}

std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> names;
  for (const ReasoningParserEntry& entry : kReasoningParsers) names.emplace_back(entry.name);
  return names;
}

}  // namespace pagellm::chat
