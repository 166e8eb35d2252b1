// Request body -> GenerationRequest -> EngineRequests, on the stories260K
// vocabulary (BOS 1; "Once upon a time" = 1 403 407 261 378).
#include "api/openai_request.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>

#include "chat/chat_template.h"
#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

const std::vector<int32_t> kOnceUpon = {1, 403, 407, 261, 378};

// A small template: <role>content</role> per message, then <assistant>.
constexpr const char* kTemplate =
    "{{ bos_token }}{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the first message must not be "
    "from the assistant') }}{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] "
    "}}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{% if shout %}!{% endif %}";

class OpenAIRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::shared_data("models/stories260K.gguf");
    REQUIRE_FILE(path);
    tok_ = Tokenizer::load(path);
    m_.name = "stories";
    m_.aliases = {"/models/stories.gguf"};
    m_.tokenizer = tok_.get();
    m_.chat_template = std::make_shared<ChatTemplate>(kTemplate);
    m_.vocab_size = tok_->vocab_size();
    m_.max_model_len = 512;
  }

  // The InvalidRequest param of parsing `body` (fails when it parses).
  std::string error_param(const json& body, bool chat = false) {
    try {
      if (chat)
        parse_chat_request(body, m_);
      else
        parse_completion_request(body, m_);
    } catch (const InvalidRequest& e) {
      return e.param().empty() ? "<none>" : e.param();
    }
    ADD_FAILURE() << "parsed: " << body;
    return "";
  }

  std::unique_ptr<Tokenizer> tok_;
  ServedModel m_;
};

TEST_F(OpenAIRequestTest, PromptShapes) {
  auto one = parse_prompt_field("Once upon a time", *tok_, true, m_.vocab_size);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].ids, kOnceUpon);
  EXPECT_EQ(one[0].text, "Once upon a time");
  EXPECT_EQ(parse_prompt_field("Once upon a time", *tok_, false, m_.vocab_size)[0].ids,
            std::vector<int32_t>(kOnceUpon.begin() + 1, kOnceUpon.end()));

  auto batch = parse_prompt_field(json::array({"Once upon a time", "Hi"}), *tok_, true, m_.vocab_size);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].ids, kOnceUpon);
  EXPECT_EQ(batch[1].text, "Hi");

  auto ids = parse_prompt_field(json(kOnceUpon), *tok_, true, m_.vocab_size);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0].ids, kOnceUpon);  // ids are taken as they are (no second BOS)
  EXPECT_EQ(ids[0].text, tok_->decode(kOnceUpon, false));

  auto id_batch = parse_prompt_field(json::array({json(kOnceUpon), json::array({5, 6})}), *tok_, true, m_.vocab_size);
  ASSERT_EQ(id_batch.size(), 2u);
  EXPECT_EQ(id_batch[1].ids, (std::vector<int32_t>{5, 6}));

  for (const json& bad :
       {json(5), json::array(), json::array({json::array({1}), "x"}), json::array({1, "x"}), json::array({512}),
        json::array({-1}), json::array({1.5}), json::object(), json(nullptr), json("caf\xc3")})
    EXPECT_THROW(parse_prompt_field(bad, *tok_, true, m_.vocab_size), InvalidRequest) << bad;
}

