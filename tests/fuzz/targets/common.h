// What the fuzz target bodies share: a scratch file for parsers that read
// paths, the rule for which exceptions are clean refusals, and invariant
// checks that turn a silent contract violation into a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "core/error.h"

namespace pagellm::fuzz {

// A private directory under $TMPDIR (removed at exit) whose files are
// rewritten per input: the GGUF, safetensors and tokenizer.json readers take
// paths (mmap, ifstream), not memory.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // Replaces `name` in the directory with these bytes; returns its path.
  std::string write(const std::string& name, const uint8_t* data, size_t size) const;

 private:
  std::string path_;
};

// PAGELLM_FUZZ_STRICT=1: only pagellm::Error is a clean refusal, so that
// std::exceptions the caller happens to catch (std::invalid_argument from
// stoll, vector::reserve's length_error, ...) show up as findings too.
bool strict();

enum class Refusal {
  Error,         // only pagellm::Error: the function promises nothing else
  AnyException,  // also std::exception: the caller (CLI, server) turns it into a message
};

// Runs f; returns false when it refused the input (threw an accepted exception).
template <class F>
bool refused(Refusal accept, F&& f) {
  try {
    f();
    return false;
  } catch (const Error&) {
    return true;
  } catch (const std::exception&) {
    if (accept == Refusal::Error || strict()) throw;
    return true;
  }
}

// Prints the broken invariant and aborts: libFuzzer saves the input.
[[noreturn]] void invariant_failed(const char* what, const char* file, int line);

}  // namespace pagellm::fuzz

#define FUZZ_INVARIANT(cond) \
  do {                       \
    if (!(cond)) ::pagellm::fuzz::invariant_failed(#cond, __FILE__, __LINE__); \
  } while (0)
