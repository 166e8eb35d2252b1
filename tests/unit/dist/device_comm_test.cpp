// make_device_comm: a backend's own communicator is initialised with the
// unique id its rank 0 made; any other backend gets the host default. (The
// default's collectives under MPI: tests/mpi/communicator_test.cpp.)
#include "dist/device_comm.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace pagellm {
namespace {

// A backend with nothing but a communicator of its own (every op fails).
class CommOnlyBackend : public Backend {
 public:
  struct Comm : DeviceComm {
    CommOnlyBackend* owner;
    int rank_, size_;
    Comm(CommOnlyBackend* o, int r, int s) : owner(o), rank_(r), size_(s) {}
    std::string describe() const override { return "test collectives"; }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void all_reduce_sum(Buffer&, size_t, size_t count) override { owner->reduced += count; }
    void all_gather(const Buffer&, size_t, Buffer&) override {}
    void broadcast(Buffer&, size_t, int) override {}
    void send(const Buffer&, size_t, int) override {}
    void recv(Buffer&, size_t, int) override {}
  };
  bool has_device_comm() const override { return true; }
  std::vector<uint8_t> comm_unique_id() override { return {7, 8, 9}; }
  std::unique_ptr<DeviceComm> comm_init(int rank, int size, const std::vector<uint8_t>& id) override {
    seen_id = id;
    return std::make_unique<Comm>(this, rank, size);
  }
  std::vector<uint8_t> seen_id;
  size_t reduced = 0;

  std::string name() const override { return "commonly"; }
  std::string describe() const override { return "test"; }
  MemoryInfo memory_info() const override { return {}; }
  BufferPtr alloc(DType, size_t) override { fail("no buffers"); }
  void copy_from_host(const void*, Buffer&, size_t, size_t) override { fail("no"); }
  void copy_to_host(const Buffer&, size_t, size_t, void*) override { fail("no"); }
  void synchronize() override {}
  bool supports_weight(DType) const override { return false; }
  std::unique_ptr<Weight> upload(const TensorData&) override { fail("no"); }
  void allocate_kv_cache(const KVCacheSpec&) override { fail("no"); }
  const KVCacheSpec& kv_cache_spec() const override { fail("no"); }
  void copy_blocks(const BlockPairs&) override { fail("no"); }
  void set_batch(const BatchInfo&) override { fail("no"); }
  void embed(const Weight&, float, Buffer&) override { fail("no"); }
  void matmul(const Weight&, const Buffer&, int64_t, Buffer&) override { fail("no"); }
  void add_bias(Buffer&, const Weight&, int64_t) override { fail("no"); }
  void rms_norm(const Buffer&, const Weight*, int64_t, int64_t, float, Buffer&) override { fail("no"); }
  void rope(Buffer&, int, int, const RopeConfig&) override { fail("no"); }
  void store_kv(int, Buffer&, const Buffer&, const RopeConfig*) override { fail("no"); }
  void attention(int, const Buffer&, Buffer&, const AttentionConfig&) override { fail("no"); }
  void glu(const Buffer&, const Buffer&, int64_t, Activation, Buffer&) override { fail("no"); }
  void add(Buffer&, const Buffer&, int64_t) override { fail("no"); }
  void gather_rows(const Buffer&, int64_t, const std::vector<int32_t>&, Buffer&) override { fail("no"); }
};

TEST(DeviceComm, ABackendsOwnCommunicatorIsInitialisedWithRankZerosId) {
  CommOnlyBackend be;
  auto host = dist::make_local_communicator();
  auto comm = dist::make_device_comm(be, *host);
  EXPECT_EQ(comm->describe(), "test collectives");
  EXPECT_EQ(be.seen_id, (std::vector<uint8_t>{7, 8, 9}));
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
}

TEST(DeviceComm, OtherBackendsGetTheHostDefault) {
  auto be = make_cpu_backend(1);
  auto host = dist::make_local_communicator();
  auto comm = dist::make_device_comm(*be, *host);
  EXPECT_NE(comm->describe().find("host copies"), std::string::npos) << comm->describe();
  // One rank: an all-reduce leaves the values as they are.
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 4.0f};
  BufferPtr b = be->alloc(DType::F32, v.size());
  be->copy_from_host(v.data(), *b, 0, v.size() * sizeof(float));
  comm->all_reduce_sum(*b, 1, 2);
  std::vector<float> got(v.size());
  be->copy_to_host(*b, 0, got.size() * sizeof(float), got.data());
  be->synchronize();
  EXPECT_EQ(got, v);
  EXPECT_THROW(be->comm_unique_id(), Error);
}

}  // namespace
}  // namespace pagellm
