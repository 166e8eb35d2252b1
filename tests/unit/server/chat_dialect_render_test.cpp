// A chat turn as output blocks, and its Responses / Messages shapes: the
// final objects, the streamed event sequences, and the response store.
#include <gtest/gtest.h>

#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"
#include "server/anthropic_render.h"
#include "server/chat_turn.h"
#include "server/response_store.h"
#include "server/responses_render.h"

namespace pagellm::server {
namespace {

using nlohmann::json;

RequestOutput step(const std::string& text, int tokens = 1, FinishReason finish = FinishReason::None,
                   const std::string& stop_string = "") {
  RequestOutput out;
  out.num_prompt_tokens = 11;
  out.num_cached_tokens = 4;
  CompletionDelta d;
  d.text = text;
  d.token_ids.assign(static_cast<size_t>(tokens), 7);
  d.finish_reason = finish;
  d.stop_string = stop_string;
  out.completions.push_back(d);
  out.finished = finish != FinishReason::None;
  return out;
}

// Types of the SSE events in `sse` (their "event:" lines).
std::vector<std::string> event_types(const std::string& sse) {
  std::vector<std::string> out;
  for (size_t at = sse.find("event: "); at != std::string::npos; at = sse.find("event: ", at + 1))
    out.push_back(sse.substr(at + 7, sse.find('\n', at) - at - 7));
  return out;
}

std::vector<json> event_data(const std::string& sse) {
  std::vector<json> out;
  for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at + 1))
    out.push_back(json::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6)));
  return out;
}

class ChatTurnTest : public testing::Test {
 protected:
  chat::ChatOutputOptions options() {
    chat::ChatOutputOptions o;
    o.reasoning = reasoning_.get();
    o.prompt_ends_in_think = true;
    o.tools = chat::ToolMode::Auto;
    o.tool_parser = tools_.get();
    return o;
  }
  std::unique_ptr<chat::ReasoningParser> reasoning_ = chat::make_reasoning_parser("qwen3");
  std::unique_ptr<chat::ToolParser> tools_ = chat::make_tool_parser("hermes");
};

TEST_F(ChatTurnTest, ReasoningTextAndCallsAreBlocksInOrder) {
  const std::string output = "hmm</think>It is<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  // Streamed in pieces of every size, the blocks are the same.
  for (size_t piece : {1u, 3u, 100u}) {
    ChatTurn turn(options());
    std::vector<BlockEvent> events;
    for (size_t at = 0; at < output.size(); at += piece) {
      auto e = turn.add(step(output.substr(at, piece)));
      events.insert(events.end(), e.begin(), e.end());
    }
    auto e = turn.add(step("", 1, FinishReason::Stop));
    events.insert(events.end(), e.begin(), e.end());
    ASSERT_EQ(turn.blocks().size(), 3u) << piece;
    EXPECT_EQ(turn.blocks()[0].kind, TurnBlock::Kind::Reasoning);
    EXPECT_EQ(turn.blocks()[0].text, "hmm");
    EXPECT_EQ(turn.blocks()[1].kind, TurnBlock::Kind::Text);
    EXPECT_EQ(turn.blocks()[1].text, "It is");
    EXPECT_EQ(turn.blocks()[2].kind, TurnBlock::Kind::ToolCall);
    EXPECT_EQ(turn.blocks()[2].name, "f");
    EXPECT_EQ(turn.blocks()[2].text, "{\"a\":1}");
    for (const TurnBlock& b : turn.blocks()) EXPECT_FALSE(b.open);
    EXPECT_TRUE(turn.has_calls());
    EXPECT_EQ(turn.text(), "It is");
    // Every block opens once, closes once, and its appends add up to its text.
    std::vector<std::string> appended(3);
    std::vector<int> opened(3), closed(3);
    for (const BlockEvent& ev : events) {
      ASSERT_LT(ev.index, 3u);
      if (ev.type == BlockEvent::Type::Open) {
        EXPECT_EQ(closed[ev.index], 0);
        ++opened[ev.index];
      } else if (ev.type == BlockEvent::Type::Close) {
        ++closed[ev.index];
      } else {
        EXPECT_EQ(opened[ev.index], 1);
        EXPECT_EQ(closed[ev.index], 0);
        appended[ev.index] += ev.text;
      }
    }
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(opened[i], 1);
      EXPECT_EQ(closed[i], 1);
      EXPECT_EQ(appended[i], turn.blocks()[i].text);
    }
    EXPECT_EQ(turn.usage().prompt_tokens, 11);
    EXPECT_EQ(turn.usage().cached_tokens, 4);
  }
}

