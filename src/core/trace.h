// A Chrome-trace timeline (chrome://tracing, Perfetto): when enabled, scoped
// events (engine phases, backend ops) are recorded per thread and written as
// JSON at the end. When disabled a scope costs one relaxed load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace pagellm::trace {

void enable(bool on);
bool enabled();
// Writes every recorded event to `path` (Trace Event Format JSON).
void write(const std::string& path);
int64_t now_us();
// Records a complete event (the name is copied, up to 47 bytes; the category
// must be a string literal).
void record(const char* name, const char* category, int64_t start_us, int64_t dur_us);

class Scope {
 public:
  Scope(const char* name, const char* category) : name_(name), category_(category), start_(enabled() ? now_us() : -1) {}
  ~Scope() {
    if (start_ >= 0) record(name_, category_, start_, now_us() - start_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_;
};

}  // namespace pagellm::trace
