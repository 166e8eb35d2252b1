#include "server/chat_turn.h"

#include <fmt/format.h>

#include <random>

namespace pagellm::server {

std::string make_block_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

ChatTurn::ChatTurn(chat::ChatOutputOptions options) : parser_(options) {}

bool ChatTurn::has_calls() const {
  for (const TurnBlock& b : blocks_)
    if (b.kind == TurnBlock::Kind::ToolCall) return true;
  return false;
}

std::string ChatTurn::text() const {
  std::string out;
  for (const TurnBlock& b : blocks_)
    if (b.kind == TurnBlock::Kind::Text) out += b.text;
  return out;
}

void ChatTurn::close_last(std::vector<BlockEvent>& events) {
  if (blocks_.empty() || !blocks_.back().open) return;
  blocks_.back().open = false;
  events.push_back({BlockEvent::Type::Close, blocks_.size() - 1, {}});
}

void ChatTurn::open(TurnBlock::Kind kind, std::vector<BlockEvent>& events) {
  close_last(events);
  TurnBlock& b = blocks_.emplace_back();
  b.kind = kind;
  b.id = make_block_id();
  events.push_back({BlockEvent::Type::Open, blocks_.size() - 1, {}});
}

void ChatTurn::push(chat::ChatDelta&& d, std::vector<BlockEvent>& events) {
  // A delta lists reasoning before content before calls: the order they
  // appear in the text (the parsers only ever hand back later text later).
  auto append = [&](TurnBlock::Kind kind, std::string& text) {
    if (text.empty()) return;
    if (blocks_.empty() || !blocks_.back().open || blocks_.back().kind != kind) open(kind, events);
    blocks_.back().text += text;
    events.push_back({BlockEvent::Type::Append, blocks_.size() - 1, std::move(text)});
  };
  append(TurnBlock::Kind::Reasoning, d.reasoning);
  append(TurnBlock::Kind::Text, d.content);
  for (chat::ToolCall& call : d.calls) {
    open(TurnBlock::Kind::ToolCall, events);
    blocks_.back().name = std::move(call.name);
    blocks_.back().text = call.arguments;
    events.push_back({BlockEvent::Type::Append, blocks_.size() - 1, std::move(call.arguments)});
    close_last(events);
  }
}

std::vector<BlockEvent> ChatTurn::add(const RequestOutput& out) {
  std::vector<BlockEvent> events;
  if (!prompt_counted_ && (out.num_prompt_tokens > 0 || out.finished)) {
    prompt_counted_ = true;
    usage_.prompt_tokens = out.num_prompt_tokens;
    usage_.cached_tokens = out.num_cached_tokens;
  }
  for (const CompletionDelta& d : out.completions) {
    if (d.index != 0 || finished()) continue;
    usage_.completion_tokens += static_cast<int64_t>(d.token_ids.size());
    chat::ChatDelta parsed = parser_.feed(d.text);
    if (d.finish_reason != FinishReason::None) {
      parsed.append(parser_.finish());
      finish_ = d.finish_reason;
      stop_reason_ = api::stop_reason(d.stop_string, d.stop_token);
    }
    push(std::move(parsed), events);
    if (finished()) {
      if (blocks_.empty()) open(TurnBlock::Kind::Text, events);
      close_last(events);
    }
  }
  return events;
}

}  // namespace pagellm::server
