// Responses API and Messages API bodies -> the chat completions body they
// stand for, and the errors (naming the client's field) on the edge cases.
#include <gtest/gtest.h>

#include "api/anthropic_request.h"
#include "api/responses_request.h"
#include "chat/chat_template.h"
#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

ResponsesRequest responses(const std::string& raw, const json& history = json::array()) {
  return parse_responses_request(json::parse(raw), raw, history);
}
AnthropicRequest anthropic(const std::string& raw) { return parse_anthropic_request(json::parse(raw), raw); }
json chat_of(const ResponsesRequest& r) { return json::parse(r.chat_body_text); }
json chat_of(const AnthropicRequest& r) { return json::parse(r.chat_body_text); }

// The InvalidRequest of `f` as "param: message" (fails when it does not throw).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidRequest& e) {
    return e.param() + ": " + e.what();
  }
  ADD_FAILURE() << "no refusal";
  return "";
}

TEST(ResponsesRequest, InputStringAndInstructions) {
  const auto r = responses(R"({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7,
                               "temperature": 0.5, "store": false, "metadata": {"k": "v"}})");
  const json chat = chat_of(r);
  EXPECT_EQ(chat["messages"], json::parse(R"([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(chat["max_tokens"], 7);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_FALSE(r.store);
  EXPECT_FALSE(r.stream);
  // The stored conversation leaves the instructions out (they are not carried over).
  EXPECT_EQ(r.conversation, json::parse(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["metadata"], json::parse(R"({"k": "v"})"));
}

TEST(ResponsesRequest, ItemsBecomeChatMessages) {
  const auto r = responses(R"({"input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "a"},
                                                           {"type": "input_text", "text": "b"}]},
      {"role": "user", "content": "weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "done", "annotations": []}]}]})",
                           json::parse(R"([{"role": "user", "content": "earlier"}])"));
  const json expected = json::parse(R"([
      {"role": "user", "content": "earlier"},
      {"role": "system", "content": "a\nb"},
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
          {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "one"},
      {"role": "tool", "tool_call_id": "c2", "content": "two"},
      {"role": "assistant", "content": "done"}])");
  EXPECT_EQ(chat_of(r)["messages"], expected);
  EXPECT_EQ(r.conversation, expected);
}

TEST(ResponsesRequest, ToolsTextFormatAndOrder) {
  // Schemas keep the client's property order ("z" before "a").
  const auto r = responses(R"({"input": "x",
      "tools": [{"type": "function", "name": "f", "description": "d", "strict": true,
                 "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "string"}}}}],
      "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
      "text": {"format": {"type": "json_schema", "name": "out",
                          "schema": {"type": "object", "properties": {"q": {}, "b": {}}}}}})");
  EXPECT_NE(r.chat_body_text.find(R"("properties":{"z":{"type":"string"},"a":)"), std::string::npos) << r.chat_body_text;
  EXPECT_NE(r.chat_body_text.find(R"("properties":{"q":{},"b":{}})"), std::string::npos) << r.chat_body_text;
  const json chat = chat_of(r);
  EXPECT_EQ(chat["tools"][0]["type"], "function");
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "f");
  EXPECT_EQ(chat["tools"][0]["function"]["description"], "d");
  EXPECT_EQ(chat["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "out");
  EXPECT_EQ(chat_of(responses(R"({"input": "x", "text": {"format": {"type": "json_object"}}})"))["response_format"],
            json::parse(R"({"type": "json_object"})"));
  EXPECT_FALSE(chat_of(responses(R"({"input": "x", "text": {"format": {"type": "text"}}})")).contains("response_format"));
  EXPECT_EQ(chat_of(responses(R"({"input": "x", "tool_choice": "required"})"))["tool_choice"], "required");
}

TEST(ResponsesRequest, RefusalsNameTheField) {
  auto bad = [](const std::string& raw) { return refusal([&] { responses(raw); }); };
  EXPECT_EQ(bad(R"({})"), "input: 'input' is required");
  EXPECT_EQ(bad(R"({"input": []})"), "input: 'input' must not be empty");
  EXPECT_EQ(bad(R"({"input": 3})"), "input: 'input' must be a string or a list of input items");
  EXPECT_NE(bad(R"({"input": [{"type": "item_reference", "id": "x"}]})").find("input: input[0]: items of type "
                                                                              "'item_reference' are not supported"),
            std::string::npos);
  EXPECT_NE(bad(R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})").find("'input_file'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"input": [{"role": "tool", "content": "x"}]})").find("input[0].role 'tool'"), std::string::npos);
  EXPECT_NE(bad(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})").find("'call_id'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})").find("'output'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"input": "x", "tools": [{"type": "web_search_preview"}]})")
                .find("tools: tools[0]: the built-in tool 'web_search_preview' is not supported"),
            std::string::npos);
  EXPECT_EQ(bad(R"({"input": "x", "tool_choice": {"type": "mcp"}})").substr(0, 12), "tool_choice:");
  EXPECT_EQ(bad(R"({"input": "x", "tool_choice": {"type": "function"}})").substr(0, 12), "tool_choice:");
  EXPECT_EQ(bad(R"({"input": "x", "text": {"format": {"type": "grammar"}}})").substr(0, 12), "text.format:");
  EXPECT_EQ(bad(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})").substr(0, 12), "text.format:");
  EXPECT_EQ(bad(R"({"input": "x", "previous_response_id": 5})").substr(0, 21), "previous_response_id:");
  EXPECT_EQ(bad(R"({"input": "x", "background": true})").substr(0, 11), "background:");
  EXPECT_EQ(bad(R"({"input": "x", "truncation": "auto"})").substr(0, 11), "truncation:");
  EXPECT_EQ(bad(R"({"input": "x", "store": "yes"})").substr(0, 6), "store:");
}

