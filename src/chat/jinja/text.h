// UTF-8 text with Python `str` semantics: lengths, indices and slices count
// code points, whitespace is str.isspace(), case mapping follows str.lower() /
// str.upper() for the scripts listed in text.cpp. Templates index, slice and
// strip message text, so these must agree with Python for non-ASCII input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::jinja::text {

// Decodes the code point at s[i] and advances i. A malformed byte decodes as
// itself (U+0080..U+00FF) so that no input is lost.
char32_t next_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
std::u32string to_u32(std::string_view s);
std::string to_utf8(std::u32string_view s);

bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // code points

// Python's str.isspace() (also what `\s` and str.strip() use).
bool is_space(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);    // str.isdigit for the decimal digits we know
bool is_alnum(char32_t c) ;
bool is_cased(char32_t c);    // has an upper/lower case form
bool is_lower_cp(char32_t c);
bool is_upper_cp(char32_t c);
bool is_word(char32_t c);     // regex \w
bool is_printable(char32_t c);  // str.isprintable(), for repr()
bool is_linebreak(char32_t c);  // str.splitlines() separators

// Case mapping of one code point; may expand (e.g. 'ß'.upper() == "SS").
void append_lower(std::u32string& out, char32_t c);
void append_upper(std::u32string& out, char32_t c);

std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string swapcase(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize()
std::string title(std::string_view s);       // str.title()

// str.strip/lstrip/rstrip; chars == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

// str.split(sep, maxsplit) / str.rsplit; sep == nullptr splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// Stops after max_parts + 1 lines, so that callers bounding the count never build more.
std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_parts = SIZE_MAX);

// str.replace(old, new, count); count < 0 replaces all.
std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count);

// Python index arithmetic on code points. Byte offset of code point `cp_index`
// (clamped to the string).
size_t byte_offset(std::string_view s, size_t cp_index);
std::string substr_cp(std::string_view s, size_t cp_begin, size_t cp_end);

// Python repr() of a string: quotes chosen like CPython, escapes for
// backslash, quote, \t \n \r and non-printable code points.
std::string py_repr(std::string_view s);

// HTML escaping as markupsafe.escape: & < > " '.
std::string html_escape(std::string_view s);

}  // namespace pagellm::jinja::text
