#include "server/shutdown_signals.h"

#include <pthread.h>
#include <signal.h>

namespace pagellm::server {
namespace {

sigset_t shutdown_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void ShutdownSignals::block() {
  sigset_t set = shutdown_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

ShutdownSignals::ShutdownSignals(std::function<void(int, int)> on_signal) : on_signal_(std::move(on_signal)) {
  block();
  thread_ = std::thread([this] { watch(); });
}

ShutdownSignals::~ShutdownSignals() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exiting_ = true;
  }
  // A thread-directed SIGTERM ends the watcher's sigwait.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

void ShutdownSignals::watch() {
  const sigset_t set = shutdown_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    int count = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (exiting_) return;
      if (count_ == 0) first_signal_ = sig;
      count = ++count_;
    }
    if (on_signal_) on_signal_(sig, count);
    cv_.notify_all();
  }
}

int ShutdownSignals::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return count_ > 0 || stop_requested_; });
  return first_signal_;
}

void ShutdownSignals::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
}

int ShutdownSignals::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

}  // namespace pagellm::server