TEST(AnthropicRequest, MessagesAndBlocks) {
  const auto r = anthropic(R"({"max_tokens": 9, "system": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}],
      "stop_sequences": ["END"], "temperature": 0, "top_k": 3, "top_p": 0.5,
      "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                          {"type": "text", "text": "Let me see."},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                                     {"type": "tool_result", "tool_use_id": "t2", "is_error": true,
                                      "content": [{"type": "text", "text": "boom"}]},
                                     {"type": "text", "text": "thanks"}]}]})");
  const json chat = chat_of(r);
  EXPECT_EQ(chat["messages"], json::parse(R"([
      {"role": "system", "content": "s1\ns2"},
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "Let me see.", "tool_calls": [
          {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"city\":\"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
      {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
      {"role": "user", "content": "thanks"}])"));
  EXPECT_EQ(chat["max_tokens"], 9);
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["top_k"], 3);
  EXPECT_EQ(chat["top_p"], 0.5);
  EXPECT_EQ(chat["temperature"], 0);
}

TEST(AnthropicRequest, ToolsAndToolChoice) {
  const auto r = anthropic(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f", "description": "d",
                 "input_schema": {"type": "object", "properties": {"z": {}, "a": {}}}}],
      "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
      "thinking": {"type": "enabled", "budget_tokens": 1024}})");
  EXPECT_NE(r.chat_body_text.find(R"("parameters":{"type":"object","properties":{"z":{},"a":{}}})"),
            std::string::npos) << r.chat_body_text;
  const json chat = chat_of(r);
  EXPECT_EQ(chat["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["chat_template_kwargs"], json::parse(R"({"enable_thinking": true})"));
  auto choice = [](const std::string& tc) {
    return chat_of(anthropic(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": )" +
                             tc + "}"))["tool_choice"];
  };
  EXPECT_EQ(choice(R"({"type": "any"})"), "required");
  EXPECT_EQ(choice(R"({"type": "auto"})"), "auto");
  EXPECT_EQ(choice(R"({"type": "none"})"), "none");
  // thinking joins the template kwargs given as an extension
  EXPECT_EQ(chat_of(anthropic(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                                  "chat_template_kwargs": {"x": 1}, "thinking": {"type": "disabled"}, "seed": 5})")),
            json::parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "seed": 5,
                            "chat_template_kwargs": {"x": 1, "enable_thinking": false}})"));
}

