// Work that must be stoppable: a function run in a forked child process
// under a time and memory budget. A thread cannot be stopped from outside,
// a process can (SIGKILL), and its memory goes back to the system whole when
// it ends. The grammar compiler runs each compile this way.
//
// The child inherits the parent's memory copy-on-write, so the function sees
// everything the parent had at the fork (a tokenizer, a compiler object), but
// only the forking thread exists there: it must not wait on locks or threads
// of the parent. Its result comes back as bytes through a pipe.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace pagellm {

struct ChildBudget {
  std::chrono::milliseconds time{10000};
  // Memory the child may add to what it inherited (resident set growth,
  // polled, and an address-space limit in builds without sanitizers).
  size_t memory_bytes = size_t{1} << 30;
  // How often the parent looks at the child's memory and the cancel flag.
  std::chrono::milliseconds poll{10};
};

struct ChildResult {
  enum class Status {
    Ok,          // the function returned: `output` holds its bytes
    Failed,      // the function threw: `output` holds the message
    OverTime,    // killed at the time budget
    OverMemory,  // killed at the memory budget (or its allocation failed there)
    Cancelled,   // killed because `cancelled()` said so
    Crashed,     // the child died another way (signal, early exit): `output` says how
  };
  Status status = Status::Crashed;
  std::string output;
  double seconds = 0;  // wall time from fork to the end
  size_t peak_memory_growth = 0;  // largest resident growth seen by the polls
};

const char* to_string(ChildResult::Status s);

// Runs `work` in a child process and waits for it, polling `cancelled` (may be
// empty). Never leaves a child behind: on every way out the child is killed
// and reaped. Throws pagellm::Error only when no child can be started.
ChildResult run_bounded_child(const std::function<std::string()>& work, const ChildBudget& budget,
                              const std::function<bool()>& cancelled = {});

}  // namespace pagellm