TEST_F(OpenAIRequestTest, PromptLogprobsAndEcho) {
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 3}};
  auto with = [&](std::initializer_list<std::pair<const char*, json>> fields) {
    json b = base;
    for (const auto& [k, v] : fields) b[k] = v;
    return b;
  };
  // vLLM's prompt_logprobs: the engine computes k; the reply shows them.
  GenerationRequest g = parse_completion_request(with({{"prompt_logprobs", 2}}), m_);
  EXPECT_EQ(g.params.prompt_logprobs, 2);
  EXPECT_EQ(g.prompt_logprobs, 2);
  EXPECT_FALSE(g.echo_logprobs);
  // OpenAI's echo with logprobs: the prompt's logprobs with the same k.
  g = parse_completion_request(with({{"echo", true}, {"logprobs", 3}}), m_);
  EXPECT_TRUE(g.echo_logprobs);
  EXPECT_EQ(g.params.prompt_logprobs, 3);
  EXPECT_EQ(g.prompt_logprobs, -1);
  EXPECT_FALSE(g.prompt_only);
  // Both: the engine computes the larger k.
  g = parse_completion_request(with({{"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 4}}), m_);
  EXPECT_EQ(g.params.prompt_logprobs, 4);
  EXPECT_EQ(g.prompt_logprobs, 4);
  // max_tokens 0 with echo: the prompt alone (the engine samples one token, unseen).
  g = parse_completion_request(with({{"echo", true}, {"logprobs", 1}, {"max_tokens", 0}}), m_);
  EXPECT_TRUE(g.prompt_only);
  EXPECT_EQ(g.params.max_tokens, 1);
  EXPECT_EQ(error_param(with({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(error_param(with({{"echo", true}, {"max_tokens", -1}})), "max_tokens");
  // Streamed too.
  EXPECT_NO_THROW(parse_completion_request(with({{"prompt_logprobs", 1}, {"stream", true}}), m_));
  EXPECT_NO_THROW(parse_completion_request(with({{"echo", true}, {"logprobs", 1}, {"stream", true}}), m_));
  // Chat: prompt_logprobs too.
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"prompt_logprobs", 0}};
  g = parse_chat_request(chat, m_);
  EXPECT_EQ(g.params.prompt_logprobs, 0);
  EXPECT_EQ(g.prompt_logprobs, 0);
}

TEST_F(OpenAIRequestTest, CompletionRequest) {
  const json body = {{"model", "stories"},
                     {"prompt", "Once upon a time"},
                     {"max_tokens", 7},
                     {"temperature", 0.5},
                     {"top_p", 0.9},
                     {"n", 3},
                     {"stop", {"."}},
                     {"seed", 42},
                     {"logprobs", 2},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"top_k", 5},
                     {"priority", -1},
                     {"ignore_eos", true},
                     {"user", "u"},
                     {"some_unknown_field", {1, 2}}};
  const GenerationRequest g = parse_completion_request(body, m_);
  EXPECT_FALSE(g.chat);
  ASSERT_EQ(g.prompts.size(), 1u);
  EXPECT_EQ(g.prompts[0].ids, kOnceUpon);
  EXPECT_EQ(g.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(g.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.params.top_p, 0.9f);
  EXPECT_EQ(g.params.n, 3);
  EXPECT_EQ(g.params.stop, std::vector<std::string>{"."});
  EXPECT_EQ(g.params.seed, 42u);
  EXPECT_EQ(g.params.logprobs, 2);
  EXPECT_TRUE(g.logprobs());
  EXPECT_EQ(g.params.top_k, 5);
  EXPECT_TRUE(g.params.ignore_eos);
  EXPECT_EQ(g.priority, -1);
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.include_usage);
  EXPECT_TRUE(g.max_tokens_given);
  EXPECT_FALSE(g.echo);

  const auto reqs = to_engine_requests(g, "cmpl-x", m_);
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].id, "cmpl-x");
  EXPECT_EQ(reqs[0].prompt_ids, kOnceUpon);
  EXPECT_EQ(reqs[0].params.n, 3);
  EXPECT_EQ(reqs[0].priority, -1);
}

TEST_F(OpenAIRequestTest, DefaultMaxTokensAndBatchIds) {
  GenerationRequest g = parse_completion_request({{"prompt", {"Once upon a time", "Hi"}}}, m_);
  EXPECT_FALSE(g.max_tokens_given);
  auto reqs = to_engine_requests(g, "cmpl-y", m_);
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].id, "cmpl-y-0");
  EXPECT_EQ(reqs[1].id, "cmpl-y-1");
  EXPECT_EQ(reqs[0].params.max_tokens, 16);  // OpenAI's completions default
  // ... but no more than the context has room for.
  std::vector<int32_t> long_prompt(500, 5);
  g = parse_completion_request({{"prompt", long_prompt}}, m_);
  EXPECT_EQ(to_engine_requests(g, "c", m_)[0].params.max_tokens, 12);
  // Chat: all the room left.
  g = parse_chat_request({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, m_);
  reqs = to_engine_requests(g, "chatcmpl-z", m_);
  EXPECT_EQ(reqs[0].params.max_tokens, 512 - static_cast<int32_t>(reqs[0].prompt_ids.size()));
  // Explicit values stay (the engine reports what does not fit).
  g = parse_chat_request({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_completion_tokens", 600}}, m_);
  EXPECT_EQ(to_engine_requests(g, "c", m_)[0].params.max_tokens, 600);
}

TEST_F(OpenAIRequestTest, CompletionErrorsNameTheField) {
  const json ok = {{"prompt", "x"}, {"max_tokens", 4}};
  auto with = [&](const char* k, const json& v) {
    json b = ok;
    b[k] = v;
    return b;
  };
  EXPECT_EQ(error_param({{"max_tokens", 4}}), "prompt");
  EXPECT_EQ(error_param(with("temperature", -1)), "temperature");
  EXPECT_EQ(error_param(with("top_p", 0)), "top_p");
  EXPECT_EQ(error_param(with("n", 0)), "n");
  EXPECT_EQ(error_param(with("max_tokens", 0)), "max_tokens");
  EXPECT_EQ(error_param(with("stream", "yes")), "stream");
  EXPECT_EQ(error_param(with("stream_options", {{"include_usage", true}})), "stream_options");
  EXPECT_EQ(error_param(with("echo", 1)), "echo");
  EXPECT_EQ(error_param(with("best_of", 2)), "best_of");
  EXPECT_EQ(error_param(with("suffix", "tail")), "suffix");
  EXPECT_EQ(error_param(with("response_format", {{"type", "yaml"}})), "response_format");
  EXPECT_EQ(error_param(with("guided_regex", "(a+")), "guided_regex");
  EXPECT_EQ(error_param(with("guided_json", {{"type", "array"}, {"uniqueItems", true}})), "guided_json");
  EXPECT_EQ(error_param(with("user", 5)), "user");
  EXPECT_EQ(error_param(with("prompt_logprobs", -1)), "prompt_logprobs");
  EXPECT_EQ(error_param(with("prompt_logprobs", 21)), "prompt_logprobs");
  EXPECT_EQ(error_param(with("prompt_logprobs", "2")), "prompt_logprobs");
  EXPECT_EQ(error_param(json::array({1})), "<none>");
  // Accepted: best_of == n, empty suffix, text response_format.
  json fine = with("best_of", 1);
  fine["suffix"] = "";
  fine["response_format"] = {{"type", "text"}};
  EXPECT_NO_THROW(parse_completion_request(fine, m_));
}

TEST_F(OpenAIRequestTest, StructuredOutputFields) {
  using Kind = StructuredOutputs::Kind;
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  auto parsed = [&](const json& fields) {
    json body = {{"prompt", "x"}, {"max_tokens", 4}};
    body.update(fields);
    return parse_completion_request(body, m_).params.structured;
  };
  EXPECT_FALSE(parsed(json::object()).active());
  EXPECT_FALSE(parsed({{"response_format", {{"type", "text"}}}}).active());
  EXPECT_EQ(parsed({{"response_format", {{"type", "json_object"}}}}).kind, Kind::JsonObject);
  const StructuredOutputs js = parsed({{"response_format", {{"type", "json_schema"},
                                                            {"json_schema", {{"name", "n"}, {"schema", schema},
                                                                             {"strict", true}}}}}});
  EXPECT_EQ(js.kind, Kind::Json);
  EXPECT_EQ(json::parse(js.spec), schema);
  EXPECT_EQ(parsed({{"guided_json", schema.dump()}}).spec, schema.dump());
  EXPECT_EQ(parsed({{"structured_outputs", {{"regex", "[0-9]+"}}}}).kind, Kind::Regex);
  EXPECT_EQ(parsed({{"guided_choice", {"a", "b"}}}).spec, R"(["a","b"])");
  EXPECT_EQ(parsed({{"structured_outputs", {{"grammar", "root ::= \"x\""}}}}).kind, Kind::Grammar);
  EXPECT_FALSE(parsed({{"structured_outputs", {{"json", schema}, {"disable_any_whitespace", true}}}}).any_whitespace);
  EXPECT_EQ(parsed({{"guided_regex", "a"}, {"guided_decoding_backend", "xgrammar"}}).kind, Kind::Regex);
  EXPECT_THROW(parsed({{"guided_regex", "a"}, {"guided_choice", {"a"}}}), InvalidRequest);
  EXPECT_THROW(parsed({{"structured_outputs", {{"regex", "a"}, {"json_object", true}}}}), InvalidRequest);
  EXPECT_THROW(parsed({{"guided_json", 5}}), InvalidRequest);

  // With the raw text, a schema keeps its property order (json sorts keys).
  const std::string raw = R"({"prompt": "x", "max_tokens": 4, "zzz": {"q": 1},
      "response_format": {"type": "json_schema", "json_schema": {"name": "n",
        "schema": {"type": "object", "properties": {"zebra": {"type": "string"}, "apple": {"type": "integer"}}}}}})";
  const StructuredOutputs ordered = parse_completion_request(json::parse(raw), m_, raw).params.structured;
  EXPECT_LT(ordered.spec.find("zebra"), ordered.spec.find("apple")) << ordered.spec;
  const std::string raw2 = R"({"prompt": "x", "guided_json": {"properties": {"b": {}, "a": {}}}})";
  const StructuredOutputs g2 = parse_completion_request(json::parse(raw2), m_, raw2).params.structured;
  EXPECT_EQ(g2.spec, R"({"properties":{"b":{},"a":{}}})");
}

TEST_F(OpenAIRequestTest, ModelField) {
  EXPECT_NO_THROW(check_model_field(json::object(), m_));
  EXPECT_NO_THROW(check_model_field({{"model", nullptr}}, m_));
  EXPECT_NO_THROW(check_model_field({{"model", "stories"}}, m_));
  EXPECT_NO_THROW(check_model_field({{"model", "/models/stories.gguf"}}, m_));
  try {
    check_model_field({{"model", "gpt-4"}}, m_);
    FAIL();
  } catch (const ModelNotFound& e) {
    EXPECT_EQ(e.param(), "model");
  }
  EXPECT_THROW(check_model_field({{"model", 5}}, m_), InvalidRequest);
}

TEST_F(OpenAIRequestTest, ToolChoiceGrammarsKeepParameterOrder) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"zebra": {"type": "string"}, "apple": {"type": "integer"}}}}}])";
  const std::string named = R"({"messages": [{"role": "user", "content": "hi"}], )" + tools +
                            R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})";
  const GenerationRequest n = parse_chat_request(json::parse(named), m_, named);
  EXPECT_EQ(n.output.tools, chat::ToolMode::Named);
  EXPECT_EQ(n.output.named_function, "f");
  EXPECT_LT(n.params.structured.spec.find("zebra"), n.params.structured.spec.find("apple")) << n.params.structured.spec;
  EXPECT_FALSE(n.params.structured.any_whitespace);
  const std::string required =
      R"({"messages": [{"role": "user", "content": "hi"}], )" + tools + R"(, "tool_choice": "required"})";
  const GenerationRequest r = parse_chat_request(json::parse(required), m_, required);
  EXPECT_EQ(r.output.tools, chat::ToolMode::Required);
  EXPECT_LT(r.params.structured.spec.find("zebra"), r.params.structured.spec.find("apple")) << r.params.structured.spec;
  // auto needs the server's tool-call parser
  const std::string automatic = R"({"messages": [{"role": "user", "content": "hi"}], )" + tools + "}";
  EXPECT_THROW(parse_chat_request(json::parse(automatic), m_, automatic), InvalidRequest);
}

