// The Communicator over MPI_COMM_WORLD (or a group split from it). Compiled only when CMake finds MPI
// (PAGELLM_HAVE_MPI). Errors abort every rank (MPI's default handler), so a
// rank that dies takes the job down instead of leaving the others waiting.
#ifdef PAGELLM_HAVE_MPI
// The C API only (OpenMPI's and MPICH's headers add C++ bindings otherwise).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/trace.h"
#include "dist/communicator.h"

namespace pagellm::dist {
namespace {

constexpr int kTag = 7;

// How all-reduce algorithms are chosen in this process (describe()): set once,
// before MPI_Init, by the first communicator; its groups share it.
std::string& all_reduce_choice() {
  static std::string choice = "all-reduce by the MPI library's choice";
  return choice;
}

// OpenMPI's all-reduce for communicators of 2 ranks. Its fixed decision took
// over 1.5x the best time at 64 KiB - 1 MiB (decode batches, prefill chunks)
// in 3 to 5 of 10 launches on one machine, while ring was steady and never
// slower at any size (docs/scaling.md, tools/bench_allreduce.py). These
// dynamic rules (collective 2 = allreduce) take ring for 2 ranks and leave 3
// ranks and more to the fixed decision (algorithm 0), which nobody measured
// here. Any coll_tuned setting of the user's (mpirun --mca, OMPI_MCA_*) wins.
constexpr const char* kAllReduceRules =
    "1\n"           // collectives
    "2\n"           // allreduce
    "2\n"           // communicator sizes
    "2\n1\n"        // 2 ranks: one rule,
    "0 4 0 0\n"     //   from 0 bytes on: ring
    "3\n1\n"        // 3 ranks and more: one rule,
    "0 0 0 0\n";    //   the fixed decision

// Writes the rules for MPI_Init to read and sets all_reduce_choice(). Returns
// the file to remove once MPI_Init has read it ("" when none was written).
std::string install_all_reduce_rules() {
#ifdef OPEN_MPI
  for (const char* name : {"OMPI_MCA_coll_tuned_use_dynamic_rules", "OMPI_MCA_coll_tuned_dynamic_rules_filename",
                           "OMPI_MCA_coll_tuned_allreduce_algorithm"})
    if (std::getenv(name)) {
      all_reduce_choice() = "all-reduce as set by OMPI_MCA_coll_tuned_*";
      return "";
    }
  all_reduce_choice() = "all-reduce by OpenMPI's fixed decision";  // unless the rules get written
  std::error_code ec;
  const auto tmp = std::filesystem::temp_directory_path(ec);
  if (ec) return "";
  // Each rank writes its own.
  const std::string path = fmt::format("{}/pagellm-allreduce-rules-{}.conf", tmp.string(), ::getpid());
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "";
  const bool ok = std::fputs(kAllReduceRules, f) >= 0;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(path.c_str());
    return "";
  }
  ::setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 1);
  ::setenv("OMPI_MCA_coll_tuned_dynamic_rules_filename", path.c_str(), 1);
  all_reduce_choice() = "all-reduce: ring for 2 ranks";
  return path;
#else
  return "";
#endif
}

