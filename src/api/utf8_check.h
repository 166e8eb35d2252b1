// UTF-8 checks for client text (prompts, messages, stop strings) and clean-up
// of token pieces, which may hold part of a character, before they go into JSON.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pagellm::api {

// Byte offset of the first byte that does not start a valid UTF-8 sequence
// (stray continuation, overlong form, surrogate, > U+10FFFF, truncated), or
// nothing when all of `s` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Throws InvalidRequest (400) naming `param` and the byte offset when `s` is
// not valid UTF-8.
void require_valid_utf8(std::string_view s, const char* param);

// `s` with every invalid byte replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);

// Length in Unicode code points (invalid bytes count one each), like Python's
// len(str) of the decoded text: OpenAI's text_offset unit.
size_t utf8_length(std::string_view s);

}  // namespace pagellm::api
