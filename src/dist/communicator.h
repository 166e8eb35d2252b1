// The collective operations tensor and pipeline parallelism need, behind one
// interface: MPI now (mpi_communicator.cpp, built when MPI is found), NCCL /
// HCCL / XCCL later. The backend seam (backend/backend.h) never sees it: the
// runner calls it between ops, on host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pagellm::dist {

// How an all-reduce is carried out. Auto picks by message size (the seeds'
// "smart all-reduce"): the library's own algorithm below large_message_bytes,
// reduce-scatter + all-gather from there on (each rank moves 2 (N - 1) / N of
// the message, the bandwidth optimum on a ring).
enum class AllReduceAlgo { Auto, Library, ReduceScatterAllGather };
const char* to_string(AllReduceAlgo a);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;
  // In place: every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t n, AllReduceAlgo algo = AllReduceAlgo::Auto) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[0, n).
  virtual void all_gather(const float* in, size_t n, float* out) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // The group of the ranks that pass the same color, ordered by key (and
  // rank): a tensor-parallel group inside a pipeline stage. Collective: every
  // rank calls it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Point to point (pipeline stages): blocking, matched in order per pair.
  virtual void send(const void* data, size_t bytes, int dst) = 0;
  virtual void recv(void* data, size_t bytes, int src) = 0;
  // Receives a message whose size only the sender knows (into `out`, resized).
  virtual void recv_any_size(std::vector<uint8_t>& out, int src) = 0;
  // Non-blocking send, matched in order with the blocking ones: returns a
  // ticket at once. `data` must stay as it is until wait_sends(ticket) has
  // returned; that waits for this send and every earlier one. Rank 0 sends
  // asynchronously so that it can go on with the next step while the later
  // pipeline stages still work on this one.
  virtual uint64_t send_async(const void* data, size_t bytes, int dst) = 0;
  virtual void wait_sends(uint64_t ticket) = 0;
  // Time spent inside the calls above (waiting for peers included), for the
  // step trace and the scaling measurements.
  struct Stats {
    double seconds = 0;
    uint64_t calls = 0, bytes = 0;
  };
  const Stats& stats() const { return stats_; }
  // Auto uses ReduceScatterAllGather from this many bytes on. Off by
  // default: on 2 ranks of one machine the library's all-reduce (OpenMPI's
  // ring there, see mpi_communicator.cpp) was faster at every size from
  // 8 KiB to 4 MiB (docs/scaling.md); set it where a measurement on the real
  // interconnect says otherwise.
  size_t large_message_bytes = SIZE_MAX;

 protected:
  Stats stats_;
};

// One rank: every collective is a no-op (or a copy).
std::unique_ptr<Communicator> make_local_communicator();
// MPI_COMM_WORLD (initializing MPI if needed). Throws Error when this build
// has no MPI.
std::unique_ptr<Communicator> make_mpi_communicator();
bool have_mpi();
// When this process is one of several ranks (MPI started, more than one
// rank): flushes stdio and ends the whole job now (MPI_Abort), because the
// other ranks may be waiting in a call this one will never make. Otherwise
// returns. For fatal errors; a normal exit finalizes MPI instead.
void abort_job_if_parallel(int code);

}  // namespace pagellm::dist
