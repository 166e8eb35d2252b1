#include "server/generation_job.h"

#include <algorithm>
#include <utility>

#include "server/http_connections.h"
#include "server/http_errors.h"

namespace pagellm::server {

GenerationJob::GenerationJob(AsyncEngine& engine, std::vector<EngineRequest> requests)
    : engine_(engine), streams_(engine.submit_group(std::move(requests))) {
  finished_.assign(streams_.size(), false);
  remaining_ = streams_.size();
}

GenerationJob::~GenerationJob() { abort(); }

void GenerationJob::abort() {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (!finished_[i]) engine_.abort(streams_[i]->id());
}

std::optional<GenerationJob::Item> GenerationJob::next(std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  if (remaining_ == 0) return std::nullopt;
  auto take = [&](size_t i, RequestOutput out) {
    if (out.finished) {
      finished_[i] = true;
      remaining_--;
    }
    return Item{i, std::move(out)};
  };
  if (streams_.size() == 1) {
    if (auto out = streams_[0]->next(timeout)) return take(0, std::move(*out));
    return std::nullopt;
  }
  // Several prompts: poll each, then wait a little on one of them.
  const auto deadline = steady_clock::now() + timeout;
  constexpr milliseconds kSlice{5};
  for (;;) {
    for (size_t k = 0; k < streams_.size(); ++k) {
      const size_t i = (cursor_ + k) % streams_.size();
      if (finished_[i]) continue;
      if (auto out = streams_[i]->next(milliseconds(0))) {
        cursor_ = (i + 1) % streams_.size();
        return take(i, std::move(*out));
      }
    }
    const auto now = steady_clock::now();
    if (now >= deadline) return std::nullopt;
    size_t wait_on = 0;
    while (finished_[wait_on]) ++wait_on;
    const auto left = duration_cast<milliseconds>(deadline - now);
    if (auto out = streams_[wait_on]->next(std::min(left, kSlice))) return take(wait_on, std::move(*out));
  }
}

bool read_first_output(GenerationJob& job, ClientWatch& watch, std::chrono::milliseconds poll,
                       std::optional<GenerationJob::Item>& first) {
  while (!first && !job.done()) {
    first = job.next(poll);
    if (!first && watch.gone()) {
      job.abort();
      return false;
    }
  }
  if (first && !first->output.error.empty()) {
    job.abort();
    throw error_for(first->output);
  }
  return true;
}

bool collect_outputs(GenerationJob& job, ClientWatch& watch, std::chrono::milliseconds poll,
                     const std::function<void(GenerationJob::Item&)>& take) {
  auto last_check = std::chrono::steady_clock::now();
  while (!job.done()) {
    auto item = job.next(poll);
    if (std::chrono::steady_clock::now() - last_check >= poll) {
      last_check = std::chrono::steady_clock::now();
      if (watch.gone()) {
        job.abort();
        return false;
      }
    }
    if (!item) continue;
    if (!item->output.error.empty()) {
      job.abort();
      throw error_for(item->output);
    }
    take(*item);
  }
  return true;
}

StreamEnd stream_outputs(GenerationJob& job, std::optional<GenerationJob::Item>& first, ClientWatch& watch,
                         std::chrono::milliseconds poll, const std::function<bool(const std::string&)>& write,
                         const StreamEvents& events) {
  auto gone = [&] {
    job.abort();
    return StreamEnd::ClientGone;
  };
  if (!write(events.begin())) return gone();
  auto last_check = std::chrono::steady_clock::now();
  while (first || !job.done()) {
    auto item = first ? std::exchange(first, std::nullopt) : job.next(poll);
    // Failed writes show most disconnects; this also catches them while
    // nothing is written (queued, long prefill, text held back). An SSE
    // comment tells a client that half-closed from one that left.
    if (std::chrono::steady_clock::now() - last_check >= poll) {
      last_check = std::chrono::steady_clock::now();
      if (watch.gone([&] { return write(": keep-alive\n\n"); })) return gone();
    }
    if (!item) continue;
    if (!item->output.error.empty()) {
      job.abort();
      write(events.error(error_for(item->output)));
      return StreamEnd::Failed;
    }
    if (!write(events.add(*item))) return gone();
  }
  if (!write(events.end())) return gone();
  return StreamEnd::Finished;
}

}  // namespace pagellm::server
