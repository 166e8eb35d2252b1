#include "core/json_limits.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/util.h"

namespace pagellm {
namespace {

// The DOM cost model (nlohmann::json 3.11 over libstdc++ and glibc malloc,
// 64-bit). A value is 16 bytes; heap blocks cost heap(n) = max(32, round16(n + 8)).
//   object:           +heap(sizeof std::map = 48)     = 64
//   array:            +heap(sizeof std::vector = 24)  = 32
//   object member:    one map node, heap(32 rb-node + 32 key + 16 value) = 96
//   array element:    2 x 16 (a vector grown by doubling holds up to 2x its size)
//   root value:       16
//   string value:     +heap(sizeof std::string = 32)  = 48, +heap(len + 1) past 15 chars
//   key:              +heap(len + 1) past 15 chars (SSO)
// String lengths are the raw text's, escapes included: an upper bound of the
// decoded length. tests/unit/core/json_limits_test.cpp compares the estimate
// with mallinfo2 for several shapes.
constexpr size_t kValueBytes = 16;
constexpr size_t kObjectBytes = 64;
constexpr size_t kArrayBytes = 32;
constexpr size_t kMemberBytes = 96;
constexpr size_t kElementBytes = 2 * kValueBytes;
constexpr size_t kStringBytes = 48;
constexpr size_t kSsoCapacity = 15;

constexpr size_t heap_block(size_t n) { return n + 8 <= 32 ? 32 : (n + 8 + 15) / 16 * 16; }
size_t string_heap(size_t len) { return len > kSsoCapacity ? heap_block(len + 1) : 0; }

// Ends a number or literal token.
bool is_delimiter(char c) { return std::string_view(" \t\n\r,:[]{}\"").find(c) != std::string_view::npos; }

// One pass over the text. With `limits`, throws at the first limit passed, so
// its stack never exceeds max_depth; without, measures everything.
JsonCost scan(std::string_view text, const JsonLimits* limits, std::string_view what) {
  JsonCost cost;
  std::vector<bool> in_object;  // one entry per open container: object (true) or array
  bool expect_key = false;      // inside an object, the next string is a key
  size_t i = 0;
  auto add = [&](size_t bytes) {
    cost.memory_bytes += bytes;
    ++cost.elements;
    if (!limits) return;
    if (cost.elements > limits->max_elements)
      fail("{}: JSON element count exceeds the limit of {} (at byte {})", what, limits->max_elements, i);
    if (cost.memory_bytes > limits->max_memory_bytes)
      fail("{}: JSON estimated memory exceeds the limit of {} bytes ({}) (at byte {})", what, limits->max_memory_bytes,
           format_bytes(static_cast<int64_t>(limits->max_memory_bytes)), i);
  };
  // What a new value costs in its parent.
  auto slot = [&]() {
    if (in_object.empty()) return kValueBytes;
    return in_object.back() ? kMemberBytes : kElementBytes;
  };
  auto open = [&](bool object, size_t own_bytes) {
    add(slot() + own_bytes);
    in_object.push_back(object);
    cost.depth = std::max(cost.depth, in_object.size());
    if (limits && in_object.size() > limits->max_depth)
      fail("{}: JSON nesting depth exceeds the limit of {} (at byte {})", what, limits->max_depth, i);
    expect_key = object;
  };

  const size_t n = text.size();
  for (; i < n; ++i) {
    const char c = text[i];
    switch (c) {
      case ' ':
      case '\t':
      case '\n':
      case '\r':
        break;
      case '{':
        open(true, kObjectBytes);
        break;
      case '[':
        open(false, kArrayBytes);
        break;
      case '}':
      case ']':
        if (!in_object.empty()) in_object.pop_back();
        expect_key = false;
        break;
      case ',':
        expect_key = !in_object.empty() && in_object.back();
        break;
      case ':':
        expect_key = false;
        break;
      case '"': {
        size_t j = i + 1;
        while (j < n && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
        const size_t len = std::min(j, n) - (i + 1);
        if (expect_key && !in_object.empty() && in_object.back()) {
          cost.memory_bytes += string_heap(len);  // the member itself is counted with its value
          expect_key = false;
        } else {
          add(slot() + kStringBytes + string_heap(len));
        }
        i = std::min(j, n);
        break;
      }
      default:  // number, true, false, null (or garbage the parser will reject)
        add(slot());
        while (i + 1 < n && !is_delimiter(text[i + 1])) ++i;
        break;
    }
  }
  return cost;
}

}  // namespace

JsonCost estimate_json_cost(std::string_view text) { return scan(text, nullptr, ""); }

void check_json_limits(std::string_view text, const JsonLimits& limits, std::string_view what) {
  if (text.size() > limits.max_text_bytes)
    fail("{}: JSON text of {} bytes exceeds the limit of {} bytes", what, text.size(), limits.max_text_bytes);
  scan(text, &limits, what);
}

nlohmann::json parse_json_bounded(std::string_view text, const JsonLimits& limits, std::string_view what) {
  check_json_limits(text, limits, what);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON: {}", what, e.what());
  }
}

std::string read_text_file_bounded(const std::string& path, size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot read '{}': {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("'{}' is not a regular file", path);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) fail("'{}': file of {} bytes exceeds the limit of {} bytes", path, size, max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '{}'", path);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  // A file that shrank while being read keeps what was there.
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

nlohmann::json read_json_file_bounded(const std::string& path, const JsonLimits& limits) {
  const std::string what = "'" + path + "'";
  return parse_json_bounded(read_text_file_bounded(path, limits.max_text_bytes), limits, what);
}

}  // namespace pagellm