TEST_F(ChatTurnTest, AnEmptyTurnHasOneEmptyTextBlock) {
  ChatTurn turn(chat::ChatOutputOptions{});
  const auto events = turn.add(step("", 0, FinishReason::Length));
  ASSERT_EQ(turn.blocks().size(), 1u);
  EXPECT_EQ(turn.blocks()[0].kind, TurnBlock::Kind::Text);
  EXPECT_EQ(events.size(), 2u);  // open, close
  EXPECT_EQ(turn.finish(), FinishReason::Length);
  EXPECT_TRUE(turn.add(step("late")).empty());  // nothing after the end
}

TEST(ResponsesRender, ObjectAndStream) {
  ChatTurn turn(chat::ChatOutputOptions{});
  ResponsesMeta meta{"resp_1", 100, "m", true, "resp_0", json{{"instructions", "I"}, {"max_output_tokens", 3}}};
  ResponsesStream stream(meta);
  std::string sse = stream.begin(turn);
  sse += stream.add(turn.add(step("Hel")), turn);
  sse += stream.add(turn.add(step("lo", 2, FinishReason::Length)), turn);
  sse += stream.end(turn);
  EXPECT_EQ(event_types(sse),
            (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                      "response.content_part.added", "response.output_text.delta",
                                      "response.output_text.delta", "response.output_text.done",
                                      "response.content_part.done", "response.output_item.done",
                                      "response.incomplete"}));
  const std::vector<json> data = event_data(sse);
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(data[i]["sequence_number"], i);
  EXPECT_EQ(data[0]["response"]["status"], "in_progress");
  EXPECT_EQ(data[0]["response"]["output"], json::array());
  EXPECT_EQ(data[2]["item"]["status"], "in_progress");
  EXPECT_EQ(data[2]["item"]["content"], json::array());
  const std::string item_id = data[2]["item"]["id"];
  EXPECT_EQ(item_id.rfind("msg_", 0), 0u);
  EXPECT_EQ(data[6]["text"], "Hello");
  EXPECT_EQ(data[6]["item_id"], item_id);

  const json r = responses_object(meta, turn);
  EXPECT_EQ(data.back()["response"], r);
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["previous_response_id"], "resp_0");
  EXPECT_EQ(r["instructions"], "I");
  EXPECT_EQ(r["output"][0]["id"], item_id);
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 11, "output_tokens": 3, "total_tokens": 14,
      "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
      "output_tokens_details": {"reasoning_tokens": 0}})"));

  // A whole message in one output: its item still opens empty.
  ChatTurn whole(chat::ChatOutputOptions{});
  ResponsesStream again(meta);
  const std::vector<json> one = event_data(again.add(whole.add(step("Hi", 1, FinishReason::Stop)), whole));
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one[0]["type"], "response.output_item.added");
  EXPECT_EQ(one[0]["item"]["content"], json::array());
  EXPECT_EQ(one.back()["item"]["content"][0]["text"], "Hi");
  EXPECT_EQ(one.back()["item"]["status"], "completed");
}

TEST(ResponsesRender, FunctionCallsAndTheStoredConversation) {
  chat::ChatOutputOptions o;
  o.tools = chat::ToolMode::Named;
  o.named_function = "get";
  ChatTurn turn(o);
  ResponsesStream stream({"resp_1", 0, "m"});
  std::string sse = stream.add(turn.add(step("{\"x\": 1}", 3, FinishReason::Stop)), turn) + stream.end(turn);
  const std::vector<json> data = event_data(sse);
  EXPECT_EQ(data[0]["item"]["arguments"], "");  // as it opened, though the call was whole in one output
  EXPECT_EQ(data[0]["item"]["status"], "in_progress");
  EXPECT_EQ(event_types(sse),
            (std::vector<std::string>{"response.output_item.added", "response.function_call_arguments.delta",
                                      "response.function_call_arguments.done", "response.output_item.done",
                                      "response.completed"}));
  const json r = responses_object({"resp_1", 0, "m"}, turn);
  const json call = r["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get");
  EXPECT_EQ(call["status"], "completed");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json::parse(R"({"x": 1})"));
  const json messages = responses_chat_messages(turn);
  EXPECT_EQ(messages[0]["tool_calls"][0]["id"], call["call_id"]);
  EXPECT_EQ(messages[0]["tool_calls"][0]["function"]["arguments"], call["arguments"]);
}