TEST_F(OpenAIRequestTest, ChatRendering) {
  const json body = {{"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "user"},
                        {"content", {{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "there"}}}}}}}};
  EXPECT_EQ(render_chat_prompt(body, m_), "<s><system>Be brief.</system><user>Hello\nthere</user><assistant>");
  json no_gen = body;
  no_gen["add_generation_prompt"] = false;
  no_gen["chat_template_kwargs"] = {{"shout", true}};
  EXPECT_EQ(render_chat_prompt(no_gen, m_), "<s><system>Be brief.</system><user>Hello\nthere</user>!");

  const json cont = {
      {"messages", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Once upon"}}}},
      {"continue_final_message", true}};
  EXPECT_EQ(render_chat_prompt(cont, m_), "<s><user>Hi</user><assistant>Once upon");

  const GenerationRequest g = parse_chat_request(body, m_);
  EXPECT_TRUE(g.chat);
  ASSERT_EQ(g.prompts.size(), 1u);
  // The template's "<s>" text is parsed as the BOS token, and no second BOS is added.
  EXPECT_EQ(g.prompts[0].ids.front(), 1);
  EXPECT_NE(g.prompts[0].ids[1], 1);
  EXPECT_EQ(g.prompts[0].ids, tok_->encode(g.prompts[0].text, false, true));
}

