#include "core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace pagellm::trace {
namespace {

struct Event {
  char name[48];  // copied: a weight's name may not outlive the trace
  const char* category;
  int64_t start, dur;
  uint64_t tid;
};

std::atomic<bool> g_enabled{false};
std::mutex g_mu;
std::vector<Event> g_events;  // appended under g_mu by each thread's flush

// Per-thread buffer, flushed into g_events when full and at write().
struct ThreadBuffer {
  std::vector<Event> events;
  uint64_t tid;
  ThreadBuffer() : tid(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000) {
    std::lock_guard<std::mutex> lock(g_mu);
    buffers().push_back(this);
  }
  ~ThreadBuffer() {
    std::lock_guard<std::mutex> lock(g_mu);
    g_events.insert(g_events.end(), events.begin(), events.end());
    auto& b = buffers();
    b.erase(std::remove(b.begin(), b.end(), this), b.end());
  }
  static std::vector<ThreadBuffer*>& buffers() {
    static std::vector<ThreadBuffer*> all;
    return all;
  }
};

ThreadBuffer& local() {
  thread_local ThreadBuffer buffer;
  return buffer;
}

}  // namespace

void enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(const char* name, const char* category, int64_t start_us, int64_t dur_us) {
  ThreadBuffer& b = local();
  Event e{{}, category, start_us, dur_us, b.tid};
  std::strncpy(e.name, name, sizeof(e.name) - 1);
  b.events.push_back(e);
  if (b.events.size() >= 4096) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_events.insert(g_events.end(), b.events.begin(), b.events.end());
    b.events.clear();
  }
}

void write(const std::string& path) {
  std::vector<Event> all;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (ThreadBuffer* b : ThreadBuffer::buffers()) {
      g_events.insert(g_events.end(), b->events.begin(), b->events.end());
      b->events.clear();
    }
    all = g_events;
  }
  std::ofstream out(path);
  PAGELLM_CHECK(out.good(), "cannot write trace file '{}'", path);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  for (const Event& e : all) {
    out << (first ? "" : ",") << "\n{\"name\":\"" << e.name << "\",\"cat\":\"" << e.category
        << "\",\"ph\":\"X\",\"ts\":" << e.start << ",\"dur\":" << e.dur << ",\"pid\":1,\"tid\":" << e.tid << "}";
    first = false;
  }
  out << "\n]}\n";
  PAGELLM_CHECK(out.good(), "error writing trace file '{}'", path);
}

}  // namespace pagellm::trace
