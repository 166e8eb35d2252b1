// One generation request in flight: its prompts submitted to the AsyncEngine,
// their output streams read as one, and an abort of whatever is unfinished
// when the client goes away or the job is dropped (destructor).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"

namespace pagellm::server {

class GenerationJob {
 public:
  // Submits the requests as one group: all are queued, or none (the error of
  // AsyncEngine::submit_group: InvalidRequest, QueueFull, ShuttingDown).
  GenerationJob(AsyncEngine& engine, std::vector<EngineRequest> requests);
  ~GenerationJob();
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  struct Item {
    size_t prompt_index;
    RequestOutput output;
  };
  // The next output of any prompt, or nothing after `timeout`.
  std::optional<Item> next(std::chrono::milliseconds timeout);
  // Every prompt delivered its final output.
  bool done() const { return remaining_ == 0; }
  // Aborts the unfinished prompts (their KV blocks return within one step).
  void abort();
  size_t num_prompts() const { return streams_.size(); }

 private:
  AsyncEngine& engine_;
  std::vector<std::shared_ptr<RequestStream>> streams_;
  std::vector<bool> finished_;
  size_t remaining_ = 0;
  size_t cursor_ = 0;  // round-robin start, so no prompt starves the others
};

class ClientWatch;

// A stream's first output, read before its 200 goes out when a grammar is
// still compiling: the compile may fail for the client's reasons, which is
// a 400 status rather than an error event. Throws that error (HttpError);
// returns false when the client left meanwhile (the job is aborted).
bool read_first_output(GenerationJob& job, ClientWatch& watch, std::chrono::milliseconds poll,
                       std::optional<GenerationJob::Item>& first);

// Reads a job's outputs until every prompt is done, handing each to `take`.
// Once per poll interval, busy or not, it looks for a client that left:
// then the job is aborted and it returns false. An output that carries an
// error aborts the job and is thrown (error_for: 400 naming its field, 503
// or 500). For replies sent whole; streams write as they read.
bool collect_outputs(GenerationJob& job, ClientWatch& watch, std::chrono::milliseconds poll,
                     const std::function<void(GenerationJob::Item&)>& take);

class HttpError;

// What a streamed reply writes: its opening, each output, its end, or an
// error event in place of the rest (each may be "": nothing to write).
struct StreamEvents {
  std::function<std::string()> begin;
  std::function<std::string(GenerationJob::Item&)> add;
  std::function<std::string()> end;
  std::function<std::string(const HttpError&)> error;
};
enum class StreamEnd { Finished, Failed, ClientGone };
// Streams a job through `write` (false: the client is gone): `first` (an
// output read before the stream began) and then the job's outputs, with the
// client probed once per poll interval by an SSE comment. An output's error
// aborts the job and ends the stream with events.error (Failed); a client
// that leaves aborts it (ClientGone). The caller ends the HTTP stream.
StreamEnd stream_outputs(GenerationJob& job, std::optional<GenerationJob::Item>& first, ClientWatch& watch,
                         std::chrono::milliseconds poll, const std::function<bool(const std::string&)>& write,
                         const StreamEvents& events);

}  // namespace pagellm::server
