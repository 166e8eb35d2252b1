#include "scheduler/sequence.h"

namespace pagellm {

const char* to_string(SeqStatus s) {
  switch (s) {
    case SeqStatus::Waiting: return "waiting";
    case SeqStatus::Running: return "running";
    case SeqStatus::Preempted: return "preempted";
    case SeqStatus::Swapped: return "swapped";
    case SeqStatus::FinishedStopped: return "finished_stopped";
    case SeqStatus::FinishedLength: return "finished_length";
    case SeqStatus::FinishedAborted: return "finished_aborted";
    case SeqStatus::FinishedIgnored: return "finished_ignored";
  }
  return "unknown";
}

}  // namespace pagellm