TEST(AnthropicRequest, RefusalsNameTheField) {
  auto bad = [](const std::string& raw) { return refusal([&] { anthropic(raw); }); };
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(bad("{" + msgs + "}"), "max_tokens: 'max_tokens' is required");
  EXPECT_EQ(bad(R"({"max_tokens": 1})"), "messages: 'messages' is required");
  EXPECT_EQ(bad(R"({"max_tokens": 1, "messages": []})"), "messages: 'messages' must not be empty");
  EXPECT_NE(bad(R"({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})").find("'system'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]})")
                .find("messages: messages[0].content[0]: content blocks of type 'image' are not supported"),
            std::string::npos);
  EXPECT_NE(bad(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})").find("belong to assistant"),
            std::string::npos);
  EXPECT_NE(bad(R"({"max_tokens": 1, "messages": [{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]})").find(".input must be an object"),
            std::string::npos);
  EXPECT_EQ(bad(R"({"max_tokens": 1, "system": 5, )" + msgs + "}").substr(0, 7), "system:");
  EXPECT_NE(bad(R"({"max_tokens": 1, "tools": [{"type": "bash_20250124", "name": "bash"}], )" + msgs + "}")
                .find("tools: tools[0]: the server tool 'bash_20250124' is not supported"),
            std::string::npos);
  EXPECT_NE(bad(R"({"max_tokens": 1, "tools": [{"name": "f"}], )" + msgs + "}").find("'input_schema'"),
            std::string::npos);
  EXPECT_EQ(bad(R"({"max_tokens": 1, "tool_choice": "auto", )" + msgs + "}").substr(0, 12), "tool_choice:");
  EXPECT_EQ(bad(R"({"max_tokens": 1, "tool_choice": {"type": "tool"}, )" + msgs + "}").substr(0, 12),
            "tool_choice:");
  EXPECT_EQ(bad(R"({"max_tokens": 1, "stop_sequences": "x", )" + msgs + "}").substr(0, 15), "stop_sequences:");
  EXPECT_EQ(bad(R"({"max_tokens": 1, "thinking": {"type": "maybe"}, )" + msgs + "}").substr(0, 9), "thinking:");
  EXPECT_EQ(bad(R"({"max_tokens": 1, "mcp_servers": [], )" + msgs + "}").substr(0, 12), "mcp_servers:");
}

// Through parse_chat_request: the chat parser's errors come back in the client's words.
class ChatDialectTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
    m_.name = "stories";
    m_.tokenizer = tok_.get();
    m_.chat_template = std::make_shared<ChatTemplate>(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:");
    m_.vocab_size = tok_->vocab_size();
    m_.max_model_len = 512;
  }
  std::unique_ptr<Tokenizer> tok_;
  ServedModel m_;
};

TEST_F(ChatDialectTest, ErrorsAreRenamed) {
  auto responses_error = [&](const std::string& raw) {
    return refusal([&] { parse_responses_chat(responses(raw), m_); });
  };
  EXPECT_EQ(responses_error(R"({"input": "x", "max_output_tokens": 0})").substr(0, 38),
            "max_output_tokens: 'max_output_tokens'");
  EXPECT_EQ(responses_error(R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": 5}}}})")
                .substr(0, 12),
            "text.format:");
  EXPECT_NE(responses_error(R"({"input": "x", "tools": [{"type": "function", "name": "bad name"}]})")
                .find("tools[0].name must be"),
            std::string::npos);
  auto anthropic_error = [&](const std::string& raw) {
    return refusal([&] { parse_anthropic_chat(anthropic(raw), m_); });
  };
  EXPECT_EQ(anthropic_error(R"({"max_tokens": 1, "stop_sequences": [5], "messages": [{"role": "user", "content": "x"}]})")
                .substr(0, 15),
            "stop_sequences:");
  EXPECT_NE(anthropic_error(R"({"max_tokens": 1, "tools": [{"name": "f", "input_schema": {"type": 5}}],
                                "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]})")
                .find("tools[0] ('f'): input_schema"),
            std::string::npos);

  // A good one: the prompt is the chat template's rendering of the translated messages.
  const GenerationRequest g = parse_anthropic_chat(
      anthropic(R"({"max_tokens": 4, "system": "S", "messages": [{"role": "user", "content": "U"}]})"), m_);
  EXPECT_EQ(g.prompts.at(0).text, "system: S\nuser: U\nassistant:");
  EXPECT_EQ(g.params.max_tokens, 4);
  EXPECT_TRUE(g.max_tokens_given);
}

}  // namespace
}  // namespace pagellm::api