TEST_F(OpenAIRequestTest, ChatErrors) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  auto chat_param = [&](json body) { return error_param(body, true); };
  EXPECT_EQ(chat_param(json::object()), "messages");
  EXPECT_EQ(chat_param({{"messages", "hi"}}), "messages");
  EXPECT_EQ(chat_param({{"messages", json::array()}}), "messages");
  EXPECT_EQ(chat_param({{"messages", {{{"content", "no role"}}}}}), "messages");
  EXPECT_EQ(chat_param({{"messages", {{{"role", "user"}, {"content", 5}}}}}), "messages");
  EXPECT_EQ(chat_param({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}), "messages");
  EXPECT_EQ(chat_param({{"messages", {{{"role", "user"}, {"content", "caf\xc3"}}}}}), "messages");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"tools", {{{"type", "function"}}}}}), "tools");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"tool_choice", "required"}}), "tool_choice");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"functions", json::array()}}), "functions");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"top_logprobs", 2}}), "top_logprobs");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"max_completion_tokens", 0}}), "max_completion_tokens");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"continue_final_message", true}, {"add_generation_prompt", true}}),
            "continue_final_message");
  EXPECT_EQ(chat_param({{"messages", {user}}, {"chat_template_kwargs", 3}}), "chat_template_kwargs");
  // Empty tools and tool_choice "none" are fine.
  EXPECT_NO_THROW(parse_chat_request({{"messages", {user}}, {"tools", json::array()}, {"tool_choice", "none"}}, m_));
  // The template's raise_exception reaches the caller as TemplateError (400 with its message).
  EXPECT_THROW(parse_chat_request({{"messages", {{{"role", "assistant"}, {"content", "x"}}}}}, m_), TemplateError);
  // No template at all.
  m_.chat_template = nullptr;
  EXPECT_EQ(chat_param({{"messages", {user}}}), "messages");
}

