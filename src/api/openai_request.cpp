#include "api/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "api/json_fields.h"
#include "api/request_params.h"
#include "api/structured_request.h"
#include "api/tool_request.h"
#include "api/utf8_check.h"
#include "chat/chat_template.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::api {
namespace {

using nlohmann::json;

void require_type(const json& body, const char* key, bool ok, const char* what) {
  if (has_field(body, key) && !ok) throw InvalidRequest(fmt::format("'{}' must be {}", key, what), key);
}

[[noreturn]] void unsupported(const char* param, const std::string& what) {
  throw InvalidRequest(fmt::format("{} is not supported by this server", what), param);
}

// Fields both endpoints share: types of the plain flags, features we lack.
void check_common(const json& body) {
  if (!body.is_object()) throw InvalidRequest("the request body must be a JSON object");
  require_type(body, "user", has_field(body, "user") && body["user"].is_string(), "a string");
}

void read_stream_options(const json& body, GenerationRequest& g) {
  g.stream = get_bool_field(body, "stream", false);
  if (!has_field(body, "stream_options")) return;
  const json& so = body["stream_options"];
  if (!so.is_object()) throw InvalidRequest("'stream_options' must be an object", "stream_options");
  if (!g.stream) throw InvalidRequest("'stream_options' is only allowed when 'stream' is true", "stream_options");
  g.include_usage = get_bool_field(so, "include_usage", false);
}

std::string flatten_content(const json& content, size_t index) {
  if (content.is_null()) return "";
  if (content.is_string()) {
    const std::string& s = content.get_ref<const std::string&>();
    require_valid_utf8(s, "messages");
    return s;
  }
  if (!content.is_array())
    throw InvalidRequest(fmt::format("messages[{}].content must be a string or a list of content parts", index),
                         "messages");
  std::string out;
  bool first = true;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw InvalidRequest(fmt::format("messages[{}].content parts must be objects with a 'type'", index), "messages");
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      throw InvalidRequest(
          fmt::format("messages[{}]: content parts of type '{}' are not supported (text only)", index, type),
          "messages");
    if (!part.contains("text") || !part["text"].is_string())
      throw InvalidRequest(fmt::format("messages[{}]: a text part needs a string 'text'", index), "messages");
    const std::string& text = part["text"].get_ref<const std::string&>();
    require_valid_utf8(text, "messages");
    if (!first) out += '\n';
    out += text;
    first = false;
  }
  return out;
}

// vLLM's truncate_prompt_tokens: keep the last k prompt tokens; -1 means the
// context length. 0 when absent.
int32_t read_truncate_prompt_tokens(const json& body, const ServedModel& m) {
  const char* key = "truncate_prompt_tokens";
  if (!has_field(body, key)) return 0;
  const auto k = static_cast<int32_t>(get_int_field(body, key, 0, -1, std::numeric_limits<int32_t>::max()));
  if (k == 0)
    throw InvalidRequest("'truncate_prompt_tokens' must be -1 (the context length) or at least 1, got 0", key);
  if (k > m.max_model_len)
    throw InvalidRequest(fmt::format("'truncate_prompt_tokens' is {}, more than this model's context length {}", k,
                                     m.max_model_len),
                         key);
  return k == -1 ? m.max_model_len : k;
}

void truncate_prompt(PromptInput& p, int32_t keep, const Tokenizer& tok) {
  if (keep <= 0 || p.ids.size() <= static_cast<size_t>(keep)) return;
  p.ids.erase(p.ids.begin(), p.ids.end() - keep);
  p.text = tok.decode(p.ids, false);  // echo shows what the model saw
}

std::string token_text_or_empty(const Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.vocab_size() ? tok.token_text(id) : std::string();
}

}  // namespace

bool ServedModel::answers_to(const std::string& model) const {
  return model == name || std::find(aliases.begin(), aliases.end(), model) != aliases.end();
}

std::string check_model_field(const json& body, const ServedModel& m) {
  if (!body.is_object() || !has_field(body, "model")) return "";
  const json& v = body["model"];
  if (!v.is_string()) throw InvalidRequest("'model' must be a string", "model");
  const std::string& model = v.get_ref<const std::string&>();
  if (m.answers_to(model)) return "";
  if (m.has_adapter && m.has_adapter(model)) return model;
  throw ModelNotFound(
      fmt::format("The model '{}' does not exist; this server serves '{}'", sanitize_utf8(model), m.name));
}

