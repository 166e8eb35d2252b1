#include "spec/spec_config.h"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_limits.h"

namespace pagellm {

namespace {

constexpr int32_t kMaxSpeculativeTokens = 16;
constexpr int32_t kMaxLookup = 64;

int32_t int_field(const nlohmann::json& j, const char* key, int32_t lo, int32_t hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer())
    fail("--speculative-config: \"{}\" must be an integer, got {}", key, v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) fail("--speculative-config: \"{}\" must be in [{}, {}], got {}", key, lo, hi, x);
  return static_cast<int32_t>(x);
}

}  // namespace

const char* to_string(SpecMethod m) {
  switch (m) {
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::DraftModel: return "draft_model";
    default: return "none";
  }
}

std::string SpeculativeConfig::describe() const {
  switch (method) {
    case SpecMethod::Ngram:
      return fmt::format("ngram speculation: {} tokens, lookup {}..{}", num_speculative_tokens, prompt_lookup_min,
                         prompt_lookup_max);
    case SpecMethod::DraftModel:
      return fmt::format("draft-model speculation: {} tokens from {}", num_speculative_tokens, model);
    default: return "no speculation";
  }
}

SpeculativeConfig parse_speculative_config(const std::string& json_text) {
  SpeculativeConfig c;
  if (json_text.empty()) return c;
  nlohmann::json j;
  try {
    j = parse_json_bounded(json_text, kConfigJsonLimits, "--speculative-config");
  } catch (const std::exception& e) {
    fail("--speculative-config is not valid JSON: {}", e.what());
  }
  if (!j.is_object()) fail("--speculative-config must be a JSON object, got {}", j.dump());
  static const char* const kKnown[] = {"method",           "model",        "num_speculative_tokens",
                                       "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size",
                                       "adaptive"};
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // a named reference: clang 14 cannot capture bindings
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; }) ==
        std::end(kKnown))
      fail("--speculative-config: unknown key \"{}\" (known: method, model, num_speculative_tokens, "
           "prompt_lookup_min, prompt_lookup_max, disable_by_batch_size, adaptive)",
           key);
  }
  std::string method;
  if (j.contains("method")) {
    if (!j["method"].is_string()) fail("--speculative-config: \"method\" must be a string");
    method = j["method"].get<std::string>();
  } else if (j.contains("model")) {
    method = "draft_model";  // vLLM infers a draft model from "model" alone
  } else {
    fail("--speculative-config needs \"method\": \"ngram\", or a draft \"model\"");
  }
  if (method == "ngram") {
    c.method = SpecMethod::Ngram;
    if (j.contains("model")) fail("--speculative-config: method \"ngram\" takes no \"model\"");
  } else if (method == "draft_model") {
    c.method = SpecMethod::DraftModel;
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
      fail("--speculative-config: method \"draft_model\" needs \"model\": a GGUF file or Hugging Face folder");
    c.model = j["model"].get<std::string>();
    for (const char* key : {"prompt_lookup_min", "prompt_lookup_max"})
      if (j.contains(key)) fail("--speculative-config: \"{}\" is for method \"ngram\"", key);
  } else {
    fail("--speculative-config: unknown method \"{}\" (ngram or draft_model)", method);
  }
  if (!j.contains("num_speculative_tokens"))
    fail("--speculative-config needs \"num_speculative_tokens\" (proposals per step, 1..{})", kMaxSpeculativeTokens);
  c.num_speculative_tokens = int_field(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  // One bound alone sets both (vLLM's rule).
  const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
  if (has_min) c.prompt_lookup_min = int_field(j, "prompt_lookup_min", 1, kMaxLookup);
  if (has_max) c.prompt_lookup_max = int_field(j, "prompt_lookup_max", 1, kMaxLookup);
  if (has_min && !has_max) c.prompt_lookup_max = c.prompt_lookup_min;
  if (has_max && !has_min) c.prompt_lookup_min = c.prompt_lookup_max;
  if (c.prompt_lookup_min > c.prompt_lookup_max)
    fail("--speculative-config: prompt_lookup_min ({}) must not exceed prompt_lookup_max ({})", c.prompt_lookup_min,
         c.prompt_lookup_max);
  if (j.contains("disable_by_batch_size"))
    c.disable_by_batch_size = int_field(j, "disable_by_batch_size", 1, 1 << 20);
  if (j.contains("adaptive")) {
    if (!j["adaptive"].is_boolean()) fail("--speculative-config: \"adaptive\" must be true or false");
    c.adaptive = j["adaptive"].get<bool>();
  }
  return c;
}

}  // namespace pagellm