TEST_F(OpenAIRequestTest, ChatLogprobs) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  GenerationRequest g = parse_chat_request({{"messages", {user}}, {"logprobs", true}, {"top_logprobs", 3}}, m_);
  EXPECT_EQ(g.params.logprobs, 3);
  g = parse_chat_request({{"messages", {user}}, {"logprobs", true}}, m_);
  EXPECT_EQ(g.params.logprobs, 0);
  g = parse_chat_request({{"messages", {user}}}, m_);
  EXPECT_FALSE(g.logprobs());
}

// The InvalidRequest message of parsing `body` ("" when it parses).
std::string error_message(const json& body, const ServedModel& m, bool chat = false) {
  try {
    if (chat)
      parse_chat_request(body, m);
    else
      parse_completion_request(body, m);
  } catch (const InvalidRequest& e) {
    return e.what();
  }
  return "";
}

TEST_F(OpenAIRequestTest, OneTokenIdPromptOfAnyLengthIsOnePrompt) {
  // Longer than the batch limit (1024): still one prompt; the context bounds it later (engine: 400 on prompt).
  const std::vector<int32_t> ids(2000, 5);
  const GenerationRequest g = parse_completion_request({{"prompt", ids}, {"max_tokens", 1}}, m_);
  ASSERT_EQ(g.prompts.size(), 1u);
  EXPECT_EQ(g.prompts[0].ids.size(), 2000u);
  EXPECT_EQ(parse_prompt_field(json(std::vector<int32_t>(1025, 5)), *tok_, true, m_.vocab_size).size(), 1u);
  // Batches are what the limit counts.
  const json batch_1025(std::vector<std::string>(1025, "Hi"));
  EXPECT_NE(error_message({{"prompt", batch_1025}}, m_).find("'prompt' holds 1025 prompts; at most 1024"),
            std::string::npos);
  EXPECT_EQ(parse_prompt_field(json(std::vector<std::string>(1024, "Hi")), *tok_, true, m_.vocab_size).size(), 1024u);
  const json id_batch_1025(std::vector<std::vector<int32_t>>(1025, {5}));
  EXPECT_EQ(error_param({{"prompt", id_batch_1025}}), "prompt");
}

