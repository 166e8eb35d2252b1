#include "engine/async_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_set>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pagellm {

namespace {

// How long the engine must stay idle before its free heap goes back to the
// OS: back-to-back requests should not pay for a trim between each other.
constexpr std::chrono::milliseconds kTrimWhenIdleFor{500};

// glibc keeps the pages a burst freed (per-sequence state, the step buffers
// released before) in its arenas until asked to give them back; other C
// libraries: nothing to do.
void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

std::optional<RequestOutput> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || (done_ && queue_.empty()); })) return std::nullopt;
  if (queue_.empty()) return std::nullopt;  // finished and drained
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  if (out.finished) delivered_ = true;
  return out;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}

void RequestStream::push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = out.finished;
    if (!sink_) queue_.push_back(std::move(out));
    else delivered_ = done_;
  }
  if (sink_) sink_->push(std::move(out));
  else cv_.notify_all();
}

std::optional<RequestOutput> OutputQueue::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

size_t OutputQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void OutputQueue::push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(out));
  }
  cv_.notify_all();
}

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options)
    : engine_(std::move(engine)), options_(options), description_(engine_->describe()) {
  stats_ = engine_->stats();
  lora_enabled_ = engine_->lora() != nullptr;
  thread_ = std::thread([this] { loop(); });
}

std::vector<LoraInfo> AsyncEngine::loras() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.loras;
}

AsyncEngine::~AsyncEngine() { shutdown(std::chrono::milliseconds(0)); }

std::vector<std::shared_ptr<RequestStream>> AsyncEngine::submit_group(std::vector<EngineRequest> reqs,
                                                                      std::shared_ptr<OutputQueue> sink) {
  if (reqs.empty()) throw InvalidRequest("a request needs at least one prompt", "prompt");
  size_t sequences = 0;
  for (const EngineRequest& r : reqs) {
    engine_->validate_params(r);  // const, thread-safe
    sequences += static_cast<size_t>(r.params.n);
  }
  // One request must leave room for others, and a group that can never fit is a 400, not an endless 503.
  const size_t cap = std::min(options_.max_sequences_per_request, options_.max_waiting_sequences);
  if (sequences > cap)
    throw InvalidRequest(fmt::format("the request asks for {} sequences ({} prompts x n = {}); at most {} are "
                                     "allowed per request ({})",
                                     sequences, reqs.size(), reqs.front().params.n, cap,
                                     cap == options_.max_sequences_per_request ? "--max-sequences-per-request"
                                                                               : "--max-waiting-sequences"),
                         reqs.front().params.n > 1 ? "n" : "prompt");
  std::vector<std::shared_ptr<RequestStream>> out;
  out.reserve(reqs.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) throw ShuttingDown("the server is shutting down");
    std::unordered_set<std::string> ids;
    for (const EngineRequest& r : reqs)
      if (streams_.count(r.id) || !ids.insert(r.id).second)
        throw InvalidRequest(fmt::format("duplicate request id '{}'", r.id));
    if (group_waiting_.size() + 1 > options_.max_waiting_requests ||
        waiting_sequences_ + sequences > options_.max_waiting_sequences)
      throw QueueFull(fmt::format("the server is busy ({} requests with {} sequences waiting; the limits are {} "
                                  "requests and {} sequences); try again later",
                                  group_waiting_.size(), waiting_sequences_, options_.max_waiting_requests,
                                  options_.max_waiting_sequences));
    const uint64_t group = next_group_++;
    group_waiting_[group] = reqs.size();
    waiting_sequences_ += sequences;
    for (EngineRequest& r : reqs) {
      std::shared_ptr<RequestStream> stream(new RequestStream(r.id, sink));
      streams_[r.id] = stream;
      admitted_[r.id] = Admission{group, static_cast<size_t>(r.params.n), true};
      out.push_back(std::move(stream));
      incoming_.push_back(std::move(r));
    }
  }
  cv_.notify_all();
  return out;
}

std::shared_ptr<RequestStream> AsyncEngine::submit(EngineRequest req, std::shared_ptr<OutputQueue> sink) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(req));
  return submit_group(std::move(one), std::move(sink)).front();
}

void AsyncEngine::started_locked(const std::string& id) {
  auto it = admitted_.find(id);
  if (it == admitted_.end() || !it->second.waiting) return;
  it->second.waiting = false;
  waiting_sequences_ -= it->second.sequences;
  auto g = group_waiting_.find(it->second.group);
  if (g != group_waiting_.end() && --g->second == 0) group_waiting_.erase(g);
}

size_t AsyncEngine::num_waiting_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return group_waiting_.size();
}

size_t AsyncEngine::num_waiting_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_sequences_;
}

void AsyncEngine::abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);
  }
  cv_.notify_all();
}

bool AsyncEngine::accepting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepting_;
}

EngineStats AsyncEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  s.grammars = engine_->grammar_stats();
  if (const KvEventLog* log = engine_->kv_events()) s.kv_events = log->counts();
  return s;
}

size_t AsyncEngine::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.size();
}

