// AsyncEngine: the Engine's step loop on its own thread. Any thread may submit
// requests and read their output streams; abort from any thread frees the
// request's KV blocks within one step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"

namespace pagellm {

// Submission refused because too many requests are waiting (HTTP 503).
class QueueFull : public Error {
 public:
  using Error::Error;
};
// Submission refused because the engine is shutting down (HTTP 503).
class ShuttingDown : public Error {
 public:
  using Error::Error;
};

class AsyncEngine;

// The outputs of one request, in order; the last has finished == true.
class RequestStream {
 public:
  const std::string& id() const { return id_; }
  // The next output, or nothing when `timeout` passes first. After the final
  // output it returns nothing at once.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  bool finished() const;

 private:
  friend class AsyncEngine;
  explicit RequestStream(std::string id) : id_(std::move(id)) {}
  void push(RequestOutput out);

  std::string id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool done_ = false;       // the final output was pushed
  bool delivered_ = false;  // ... and taken
};

struct AsyncEngineOptions {
  size_t max_waiting_requests = 1024;  // queued + waiting in the scheduler
};

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options = {});
  ~AsyncEngine();  // shutdown(0): aborts whatever is left

  // Checks the request on the caller's thread (InvalidRequest), then queues
  // it. Throws QueueFull or ShuttingDown when it cannot be taken.
  std::shared_ptr<RequestStream> submit(EngineRequest req);
  void abort(const std::string& id);
  // Stops accepting, lets in-flight requests finish for up to `grace`, then
  // aborts the rest and stops the loop. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  bool accepting() const;

  // Read-only views, safe from any thread (immutable after construction).
  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  const ModelConfig& model_config() const { return engine_->model_config(); }
  int32_t max_model_len() const { return engine_->max_model_len(); }
  std::string describe() const { return description_; }
  // Snapshot taken after every step.
  EngineStats stats() const;
  size_t num_in_flight() const;

 private:
  void loop();
  void fail_all(const std::string& message);

  std::unique_ptr<Engine> engine_;  // touched only by the loop thread after start
  AsyncEngineOptions options_;
  std::string description_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineRequest> incoming_;
  std::vector<std::string> aborts_;
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams_;
  bool accepting_ = true;
  bool stop_ = false;
  std::optional<std::chrono::steady_clock::time_point> drain_deadline_;
  int64_t scheduler_waiting_ = 0;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace pagellm