TEST_F(OpenAIRequestTest, PromptTokenIdsAreExact) {
  const json u64max = std::numeric_limits<uint64_t>::max();
  for (const json& bad : {json::array({1, uint64_t{4294967298}}), json::array({u64max}),
                          json::array({std::numeric_limits<int64_t>::min()}), json::array({m_.vocab_size}),
                          json::array({json::array({1}), json::array({1, uint64_t{4294967298}})}),
                          json::array({1, true}), json::array({1, nullptr}), json::array({2.5})}) {
    SCOPED_TRACE(bad.dump());
    EXPECT_EQ(error_param({{"prompt", bad}}), "prompt");
  }
  const std::string msg = error_message({{"prompt", json::array({1, uint64_t{4294967298}})}}, m_);
  EXPECT_NE(msg.find("'prompt[1]'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 4294967298"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("[0, {}]", m_.vocab_size - 1)), std::string::npos) << msg;
  EXPECT_NE(error_message({{"prompt", json::array({json::array({1}), json::array({1, u64max})})}}, m_)
                .find("'prompt[1][1]'"),
            std::string::npos);
  // Integral floats are ids, as pydantic reads them.
  EXPECT_EQ(parse_prompt_field(json::array({1.0, 403}), *tok_, true, m_.vocab_size)[0].ids,
            (std::vector<int32_t>{1, 403}));
}