TEST(AnthropicRender, StopReasonsAndBlocks) {
  auto finished = [](const std::string& text, FinishReason f, const std::string& stop = "") {
    ChatTurn turn(chat::ChatOutputOptions{});
    turn.add(step(text, 2, f, stop));
    return anthropic_message({"msg_1", "m", 11}, turn);
  };
  EXPECT_EQ(finished("a", FinishReason::Stop)["stop_reason"], "end_turn");
  EXPECT_EQ(finished("a", FinishReason::Length)["stop_reason"], "max_tokens");
  const json stopped = finished("a", FinishReason::Stop, "END");
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "END");
  EXPECT_EQ(stopped["content"], json::parse(R"([{"type": "text", "text": "a"}])"));
  // Anthropic counts cache reads apart from input_tokens.
  EXPECT_EQ(stopped["usage"], json::parse(R"({"input_tokens": 7, "cache_read_input_tokens": 4,
      "cache_creation_input_tokens": 0, "output_tokens": 2})"));

  chat::ChatOutputOptions o;
  o.tools = chat::ToolMode::Named;
  o.named_function = "get";
  ChatTurn turn(o);
  AnthropicStream stream({"msg_1", "m", 11});
  std::string sse = stream.begin(turn);
  sse += stream.add(turn.add(step("{\"x\": [1]}", 3, FinishReason::Stop)), turn);
  sse += stream.end(turn);
  EXPECT_EQ(event_types(sse),
            (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}));
  const std::vector<json> data = event_data(sse);
  EXPECT_EQ(data[0]["message"]["usage"]["input_tokens"], 11);  // before the engine reported: the prompt's length
  EXPECT_EQ(data[1], json({{"type", "ping"}}));
  EXPECT_EQ(data[2]["content_block"]["type"], "tool_use");
  EXPECT_EQ(data[2]["content_block"]["input"], json::object());
  EXPECT_EQ(data[3]["delta"]["type"], "input_json_delta");
  EXPECT_EQ(json::parse(data[3]["delta"]["partial_json"].get<std::string>()), json::parse(R"({"x": [1]})"));
  EXPECT_EQ(data[5]["delta"]["stop_reason"], "tool_use");
  const json m = anthropic_message({"msg_1", "m", 11}, turn);
  EXPECT_EQ(m["content"][0]["input"], json::parse(R"({"x": [1]})"));
  EXPECT_EQ(m["content"][0]["id"], data[2]["content_block"]["id"]);
}

TEST(AnthropicRender, ErrorShape) {
  EXPECT_EQ(anthropic_error_body(400, "bad"),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_STREQ(anthropic_error_type(401), "authentication_error");
  EXPECT_STREQ(anthropic_error_type(404), "not_found_error");
  EXPECT_STREQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_STREQ(anthropic_error_type(500), "api_error");
}

TEST(ResponseStore, LeastRecentlyUsedGoFirst) {
  ResponseStore store(2, 1 << 20);
  store.put("a", json::array({1}));
  store.put("b", json::array({2}));
  EXPECT_TRUE(store.get("a"));  // a is now the most recent
  store.put("c", json::array({3}));
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(*store.get("a"), json::array({1}));
  EXPECT_EQ(*store.get("c"), json::array({3}));
  store.put("c", json::array({4}), json{{"id", "c"}});  // replaced, not added
  EXPECT_EQ(*store.response("c"), json({{"id", "c"}}));
  EXPECT_FALSE(store.response("b"));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(*store.get("c"), json::array({4}));

  ResponseStore small(100, 40);  // bytes bound it too
  small.put("x", json::array({std::string(20, 'x')}));
  small.put("y", json::array({std::string(20, 'y')}));
  EXPECT_FALSE(small.get("x"));
  EXPECT_TRUE(small.get("y"));
  small.put("z", json::array({std::string(100, 'z')}));  // larger than the whole store: not kept
  EXPECT_FALSE(small.get("z"));
  EXPECT_TRUE(small.get("y"));

  ResponseStore none(0, 1 << 20);
  none.put("a", json::array());
  EXPECT_FALSE(none.get("a"));
}

TEST(ResponseStore, KeepsInputItemsAndForgetsOnErase) {
  ResponseStore store(4, 1 << 20);
  const json items = json::array({json{{"id", "msg_1"}, {"type", "message"}}});
  store.put("r", json::array({1}), json{{"id", "r"}}, items);
  EXPECT_EQ(*store.input_items("r"), items);
  EXPECT_TRUE(store.erase("r"));
  EXPECT_FALSE(store.erase("r"));
  EXPECT_FALSE(store.get("r"));
  EXPECT_FALSE(store.input_items("r"));
  EXPECT_EQ(store.size(), 0u);
  store.put("s", json::array({std::string(30, 's')}));  // the erased bytes were given back
  EXPECT_TRUE(store.get("s"));
}

}  // namespace
}  // namespace pagellm::server
