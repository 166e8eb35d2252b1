#include "chat/chat_template.h"

#include <utility>
#include <vector>

#include "chat/jinja/interpreter.h"

namespace pagellm {

namespace {

// JSON -> template values, keeping object key order as the JSON type has it.
// Recursion stops at kMaxDepth levels (a few hundred small frames), before
// deeper input could exhaust the stack.
template <class Json>
jinja::Value to_value(const Json& j, uint32_t depth) {
  using jinja::Value;
  if (depth > jinja::kMaxDepth)
    fail("chat template context nests deeper than the limit of {} levels", jinja::kMaxDepth);
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return Value::number(j.template get<double>());
    case Json::value_t::string: return Value::string(j.template get_ref<const std::string&>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(to_value(x, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        items.emplace_back(Value::string(it.key()), to_value(it.value(), depth + 1));
      return Value::dict(std::move(items), true);
    }
    case Json::value_t::binary:
    case Json::value_t::discarded: break;
  }
  fail("chat template context holds an unsupported JSON value");
}

template <class Json>
jinja::Value context_value(const Json& context) {
  if (!context.is_object()) fail("chat template context must be a JSON object, got {}", context.type_name());
  return to_value(context, 1);
}

// The variables transformers passes (messages, tools, documents,
// add_generation_prompt, the special tokens), then `extra`'s, which override
// them. Built straight from the request's JSON: merging into a JSON object
// first would copy it recursively, and ordered_json inserts in linear time.
template <class Json>
jinja::Value chat_context(const Json& messages, bool add_generation_prompt, const std::string& bos_token,
                          const std::string& eos_token, const Json& extra) {
  using jinja::Value;
  if (!messages.is_array()) fail("chat messages must be a JSON array, got {}", messages.type_name());
  if (!extra.is_object() && !extra.is_null()) fail("extra chat template variables must be a JSON object");
  std::vector<std::pair<Value, Value>> items;
  items.reserve(6 + (extra.is_object() ? extra.size() : 0));
  items.emplace_back(Value::string("messages"), to_value(messages, 2));
  items.emplace_back(Value::string("tools"), Value::none());
  items.emplace_back(Value::string("documents"), Value::none());
  items.emplace_back(Value::string("add_generation_prompt"), Value::boolean(add_generation_prompt));
  items.emplace_back(Value::string("bos_token"), Value::string(bos_token));
  items.emplace_back(Value::string("eos_token"), Value::string(eos_token));
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it)
      items.emplace_back(Value::string(it.key()), to_value(it.value(), 2));
  return Value::dict(std::move(items));  // a repeated key: the later value wins
}

template <class Json>
bool deeper_than(const Json& root, size_t max_depth) {
  // Depth-first with an explicit stack of (container, depth).
  std::vector<std::pair<const Json*, size_t>> stack;
  stack.emplace_back(&root, 1);
  while (!stack.empty()) {
    const auto [j, d] = stack.back();
    stack.pop_back();
    if (!j->is_array() && !j->is_object()) continue;
    if (d > max_depth) return true;
    for (const auto& child : *j)
      if (child.is_array() || child.is_object()) stack.emplace_back(&child, d + 1);
  }
  return false;
}

// google/gemma-3-*-it (e.g. gemma-3-270m-it, gemma-3-4b-it) tokenizer_config.json
// "chat_template", https://huggingface.co/google/gemma-3-4b-it (model data,
// reproduced exactly; Gemma terms of use).
constexpr const char* kGemma3Template =
    R"TPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)TPL";

}  // namespace

ChatTemplate::ChatTemplate(std::string source, const ChatTemplateLimits& limits)
    : source_(std::move(source)), limits_(limits), tmpl_(std::make_shared<jinja::Template>(source_, limits_)) {}

ChatRenderOptions ChatTemplate::default_options() const {
  ChatRenderOptions o;
  o.limits = limits_;
  return o;
}

std::string ChatTemplate::render(const nlohmann::json& context) const { return render(context, default_options()); }

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, default_options());
}

std::string ChatTemplate::render(const nlohmann::json& context, const ChatRenderOptions& options) const {
  return tmpl_->render(context_value(context), options);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const ChatRenderOptions& options) const {
  return tmpl_->render(context_value(context), options);
}

std::string apply_chat_template(const ChatTemplate& t, const nlohmann::json& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token,
                                const nlohmann::json& extra) {
  return apply_chat_template(t, messages, add_generation_prompt, bos_token, eos_token, extra, t.default_options());
}

std::string apply_chat_template(const ChatTemplate& t, const nlohmann::json& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token,
                                const nlohmann::json& extra, const ChatRenderOptions& options) {
  return t.compiled().render(chat_context(messages, add_generation_prompt, bos_token, eos_token, extra), options);
}

std::string apply_chat_template(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const std::string& bos_token,
                                const std::string& eos_token, const nlohmann::ordered_json& extra) {
  return apply_chat_template(t, messages, add_generation_prompt, bos_token, eos_token, extra, t.default_options());
}

std::string apply_chat_template(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const std::string& bos_token,
                                const std::string& eos_token, const nlohmann::ordered_json& extra,
                                const ChatRenderOptions& options) {
  return t.compiled().render(chat_context(messages, add_generation_prompt, bos_token, eos_token, extra), options);
}

bool json_deeper_than(const nlohmann::json& j, size_t max_depth) { return deeper_than(j, max_depth); }
bool json_deeper_than(const nlohmann::ordered_json& j, size_t max_depth) { return deeper_than(j, max_depth); }

const char* builtin_chat_template(const std::string& arch) {
  if (arch == "gemma3") return kGemma3Template;
  return nullptr;
}

}  // namespace pagellm