TEST_F(OpenAIRequestTest, IntegerFieldsOfTheEndpoints) {
  const json u64max = std::numeric_limits<uint64_t>::max();
  const json ok = {{"prompt", "x"}, {"max_tokens", 4}};
  auto with = [&](const char* k, const json& v) {
    json b = ok;
    b[k] = v;
    return b;
  };
  EXPECT_EQ(error_param(with("best_of", u64max)), "best_of");
  EXPECT_EQ(error_param(with("best_of", 0)), "best_of");
  EXPECT_EQ(error_param(with("best_of", 1.5)), "best_of");
  EXPECT_NO_THROW(parse_completion_request(with("best_of", 1.0), m_));
  EXPECT_EQ(error_param(with("max_tokens", u64max)), "max_tokens");
  EXPECT_EQ(error_param(with("max_tokens", -1)), "max_tokens");  // not "absent"
  EXPECT_EQ(error_param(with("stop_token_ids", json::array({uint64_t{4294967298}}))), "stop_token_ids");
  EXPECT_EQ(error_param(with("top_k", u64max)), "top_k");
  EXPECT_EQ(error_param(with("priority", u64max)), "priority");
  for (const char* key : {" 5", "+5", "05"}) EXPECT_EQ(error_param(with("logit_bias", {{key, 1}})), "logit_bias");
  EXPECT_EQ(error_param(with("echo", 1)), "echo");
  EXPECT_EQ(error_param(with("add_special_tokens", "no")), "add_special_tokens");
  json so = with("stream", true);
  so["stream_options"] = {{"include_usage", 1}};
  EXPECT_EQ(error_param(so), "include_usage");

  const json user = {{"role", "user"}, {"content", "hi"}};
  EXPECT_EQ(error_param({{"messages", {user}}, {"logprobs", true}, {"top_logprobs", -1}}, true), "top_logprobs");
  EXPECT_EQ(error_param({{"messages", {user}}, {"logprobs", 1}}, true), "logprobs");
  EXPECT_EQ(error_param({{"messages", {user}}, {"max_completion_tokens", u64max}}, true), "max_completion_tokens");
  EXPECT_EQ(error_param({{"messages", {user}}, {"n", uint64_t{4294967298}}}, true), "n");
}

TEST_F(OpenAIRequestTest, TruncatePromptTokens) {
  GenerationRequest g = parse_completion_request({{"prompt", "Once upon a time"}, {"truncate_prompt_tokens", 2}}, m_);
  EXPECT_EQ(g.prompts[0].ids, (std::vector<int32_t>{261, 378}));
  EXPECT_EQ(g.prompts[0].text, tok_->decode({261, 378}, false));
  g = parse_completion_request({{"prompt", "Once upon a time"}, {"truncate_prompt_tokens", 100}}, m_);
  EXPECT_EQ(g.prompts[0].ids, kOnceUpon);
  g = parse_completion_request({{"prompt", std::vector<int32_t>(600, 5)}, {"truncate_prompt_tokens", -1}}, m_);
  EXPECT_EQ(g.prompts[0].ids.size(), 512u);  // -1: the context length
  for (const json& bad : {json(0), json(-2), json(513), json(std::numeric_limits<uint64_t>::max()), json(1.5),
                          json("5")}) {
    SCOPED_TRACE(bad.dump());
    EXPECT_EQ(error_param({{"prompt", "x"}, {"truncate_prompt_tokens", bad}}), "truncate_prompt_tokens");
  }
  const json user = {{"role", "user"}, {"content", "hi"}};
  g = parse_chat_request({{"messages", {user}}, {"truncate_prompt_tokens", 3}}, m_);
  EXPECT_EQ(g.prompts[0].ids.size(), 3u);
}

TEST_F(OpenAIRequestTest, ChatCountsAreBounded) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  json kwargs = json::object();
  for (int i = 0; i < 1024; ++i) kwargs[fmt::format("k{}", i)] = i;
  EXPECT_NO_THROW(parse_chat_request({{"messages", {user}}, {"chat_template_kwargs", kwargs}}, m_));
  kwargs["one_more"] = true;
  const json too_many = {{"messages", {user}}, {"chat_template_kwargs", kwargs}};
  EXPECT_EQ(error_param(too_many, true), "chat_template_kwargs");
  EXPECT_NE(error_message(too_many, m_, true).find("1025 keys; at most 1024"), std::string::npos);

  m_.limits.max_messages = 3;
  EXPECT_NO_THROW(parse_chat_request({{"messages", {user, user, user}}}, m_));
  EXPECT_EQ(error_param({{"messages", {user, user, user, user}}}, true), "messages");
  EXPECT_NE(error_message({{"messages", {user, user, user, user}}}, m_, true).find("4 messages; at most 3"),
            std::string::npos);
  EXPECT_EQ(RequestLimits{}.max_messages, 10000u);
}

}  // namespace
}  // namespace pagellm::api