// Adds a call's wall time and bytes to the communicator's stats, and the
// call to the --trace timeline ("comm" events).
struct Timed {
  Timed(Communicator::Stats& s, const char* name, size_t bytes) : stats(s), scope(name, "comm"), start(MPI_Wtime()) {
    ++stats.calls;
    stats.bytes += bytes;
  }
  ~Timed() { stats.seconds += MPI_Wtime() - start; }
  Communicator::Stats& stats;
  trace::Scope scope;
  double start;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      // Serialized: the engine's collectives run on its step thread, not on
      // the thread that initialized MPI, one call at a time.
      int provided = 0;
      const std::string rules = install_all_reduce_rules();
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (!rules.empty()) std::remove(rules.c_str());
      owns_ = true;
    }
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  // A group of the world (MPI_Comm_split); it is freed before MPI ends.
  explicit MpiCommunicator(MPI_Comm group) : comm_(group) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) wait_sends(sends_started_);
    if (comm_ != MPI_COMM_WORLD && !done) MPI_Comm_free(&comm_);
    if (owns_ && !done) MPI_Finalize();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm group = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &group));
    return std::make_unique<MpiCommunicator>(group);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    v = v.substr(0, v.find_first_of(",\n"));
    return fmt::format("MPI ({}, {}), rank {} of {}", v, all_reduce_choice(), rank_, size_);
  }

  void all_reduce_sum(float* data, size_t n, AllReduceAlgo algo) override {
    if (size_ == 1 || n == 0) return;
    Timed t(stats_, "all_reduce", n * sizeof(float));
    if (algo == AllReduceAlgo::Auto)
      algo = n * sizeof(float) >= large_message_bytes ? AllReduceAlgo::ReduceScatterAllGather : AllReduceAlgo::Library;
    if (algo == AllReduceAlgo::Library || n < static_cast<size_t>(size_)) {
      check(MPI_Allreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, comm_));
      return;
    }
    // Each rank reduces one slice (the last takes the remainder), then the
    // slices are gathered back to every rank.
    counts_.assign(static_cast<size_t>(size_), 0);
    displs_.assign(static_cast<size_t>(size_), 0);
    const size_t slice = n / static_cast<size_t>(size_);
    for (int r = 0; r < size_; ++r) {
      displs_[r] = count(slice * static_cast<size_t>(r));
      counts_[r] = count(r == size_ - 1 ? n - slice * static_cast<size_t>(r) : slice);
    }
    scratch_.resize(static_cast<size_t>(counts_[rank_]));
    check(MPI_Reduce_scatter(data, scratch_.data(), counts_.data(), MPI_FLOAT, MPI_SUM, comm_));
    check(MPI_Allgatherv(scratch_.data(), counts_[rank_], MPI_FLOAT, data, counts_.data(), displs_.data(), MPI_FLOAT,
                         comm_));
  }
  void all_gather(const float* in, size_t n, float* out) override {
    Timed t(stats_, "all_gather", n * sizeof(float));
    check(MPI_Allgather(in, count(n), MPI_FLOAT, out, count(n), MPI_FLOAT, comm_));
  }
  void broadcast(void* data, size_t bytes, int root) override {
    PAGELLM_CHECK(root >= 0 && root < size_, "broadcast from rank {} of {}", root, size_);
    Timed t(stats_, "broadcast", bytes);
    check(MPI_Bcast(data, count(bytes), MPI_BYTE, root, comm_));
  }
  void barrier() override {
    Timed t(stats_, "barrier", 0);
    check(MPI_Barrier(comm_));
  }
  void send(const void* data, size_t bytes, int dst) override {
    PAGELLM_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send from rank {} to rank {} of {}", rank_, dst, size_);
    Timed t(stats_, "send", bytes);
    check(MPI_Send(data, count(bytes), MPI_BYTE, dst, kTag, comm_));
  }
  void recv(void* data, size_t bytes, int src) override {
    PAGELLM_CHECK(src >= 0 && src < size_ && src != rank_, "receive on rank {} from rank {} of {}", rank_, src, size_);
    Timed t(stats_, "recv", bytes);
    check(MPI_Recv(data, count(bytes), MPI_BYTE, src, kTag, comm_, MPI_STATUS_IGNORE));
  }
  void recv_any_size(std::vector<uint8_t>& out, int src) override {
    PAGELLM_CHECK(src >= 0 && src < size_ && src != rank_, "receive on rank {} from rank {} of {}", rank_, src, size_);
    MPI_Status status;
    check(MPI_Probe(src, kTag, comm_, &status));
    int n = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &n));
    out.resize(static_cast<size_t>(n));
    Timed t(stats_, "recv", out.size());
    check(MPI_Recv(out.data(), n, MPI_BYTE, src, kTag, comm_, MPI_STATUS_IGNORE));
  }
  uint64_t send_async(const void* data, size_t bytes, int dst) override {
    PAGELLM_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send from rank {} to rank {} of {}", rank_, dst, size_);
    Timed t(stats_, "send_async", bytes);
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Isend(data, count(bytes), MPI_BYTE, dst, kTag, comm_, &req));
    pending_.push_back(req);
    return ++sends_started_;
  }
  void wait_sends(uint64_t ticket) override {
    // pending_ holds the sends after number sends_done_, oldest first.
    if (ticket <= sends_done_) return;
    Timed t(stats_, "wait_sends", 0);
    const size_t n = static_cast<size_t>(std::min(ticket, sends_started_) - sends_done_);
    check(MPI_Waitall(static_cast<int>(n), pending_.data(), MPI_STATUSES_IGNORE));
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
    sends_done_ += n;
  }

 private:
  static int count(size_t n) {
    PAGELLM_CHECK(n <= static_cast<size_t>(INT32_MAX), "MPI message of {} elements is too large", n);
    return static_cast<int>(n);
  }
  static void check(int rc) {
    if (rc != MPI_SUCCESS) fail("MPI call failed (code {})", rc);
  }

  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  std::vector<int> counts_, displs_;
  std::vector<float> scratch_;
  std::vector<MPI_Request> pending_;  // send_async not yet waited for
  uint64_t sends_started_ = 0, sends_done_ = 0;
};

}  // namespace

bool have_mpi() { return true; }

void abort_job_if_parallel(int code) {
  int started = 0, done = 0, size = 1;
  MPI_Initialized(&started);
  MPI_Finalized(&done);
  if (!started || done) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return;
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, code);
}
std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace pagellm::dist
#endif
