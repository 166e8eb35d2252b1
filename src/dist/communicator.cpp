#include "dist/communicator.h"

#include <cstring>

#include "core/error.h"

namespace pagellm::dist {

const char* to_string(AllReduceAlgo a) {
  switch (a) {
    case AllReduceAlgo::Auto: return "auto";
    case AllReduceAlgo::Library: return "library";
    case AllReduceAlgo::ReduceScatterAllGather: return "reduce-scatter+all-gather";
  }
  return "?";
}

namespace {

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "local (1 rank)"; }
  void all_reduce_sum(float*, size_t, AllReduceAlgo) override {}
  void all_gather(const float* in, size_t n, float* out) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void broadcast(void*, size_t, int root) override {
    PAGELLM_CHECK(root == 0, "broadcast from rank {} of 1", root);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }
  void send(const void*, size_t, int dst) override { fail("send to rank {} of 1", dst); }
  void recv(void*, size_t, int src) override { fail("receive from rank {} of 1", src); }
  void recv_any_size(std::vector<uint8_t>&, int src) override { fail("receive from rank {} of 1", src); }
  uint64_t send_async(const void*, size_t, int dst) override { fail("send to rank {} of 1", dst); }
  void wait_sends(uint64_t) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

#ifndef PAGELLM_HAVE_MPI
bool have_mpi() { return false; }
void abort_job_if_parallel(int) {}
std::unique_ptr<Communicator> make_mpi_communicator() {
  fail("this build of pagellm has no MPI (install libopenmpi-dev and rebuild)");
}
#endif

}  // namespace pagellm::dist
