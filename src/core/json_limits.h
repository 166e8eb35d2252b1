// Bounded JSON parsing. nlohmann::json parses iteratively, but copying,
// dumping and comparing a DOM recurse once per nesting level, and its DOM costs
// up to ~40x the text ("[{},{},...]"). So every JSON input (request bodies,
// config files, tokenizer.json, safetensors headers) is first measured by a
// linear, non-recursive pre-scan and refused before nlohmann allocates anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace pagellm {

struct JsonLimits {
  size_t max_depth = 64;                        // open objects/arrays at once
  size_t max_elements = size_t{1} << 22;        // values: scalars, objects and arrays (keys not counted)
  size_t max_memory_bytes = size_t{256} << 20;  // estimated DOM size (see estimate_json_cost)
  size_t max_text_bytes = SIZE_MAX;             // the text itself
};

// HTTP request bodies. The HTTP layer already caps bodies (16 MiB by default),
// so the text is not limited here. 64 MiB of DOM holds any body of text (a
// 16 MiB prompt costs ~16 MiB) or 2M token ids, while a structure-heavy body
// (15 MB of "[{},{},...]" would take ~560 MB) is refused: a few dozen
// concurrent requests stay within a few GiB.
inline constexpr JsonLimits kRequestJsonLimits{64, size_t{1} << 21, size_t{64} << 20, SIZE_MAX};
// config.json, tokenizer_config.json, generation_config.json, safetensors
// headers and index files: real ones are at most a few MB.
inline constexpr JsonLimits kConfigJsonLimits{64, size_t{1} << 22, size_t{256} << 20, size_t{100} << 20};
// tokenizer.json: real ones are up to ~35 MB (Gemma 3, 262k tokens) and
// estimate at ~4x their text (Qwen 3: 11 MB, 606k elements, 47 MiB).
inline constexpr JsonLimits kTokenizerJsonLimits{64, size_t{1} << 25, size_t{1} << 30, size_t{512} << 20};

// What the pre-scan measured.
struct JsonCost {
  size_t depth = 0;         // deepest nesting of objects and arrays
  size_t elements = 0;      // values (scalars, objects, arrays), not keys
  size_t memory_bytes = 0;  // estimated heap + value bytes of the nlohmann::json DOM
};

// Measures text without limits (its stack is one bit per nesting level).
// Malformed text is measured as far as it goes; the parser reports it.
JsonCost estimate_json_cost(std::string_view text);

// Throws pagellm::Error "<what>: JSON nesting depth exceeds the limit of 64"
// (or element count, estimated memory, text size) at the first limit passed.
void check_json_limits(std::string_view text, const JsonLimits& limits, std::string_view what);

// check_json_limits, then nlohmann::json::parse. Malformed JSON throws
// pagellm::Error "<what> is not valid JSON: <nlohmann's message>".
nlohmann::json parse_json_bounded(std::string_view text, const JsonLimits& limits, std::string_view what);

// Reads and parses a file; refuses files over limits.max_text_bytes before
// reading them. Errors name the file ("'<path>'").
nlohmann::json read_json_file_bounded(const std::string& path, const JsonLimits& limits);
// The file's text, refused (by size) before it is read when over max_bytes.
std::string read_text_file_bounded(const std::string& path, size_t max_bytes);

}  // namespace pagellm
