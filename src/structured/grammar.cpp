#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "structured/grammar.h"
#include "structured/xgrammar_bridge.h"

namespace pagellm::structured {

// xgrammar's errors read "[12:00:00] /path/file.cc:123: message"; keep the message.
std::string clean_message(const std::string& what) {
  std::string m = what;
  if (!m.empty() && m[0] == '[') {
    const size_t close = m.find("] ");
    const size_t colon = close == std::string::npos ? close : m.find(": ", close + 2);
    if (colon != std::string::npos) m = m.substr(colon + 2);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

namespace {

using nlohmann::json;

// Keywords xgrammar 0.2.9 accepts but does not enforce (it only logs a
// warning): an output could then break the schema, so the request is refused.
constexpr const char* kIgnoredKeywords[] = {"not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                                            "uniqueItems", "contains", "minContains", "maxContains"};

void check_schema_keywords(const json& s, const std::string& path, const char* param) {
  if (!s.is_object()) return;
  for (const char* k : kIgnoredKeywords)
    if (s.contains(k))
      throw InvalidRequest(
          fmt::format("JSON schema keyword '{}' (at {}) is not supported by structured outputs", k, path), param);
  // xgrammar enforces allOf of one schema only (of several it allows any
  // value) and resolves only references into the schema itself.
  if (const auto all = s.find("allOf"); all != s.end() && all->is_array() && all->size() != 1)
    throw InvalidRequest(fmt::format("JSON schema keyword 'allOf' (at {}) is supported with exactly one schema; "
                                     "merge the schemas into one",
                                     path),
                         param);
  if (const auto ref = s.find("$ref"); ref != s.end() && ref->is_string()) {
    const std::string& uri = ref->get_ref<const std::string&>();
    if (uri.empty() || uri[0] != '#')
      throw InvalidRequest(fmt::format("JSON schema '$ref' '{}' (at {}) points outside the schema; only references "
                                       "within it ('#/...') are supported",
                                       uri.substr(0, 200), path),
                           param);
  }
  // No value satisfies an empty anyOf / oneOf / enum: nothing could be generated.
  for (const char* k : {"anyOf", "oneOf", "enum"})
    if (const auto v = s.find(k); v != s.end() && v->is_array() && v->empty())
      throw InvalidRequest(
          fmt::format("JSON schema keyword '{}' (at {}) is empty: no value satisfies the schema", k, path), param);
  if (s.contains("multipleOf")) {
    const json* type = s.contains("type") ? &s["type"] : nullptr;
    if (!(type && type->is_string() && *type == "integer"))
      throw InvalidRequest(
          fmt::format("JSON schema keyword 'multipleOf' (at {}) is supported for integers only", path), param);
  }
  for (const auto& [key, value] : s.items()) {
    const std::string sub = path + "/" + key;
    if (key == "properties" || key == "$defs" || key == "definitions" || key == "patternProperties") {
      if (value.is_object())
        for (const auto& [name, schema] : value.items()) check_schema_keywords(schema, sub + "/" + name, param);
    } else if (key == "items" || key == "additionalProperties" || key == "propertyNames" ||
               key == "unevaluatedProperties" || key == "unevaluatedItems") {
      check_schema_keywords(value, sub, param);
    } else if (key == "anyOf" || key == "oneOf" || key == "allOf" || key == "prefixItems") {
      if (value.is_array())
        for (size_t i = 0; i < value.size(); ++i) check_schema_keywords(value[i], fmt::format("{}/{}", sub, i), param);
    }
  }
}

std::vector<std::string> parse_choices(const std::string& spec, const char* param) {
  json j;
  try {
    j = json::parse(spec);
  } catch (const json::exception&) {
    throw InvalidRequest("'choice' must be a list of strings", param);
  }
  if (!j.is_array() || j.empty()) throw InvalidRequest("'choice' must be a non-empty list of strings", param);
  std::vector<std::string> out;
  for (const json& c : j) {
    if (!c.is_string()) throw InvalidRequest("'choice' must be a non-empty list of strings", param);
    out.push_back(c.get<std::string>());
  }
  return out;
}

const std::string kAnyObjectSchema = R"({"type": "object"})";

// Whitespace between JSON tokens is free but bounded: unbounded, a weak model
// can spend every remaining token on newlines (greedy decoding of a small
// model does). 8 is room for a newline and a few levels of indentation.
constexpr int kMaxWhitespaceRun = 8;

xgrammar::Grammar json_grammar(const std::string& schema, bool any_whitespace) {
  return xgrammar::Grammar::FromJSONSchema(schema, any_whitespace, std::nullopt, std::nullopt, /*strict_mode=*/true,
                                           any_whitespace ? std::optional<int>(kMaxWhitespaceRun) : std::nullopt);
}

// spec -> xgrammar grammar (no vocabulary); throws on any failure.
xgrammar::Grammar to_grammar(const StructuredOutputs& s, const char* param) {
  using Kind = StructuredOutputs::Kind;
  switch (s.kind) {
    case Kind::Json: {
      json schema;
      try {
        schema = json::parse(s.spec);
      } catch (const json::exception& e) {
        throw InvalidRequest(fmt::format("the JSON schema is not valid JSON: {}", e.what()), param);
      }
      if (!schema.is_object() && !schema.is_boolean())
        throw InvalidRequest("the JSON schema must be an object", param);
      check_schema_keywords(schema, "#", param);
      return json_grammar(s.spec, s.any_whitespace);
    }
    case Kind::JsonObject: return json_grammar(kAnyObjectSchema, s.any_whitespace);
    case Kind::Regex: return xgrammar::Grammar::FromRegex(s.spec);
    case Kind::Choice: return xgrammar::Grammar::FromEBNF(choice_grammar(parse_choices(s.spec, param)));
    case Kind::Grammar: return xgrammar::Grammar::FromEBNF(s.spec);
    case Kind::StructuralTag: {
      auto r = xgrammar::Grammar::FromStructuralTag(s.spec);
      if (auto* g = std::get_if<xgrammar::Grammar>(&r)) return *g;
      std::string msg;
      std::visit([&](const auto& e) { msg = e.what(); }, std::get<xgrammar::StructuralTagError>(r));
      throw InvalidRequest(fmt::format("invalid structural tag: {}", clean_message(msg)), param);
    }
    case Kind::None: break;
  }
  throw InvalidRequest("no structured output given", param);
}

}  // namespace

const char* kind_name(StructuredOutputs::Kind k) {
  switch (k) {
    case StructuredOutputs::Kind::Json:
    case StructuredOutputs::Kind::JsonObject: return "JSON schema";
    case StructuredOutputs::Kind::Regex: return "regex";
    case StructuredOutputs::Kind::Grammar: return "grammar";
    case StructuredOutputs::Kind::Choice: return "choice list";
    default: return "structural tag";
  }
}

xgrammar::Grammar to_xgrammar(const StructuredOutputs& s, const char* param) {
  try {
    return to_grammar(s, param);
  } catch (const InvalidRequest&) {
    throw;
  } catch (const std::exception& e) {
    throw InvalidRequest(fmt::format("invalid {}: {}", kind_name(s.kind), clean_message(e.what())), param);
  }
}

void validate(const StructuredOutputs& spec, const GrammarLimits& limits, const char* param) {
  if (!spec.active()) return;
  check_grammar_limits(spec, limits, param);
  (void)to_xgrammar(spec, param);
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) g += " | ";
    g += '"';
    for (unsigned char c : choices[i]) {
      if (c == '"' || c == '\\') {
        g += '\\';
        g += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7f) {
        g += fmt::format("\\x{:02x}", c);
      } else {
        g += static_cast<char>(c);
      }
    }
    g += '"';
  }
  return g;
}

// ---- GrammarMatcher

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;  // the matcher reads it
  xgrammar::GrammarMatcher matcher;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g) : grammar(std::move(g)), matcher(grammar->grammar) {}
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

bool GrammarMatcher::accept(int32_t token) { return impl_->matcher.AcceptToken(token); }

bool GrammarMatcher::fill_next_token_bitmask(int32_t* mask, int32_t vocab_size) {
  return fill_bitmask(impl_->matcher, mask, vocab_size);
}

bool fill_bitmask(xgrammar::GrammarMatcher& matcher, int32_t* mask, int32_t vocab_size) {
  int64_t shape[1] = {bitmask_words(vocab_size)};
  DLTensor t{};
  t.data = mask;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return matcher.FillNextTokenBitmask(&t);
}

bool GrammarMatcher::terminated() const { return impl_->matcher.IsTerminated(); }
bool GrammarMatcher::completed() const { return impl_->matcher.IsCompleted(); }
void GrammarMatcher::rollback(int32_t num_tokens) { impl_->matcher.Rollback(num_tokens); }

}  // namespace pagellm::structured
