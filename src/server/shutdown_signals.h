// SIGINT / SIGTERM for a graceful shutdown, with no work in a signal handler:
// block() masks them in the calling thread before any other thread starts
// (threads inherit the mask), and a watcher thread takes them with sigwait()
// and wakes whoever waits. `on_signal(signal, count)` runs on the watcher
// thread for every signal (count 1, 2, ...), e.g. to exit at once on a second.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace pagellm::server {

class ShutdownSignals {
 public:
  // Masks SIGINT and SIGTERM in the calling thread (and so in threads it starts later).
  static void block();

  explicit ShutdownSignals(std::function<void(int signal, int count)> on_signal = {});
  ~ShutdownSignals();

  // Blocks until the first signal (returns its number) or request_stop() (returns 0).
  int wait();
  // Wakes wait() without a signal (e.g. the HTTP listener died).
  void request_stop();
  int received() const;

 private:
  void watch();

  std::function<void(int, int)> on_signal_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int first_signal_ = 0;
  int count_ = 0;
  bool stop_requested_ = false;
  bool exiting_ = false;
  std::thread thread_;
};

}  // namespace pagellm::server