void AsyncEngine::shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    if (!drain_deadline_ || std::chrono::steady_clock::now() + grace < *drain_deadline_)
      drain_deadline_ = std::chrono::steady_clock::now() + grace;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> AsyncEngine::fail_open_requests(const std::string& message) {
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.swap(streams_);
    admitted_.clear();
    group_waiting_.clear();
    waiting_sequences_ = 0;
  }
  std::vector<std::string> ids;
  for (auto& [id, stream] : streams) {
    RequestOutput out;
    out.request_id = id;
    out.finished = true;
    out.error = message;
    stream->push(std::move(out));
    ids.push_back(id);
  }
  return ids;
}

// Ends every request with an error output (the engine failed a step), and
// takes them out of the engine.
void AsyncEngine::fail_all(const std::string& message) {
  for (const std::string& id : fail_open_requests(message)) engine_->abort(id);
}

void AsyncEngine::run_on_step_thread(const std::function<void(Engine&)>& fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> result = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (loop_done_) throw ShuttingDown("the engine has stopped");
    calls_.emplace_back(fn, done);
  }
  cv_.notify_all();
  result.get();
}

// Calls queued by run_on_step_thread, each answered once stats_ shows its effect.
void AsyncEngine::run_calls() {
  std::deque<std::pair<std::function<void(Engine&)>, std::shared_ptr<std::promise<void>>>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls.swap(calls_);
  }
  for (auto& [fn, done] : calls) {
    std::exception_ptr error;
    try {
      fn(*engine_);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = engine_->stats();
    }
    if (error) done->set_exception(error);
    else done->set_value();
  }
}

void AsyncEngine::loop() {
  bool worked = false;  // steps ran since the heap was last trimmed
  // Calls that come after the loop ends are refused; those queued are answered.
  struct Finish {
    AsyncEngine& e;
    ~Finish() {
      std::lock_guard<std::mutex> lock(e.mu_);
      e.loop_done_ = true;
      for (auto& call : e.calls_)
        call.second->set_exception(std::make_exception_ptr(ShuttingDown("the engine has stopped")));
      e.calls_.clear();
    }
  } finish{*this};
  for (;;) {
    std::deque<EngineRequest> incoming;
    std::vector<std::string> aborts;
    bool drain_expired = false;
    run_calls();
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto has_work = [&] {
        return !incoming_.empty() || !aborts_.empty() || !calls_.empty() || engine_->has_unfinished() ||
               drain_deadline_.has_value();
      };
      if (worked && !cv_.wait_for(lock, kTrimWhenIdleFor, has_work)) {
        lock.unlock();
        engine_->release_step_buffers();
        release_free_heap();
        worked = false;
        continue;
      }
      cv_.wait(lock, has_work);
      incoming.swap(incoming_);
      aborts.swap(aborts_);
      if (drain_deadline_) {
        drain_expired = std::chrono::steady_clock::now() >= *drain_deadline_;
        if (!engine_->has_unfinished() && incoming.empty()) stop_ = true;
      }
    }
    auto deliver = [&](RequestOutput out) {
      std::shared_ptr<RequestStream> stream;
      {
        std::lock_guard<std::mutex> lock(mu_);
        started_locked(out.request_id);
        auto it = streams_.find(out.request_id);
        if (it == streams_.end()) return;
        stream = it->second;
        if (out.finished) {
          streams_.erase(it);
          admitted_.erase(out.request_id);
        }
      }
      stream->push(std::move(out));
    };
    for (auto& req : incoming) {
      const std::string id = req.id;
      try {
        engine_->add_checked_request(std::move(req));  // submit_group ran validate_params
      } catch (const std::exception& e) {
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.error = e.what();
        if (const auto* invalid = dynamic_cast<const InvalidRequest*>(&e)) {
          out.error_kind = RequestError::Invalid;  // an adapter unloaded since the caller checked, ...
          out.error_param = invalid->param();
        }
        deliver(std::move(out));
      }
    }
    for (const auto& id : aborts)
      if (auto out = engine_->abort(id)) deliver(std::move(*out));
    if (drain_expired) {
      // Grace period over: whatever is still running is aborted.
      std::vector<std::string> ids;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, s] : streams_) ids.push_back(id);
      }
      for (const auto& id : ids)
        if (auto out = engine_->abort(id)) deliver(std::move(*out));
    }
    bool stats_taken = false;
    if (engine_->has_unfinished()) {
      worked = true;
      try {
        std::vector<RequestOutput> outs = engine_->step();
        {
          // The step's stats before its outputs: a caller woken by its
          // request's last output already sees it counted as finished.
          std::lock_guard<std::mutex> lock(mu_);
          stats_ = engine_->stats();
          stats_taken = true;
        }
        for (RequestOutput& out : outs) deliver(std::move(out));
      } catch (const std::exception& e) {
        spdlog::error("engine step failed: {}", e.what());
        fail_all(std::string("internal error: ") + e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stats_taken) stats_ = engine_->stats();
      if (stop_) return;
      if (drain_deadline_ && !engine_->has_unfinished() && incoming_.empty()) return;
    }
  }
}

}  // namespace pagellm