std::vector<PromptInput> parse_prompt_field(const json& prompt, const Tokenizer& tok, bool add_special,
                                            int32_t vocab_size, size_t max_prompts) {
  auto from_text = [&](const json& v) {
    PromptInput p;
    p.text = v.get<std::string>();
    require_valid_utf8(p.text, "prompt");
    p.ids = tok.encode(p.text, add_special, true);
    return p;
  };
  auto from_ids = [&](const json& v, const std::string& label) {
    PromptInput p;
    p.ids = json_to_token_ids(v, label, "prompt", vocab_size);
    p.text = tok.decode(p.ids, false);
    return p;
  };
  const char* shape = "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists";
  if (prompt.is_null()) throw InvalidRequest("'prompt' is required", "prompt");
  if (prompt.is_string()) return {from_text(prompt)};
  if (!prompt.is_array()) throw InvalidRequest(shape, "prompt");
  if (prompt.empty()) throw InvalidRequest("'prompt' must not be empty", "prompt");
  // A list of numbers is ONE prompt, however long: only batches count against max_prompts.
  const json& first = prompt.front();
  if (first.is_number()) return {from_ids(prompt, "prompt")};
  if (prompt.size() > max_prompts)
    throw InvalidRequest(fmt::format("'prompt' holds {} prompts; at most {} are allowed", prompt.size(), max_prompts),
                         "prompt");
  std::vector<PromptInput> out;
  out.reserve(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const json& item = prompt[i];
    if (item.is_string() && first.is_string())
      out.push_back(from_text(item));
    else if (item.is_array() && first.is_array())
      out.push_back(from_ids(item, fmt::format("prompt[{}]", i)));
    else
      throw InvalidRequest(shape, "prompt");
  }
  return out;
}

std::string render_chat_prompt(const json& body, const ServedModel& m, const json& tools) {
  if (!m.chat_template)
    throw InvalidRequest("this model has no chat template; give one with --chat-template FILE", "messages");
  if (!has_field(body, "messages")) throw InvalidRequest("'messages' is required", "messages");
  const json& messages = body["messages"];
  if (!messages.is_array()) throw InvalidRequest("'messages' must be a list of messages", "messages");
  if (messages.empty()) throw InvalidRequest("'messages' must not be empty", "messages");
  if (messages.size() > m.limits.max_messages)
    throw InvalidRequest(
        fmt::format("'messages' holds {} messages; at most {} are allowed", messages.size(), m.limits.max_messages),
        "messages");

  json normalized = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& msg = messages[i];
    if (!msg.is_object()) throw InvalidRequest(fmt::format("messages[{}] must be an object", i), "messages");
    if (!msg.contains("role") || !msg["role"].is_string() || msg["role"].get_ref<const std::string&>().empty())
      throw InvalidRequest(fmt::format("messages[{}] needs a 'role' string", i), "messages");
    require_valid_utf8(msg["role"].get_ref<const std::string&>(), "messages");
    json copy = msg;
    copy["content"] = flatten_content(msg.contains("content") ? msg["content"] : json(), i);
    if (copy.contains("tool_calls") && copy["tool_calls"].is_array())
      for (json& call : copy["tool_calls"])
        if (call.is_object() && call.contains("function") && call["function"].is_object() &&
            call["function"].contains("arguments") && call["function"]["arguments"].is_string()) {
          json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) call["function"]["arguments"] = std::move(args);
        }
    normalized.push_back(std::move(copy));
  }

  const bool continue_final = get_bool_field(body, "continue_final_message", false);
  if (continue_final && get_bool_field(body, "add_generation_prompt", false))
    throw InvalidRequest("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                         "continue_final_message");
  const bool add_generation_prompt = continue_final ? false : get_bool_field(body, "add_generation_prompt", true);
  json extra = json::object();
  if (has_field(body, "chat_template_kwargs")) {
    const json& kwargs = body["chat_template_kwargs"];
    if (!kwargs.is_object()) throw InvalidRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (kwargs.size() > m.limits.max_chat_template_kwargs)
      throw InvalidRequest(fmt::format("'chat_template_kwargs' holds {} keys; at most {} are allowed", kwargs.size(),
                                       m.limits.max_chat_template_kwargs),
                           "chat_template_kwargs");
    extra = kwargs;
  }
  if (!tools.is_null()) extra["tools"] = tools;

  const Tokenizer& tok = *m.tokenizer;
  std::string text;
  try {
    text = apply_chat_template(*m.chat_template, normalized, add_generation_prompt,
                               token_text_or_empty(tok, tok.bos_id()), token_text_or_empty(tok, tok.eos_id()), extra);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& e) {
    throw InvalidRequest(fmt::format("the chat template failed on these messages: {}", e.what()), "messages");
  }
  if (continue_final) {
    // The prompt ends inside the final message: cut what the template put after it.
    const std::string& last = normalized.back()["content"].get_ref<const std::string&>();
    const size_t at = last.empty() ? std::string::npos : text.rfind(last);
    if (at == std::string::npos)
      throw InvalidRequest("continue_final_message: the final message is empty or not found in the rendered prompt",
                           "continue_final_message");
    text.resize(at + last.size());
  }
  return text;
}

