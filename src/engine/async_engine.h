// AsyncEngine: the Engine's step loop on its own thread. Any thread may submit
// requests and read their output streams; abort from any thread frees the
// request's KV blocks within one step. Idle for half a second after work, the
// loop frees the engine's per-step buffers and gives free heap back to the OS.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/request_limits.h"
#include "core/error.h"
#include "engine/engine.h"

namespace pagellm {

// Submission refused because too much is waiting (HTTP 503): the request may
// succeed later.
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

// The outputs of many requests in one queue, in the order the engine produced
// them: one waiter serves a whole batch (the Python package's LLM.generate) or
// every request of a client (the C API's poll), instead of one wait per request.
class OutputQueue {
 public:
  // The next output of any request routed here, or nothing when `timeout`
  // passes first.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  size_t size() const;

 private:
  friend class RequestStream;
  void push(RequestOutput out);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
};

// The outputs of one request, in order; the last has finished == true. A
// stream submitted with an OutputQueue forwards every output there instead.
class RequestStream {
 public:
  const std::string& id() const { return id_; }
  // The next output, or nothing when `timeout` passes first. After the final
  // output it returns nothing at once.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  bool finished() const;

 private:
  friend class AsyncEngine;
  RequestStream(std::string id, std::shared_ptr<OutputQueue> sink) : id_(std::move(id)), sink_(std::move(sink)) {}
  void push(RequestOutput out);

  std::string id_;
  std::shared_ptr<OutputQueue> sink_;  // null: outputs wait in queue_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool done_ = false;       // the final output was pushed
  bool delivered_ = false;  // ... and taken
};

// Admission limits; defaults in core/request_limits.h. A request (a group of prompts
// submitted together) is waiting from submit() until each of its prompts has
// delivered its first output. One group may hold at most
// max_sequences_per_request sequences (prompts x n; capped at
// max_waiting_sequences), so that no single request can fill the queue.
struct AsyncEngineOptions {
  size_t max_waiting_requests = RequestLimits{}.max_waiting_requests;
  size_t max_waiting_sequences = RequestLimits{}.max_waiting_sequences;
  size_t max_sequences_per_request = RequestLimits{}.max_sequences_per_request;
};

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options = {});
  ~AsyncEngine();  // shutdown(0): aborts whatever is left

  // Checks the requests on the caller's thread (InvalidRequest, also for a
  // group over max_sequences_per_request), then queues all of them, or none:
  // throws QueueFull when the waiting limits have no room for the whole group,
  // ShuttingDown when the engine no longer accepts work. The streams are in the
  // order of `reqs`. With a `sink`, their outputs go there (the streams then
  // only say when each request finished).
  std::vector<std::shared_ptr<RequestStream>> submit_group(std::vector<EngineRequest> reqs,
                                                           std::shared_ptr<OutputQueue> sink = nullptr);
  std::shared_ptr<RequestStream> submit(EngineRequest req, std::shared_ptr<OutputQueue> sink = nullptr);
  void abort(const std::string& id);
  // Stops accepting, lets in-flight requests finish for up to `grace`, then
  // aborts the rest and stops the loop. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  bool accepting() const;

  // Read-only views, safe from any thread (immutable after construction).
  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  const ModelConfig& model_config() const { return engine_->model_config(); }
  int32_t max_model_len() const { return engine_->max_model_len(); }
  const PoolingSpec& pooling() const { return engine_->pooling(); }
  const std::string& pooling_error() const { return engine_->pooling_error(); }
  const ScoreModel* score_model() const { return engine_->score_model(); }
  const std::string& score_error() const { return engine_->score_error(); }
  ServeTask task() const { return engine_->task(); }
  KvEventLog* kv_events() const { return engine_->kv_events(); }  // null unless --kv-events
  bool lora_enabled() const { return lora_enabled_; }
  // The served LoRA adapters as of the last step or run_on_step_thread call.
  std::vector<LoraInfo> loras() const;
  std::string describe() const { return description_; }
  // Snapshot taken after every step.
  EngineStats stats() const;
  size_t num_in_flight() const;
  // Admission counters now (see AsyncEngineOptions).
  size_t num_waiting_requests() const;
  size_t num_waiting_sequences() const;
  // Ends every open request with an error output now, without the step
  // thread (which may be blocked for good: a parallel job that lost a rank).
  // Returns their ids.
  std::vector<std::string> fail_open_requests(const std::string& message);
  // Runs fn on the step thread between two steps (what only that thread may
  // touch: the engine's LoRA registry) and waits for it; rethrows what it
  // throws, ShuttingDown once the loop has stopped. stats() is current when
  // it returns.
  void run_on_step_thread(const std::function<void(Engine&)>& fn);

 private:
  // What admission counts for one submitted request (one prompt).
  struct Admission {
    uint64_t group = 0;
    size_t sequences = 0;  // its n
    bool waiting = true;   // no output yet
  };

  void loop();
  void run_calls();
  void fail_all(const std::string& message);
  // Under mu_: the request delivered an output, so it no longer waits.
  void started_locked(const std::string& id);

  std::unique_ptr<Engine> engine_;  // touched only by the loop thread after start
  AsyncEngineOptions options_;
  std::string description_;
  bool lora_enabled_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineRequest> incoming_;
  std::vector<std::string> aborts_;
  std::deque<std::pair<std::function<void(Engine&)>, std::shared_ptr<std::promise<void>>>> calls_;
  bool loop_done_ = false;
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams_;
  std::unordered_map<std::string, Admission> admitted_;    // same keys as streams_
  std::unordered_map<uint64_t, size_t> group_waiting_;     // group -> its requests still waiting
  uint64_t next_group_ = 1;
  size_t waiting_sequences_ = 0;
  bool accepting_ = true;
  bool stop_ = false;
  std::optional<std::chrono::steady_clock::time_point> drain_deadline_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace pagellm