GenerationRequest parse_completion_request(const json& body, const ServedModel& m, std::string_view raw_body) {
  check_common(body);
  GenerationRequest g;
  g.chat = false;
  ParsedParams pp = parse_request_params(body, false, m.vocab_size, m.default_max_tokens, m.limits);
  g.params = pp.sampling;
  g.params.structured = parse_structured_outputs(body, m.limits.grammar, raw_body);
  g.priority = pp.priority;
  g.max_tokens_given = has_field(body, "max_tokens");
  read_stream_options(body, g);
  g.echo = get_bool_field(body, "echo", false);
  g.prompt_only = pp.prompt_only;
  g.prompt_logprobs = g.params.prompt_logprobs;
  if (g.echo && g.logprobs()) {
    g.echo_logprobs = true;
    g.params.prompt_logprobs = std::max(g.params.prompt_logprobs, g.params.logprobs);
  }
  if (has_field(body, "suffix")) {
    if (!body["suffix"].is_string()) throw InvalidRequest("'suffix' must be a string", "suffix");
    if (!body["suffix"].get_ref<const std::string&>().empty()) unsupported("suffix", "'suffix' (insertion)");
  }
  if (has_field(body, "best_of")) {
    const int64_t best_of = get_int_field(body, "best_of", 1, 1, m.limits.max_n);
    if (best_of != g.params.n) unsupported("best_of", fmt::format("'best_of' different from n ({})", g.params.n));
  }
  if (!body.contains("prompt")) throw InvalidRequest("'prompt' is required", "prompt");
  const int32_t truncate = read_truncate_prompt_tokens(body, m);
  g.prompts = parse_prompt_field(body["prompt"], *m.tokenizer, get_bool_field(body, "add_special_tokens", true),
                                 m.vocab_size, m.limits.max_prompts);
  for (PromptInput& p : g.prompts) truncate_prompt(p, truncate, *m.tokenizer);
  return g;
}

GenerationRequest parse_chat_request(const json& body, const ServedModel& m, std::string_view raw_body) {
  check_common(body);
  GenerationRequest g;
  g.chat = true;
  const ChatTools tools = parse_tools(body, {m.enable_auto_tool_choice, m.tool_parser, m.limits.grammar}, raw_body);
  // Chat's default max_tokens depends on the prompt; see to_engine_requests.
  ParsedParams pp =
      parse_request_params(body, true, m.vocab_size, std::max<int32_t>(1, m.max_model_len), m.limits);
  g.params = pp.sampling;
  g.params.structured = parse_structured_outputs(body, m.limits.grammar, raw_body);
  if (tools.grammar.active()) {
    if (g.params.structured.active())
      throw InvalidRequest("tool_choice required or named and a structured output both constrain the output; give "
                           "one", "tool_choice");
    g.params.structured = tools.grammar;
  }
  g.priority = pp.priority;
  g.max_tokens_given = has_field(body, "max_tokens") || has_field(body, "max_completion_tokens");
  read_stream_options(body, g);
  g.prompt_logprobs = g.params.prompt_logprobs;

  const int32_t truncate = read_truncate_prompt_tokens(body, m);
  PromptInput p;
  p.text = render_chat_prompt(body, m, tools.tools);
  g.output.reasoning = m.reasoning_parser;
  g.output.prompt_ends_in_think = chat::prompt_ends_in_think(p.text);
  g.output.tools = tools.mode;
  g.output.tool_parser = m.tool_parser;
  g.output.named_function = tools.named_function;
  p.ids = m.tokenizer->encode(p.text, get_bool_field(body, "add_special_tokens", false), true);
  truncate_prompt(p, truncate, *m.tokenizer);
  g.prompts.push_back(std::move(p));
  return g;
}

std::vector<EngineRequest> to_engine_requests(const GenerationRequest& g, const std::string& id, const ServedModel& m) {
  std::vector<EngineRequest> out;
  out.reserve(g.prompts.size());
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    EngineRequest r;
    r.id = g.prompts.size() == 1 ? id : fmt::format("{}-{}", id, i);
    r.prompt_ids = g.prompts[i].ids;
    r.params = g.params;
    r.priority = g.priority;
    r.lora = g.lora;
    if (!g.max_tokens_given) {
      const int64_t room = static_cast<int64_t>(m.max_model_len) - static_cast<int64_t>(r.prompt_ids.size());
      const int64_t want = g.chat ? room : std::min<int64_t>(m.default_max_tokens, room);
      // A prompt with no room left keeps 1 so that the engine reports the prompt length.
      r.params.max_tokens = static_cast<int32_t>(std::max<int64_t>(1, want));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pagellm::api
