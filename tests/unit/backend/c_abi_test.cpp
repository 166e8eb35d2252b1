// The plain C backend ABI from the core's two sides: a C++ backend exported
// as a registry (backend/c_export.h) and imported again as a Backend
// (backend/c_backend.h). A fake backend with a one-rank device communicator
// shows that comm calls, the optional softcap and sample ops and errors
// (with their message text) cross the boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/c_backend.h"
#include "backend/c_export.h"
#include "core/error.h"
#include "hostile_input.h"

namespace pagellm {
namespace {

using test::error_of;

class HostBuffer final : public Buffer {
 public:
  HostBuffer(DType t, size_t n) : Buffer(t, n), bytes(Buffer::bytes()) {}
  std::vector<uint8_t> bytes;
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
};
HostBuffer& hb(const Buffer& b) { return const_cast<HostBuffer&>(static_cast<const HostBuffer&>(b)); }

using Log = std::vector<std::string>;

class OneRankComm final : public DeviceComm {
 public:
  explicit OneRankComm(Log* log) : log_(log) {}
  std::string describe() const override { return "one rank"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Buffer&, size_t offset, size_t count) override {
    log_->push_back("all_reduce_sum " + std::to_string(offset) + " " + std::to_string(count));
  }
  void all_gather(const Buffer& in, size_t count, Buffer& out) override {
    std::memcpy(hb(out).f32(), hb(in).f32(), count * sizeof(float));
    log_->push_back("all_gather " + std::to_string(count));
  }
  void broadcast(Buffer&, size_t count, int root) override {
    log_->push_back("broadcast " + std::to_string(count) + " " + std::to_string(root));
  }
  void send(const Buffer&, size_t, int dst) override { fail("one rank: no peer {} to send to", dst); }
  void recv(Buffer&, size_t, int src) override { fail("one rank: no peer {} to receive from", src); }

 private:
  Log* log_;
};

// Host memory, softcap and a greedy sample; every other op fails.
class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(Log* log) : log_(log) {}
  std::string name() const override { return "fake"; }
  std::string describe() const override { return "a fake device"; }
  MemoryInfo memory_info() const override { return {1000, 900, true}; }
  BufferPtr alloc(DType type, size_t n) override { return std::make_unique<HostBuffer>(type, n); }
  void copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) override {
    PAGELLM_CHECK(offset + bytes <= dst.bytes(), "fake: copy of {} bytes at {} past a buffer of {}", bytes, offset,
                  dst.bytes());
    std::memcpy(hb(dst).bytes.data() + offset, src, bytes);
  }
  void copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) override {
    std::memcpy(dst, hb(src).bytes.data() + offset, bytes);
  }
  void synchronize() override {}
  bool supports_weight(DType) const override { return false; }
  std::unique_ptr<Weight> upload(const TensorData& t) override { fail("fake: no weights ('{}')", t.name); }
  void allocate_kv_cache(const KVCacheSpec& spec) override { kv_ = spec; }
  const KVCacheSpec& kv_cache_spec() const override { return kv_; }
  void copy_blocks(const BlockPairs&) override {}
  void set_batch(const BatchInfo& b) override { log_->push_back("set_batch " + std::to_string(b.n_tokens())); }
  void embed(const Weight&, float, Buffer&) override { fail("fake has no embed"); }
  void matmul(const Weight&, const Buffer&, int64_t, Buffer&) override { fail("fake has no matmul"); }
  void add_bias(Buffer&, const Weight&, int64_t) override { fail("fake has no add_bias"); }
  void rms_norm(const Buffer&, const Weight*, int64_t, int64_t, float, Buffer&) override { fail("no rms_norm"); }
  void rope(Buffer&, int, int, const RopeConfig&) override { fail("no rope"); }
  void store_kv(int, Buffer&, const Buffer&, const RopeConfig*) override { fail("no store_kv"); }
  void attention(int, const Buffer&, Buffer&, const AttentionConfig&) override { fail("no attention"); }
  void glu(const Buffer&, const Buffer&, int64_t, Activation, Buffer&) override { fail("no glu"); }
  void add(Buffer& y, const Buffer& x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) hb(y).f32()[i] += hb(x).f32()[i];
  }
  void gather_rows(const Buffer&, int64_t, const std::vector<int32_t>&, Buffer&) override { fail("no gather"); }
  bool supports_op(const OpQuery& q) const override {
    return q.op == PGLB_OP_SOFTCAP || q.op == PGLB_OP_SAMPLE || q.op == PGLB_OP_ADD;
  }
  void softcap(Buffer& x, int64_t n, float cap) override {
    for (int64_t i = 0; i < n; ++i) hb(x).f32()[i] = cap * std::tanh(hb(x).f32()[i] / cap);
  }
  void sample(const Buffer& logits, int64_t n_vocab, const std::vector<SampleDraw>& draws, Buffer& ids) override {
    for (size_t i = 0; i < draws.size(); ++i) {
      const float* row = hb(logits).f32() + draws[i].row * n_vocab;
      reinterpret_cast<int32_t*>(hb(ids).bytes.data())[i] =
          static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
    }
    log_->push_back("sample " + std::to_string(draws.size()));
  }
  bool has_device_comm() const override { return true; }
  // Larger than the 256 bytes the core first offers: the size is asked again.
  std::vector<uint8_t> comm_unique_id() override { return std::vector<uint8_t>(300, 7); }
  std::unique_ptr<DeviceComm> comm_init(int rank, int size, const std::vector<uint8_t>& id) override {
    PAGELLM_CHECK(rank == 0 && size == 1, "fake: one rank only, not {} of {}", rank, size);
    PAGELLM_CHECK(id == std::vector<uint8_t>(300, 7), "fake: a foreign id of {} bytes", id.size());
    return std::make_unique<OneRankComm>(log_);
  }

 private:
  Log* log_;
  KVCacheSpec kv_;
};

const pglb_registry* fake_registry(Log* log, bool device_comm) {
  ExportedBackend x;
  x.kind = "fake";
  x.description = "a fake for the ABI test";
  x.device_count = [] { return 1; };
  x.create = [log](int index, const BackendOptions& o) -> std::unique_ptr<Backend> {
    if (index != 0) fail("fake has one device, not {}", index);
    check_backend_options(o, "fake", {});
    return std::make_unique<FakeBackend>(log);
  };
  x.device_comm = device_comm;
  return export_backend(std::move(x));
}

std::vector<float> get(Backend& be, const Buffer& b, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(b, 0, n * sizeof(float), v.data());
  be.synchronize();
  return v;
}

TEST(CAbi, DeviceCommCrossesTheBoundaryBothWays) {
  Log log;
  auto be = make_c_backend(fake_registry(&log, true), 0, {}, "test");
  EXPECT_EQ(be->name(), "fake");
  EXPECT_EQ(be->describe(), "a fake device");
  EXPECT_EQ(be->memory_info().free_bytes, 900u);
  ASSERT_TRUE(be->has_device_comm());
  const std::vector<uint8_t> id = be->comm_unique_id();
  EXPECT_EQ(id, std::vector<uint8_t>(300, 7));
  auto comm = be->comm_init(0, 1, id);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_NE(comm->describe().find("fake"), std::string::npos);

  auto in = be->alloc(DType::F32, 3), out = be->alloc(DType::F32, 3);
  const float x[3] = {1.5f, -2, 3};
  be->copy_from_host(x, *in, 0, sizeof x);
  comm->all_reduce_sum(*in, 1, 2);
  comm->all_gather(*in, 3, *out);
  comm->broadcast(*in, 3, 0);
  EXPECT_EQ(get(*be, *out, 3), std::vector<float>(x, x + 3));
  EXPECT_EQ(log, (Log{"all_reduce_sum 1 2", "all_gather 3", "broadcast 3 0"}));
  // The fake's own error text comes back, with the backend and the call named.
  const std::string e = error_of([&] { comm->send(*in, 3, 1); });
  EXPECT_NE(e.find("one rank: no peer 1 to send to"), std::string::npos) << e;
  EXPECT_NE(e.find("fake backend"), std::string::npos) << e;
  EXPECT_NE(e.find("comm send"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { be->comm_init(1, 2, id); }).find("one rank only, not 1 of 2"), std::string::npos);
  comm.reset();  // destroyed through the table before the device closes
}

TEST(CAbi, WithoutCommTableTheHostCommunicatorIsUsed) {
  Log log;
  auto be = make_c_backend(fake_registry(&log, false), 0, {}, "test");
  EXPECT_FALSE(be->has_device_comm());
  EXPECT_NE(error_of([&] { be->comm_unique_id(); }).find("no device communicator"), std::string::npos);
}

TEST(CAbi, OptionalOpsAndErrorsCrossTheBoundary) {
  Log log;
  auto be = make_c_backend(fake_registry(&log, false), 0, {}, "test");
  EXPECT_TRUE(be->supports_op(op_query(PGLB_OP_SOFTCAP)));
  EXPECT_TRUE(be->supports_op(op_query(PGLB_OP_SAMPLE)));
  EXPECT_FALSE(be->supports_op(op_query(PGLB_OP_MATMUL)));
  EXPECT_FALSE(be->supports(Feature::SwapToHost));

  const std::vector<float> logits = {0.5f, 9.0f, -3.0f, 2.0f, -1.0f, 4.0f, 30.0f, 1.0f};
  auto l = be->alloc(DType::F32, logits.size());
  be->copy_from_host(logits.data(), *l, 0, logits.size() * sizeof(float));
  auto ids = be->alloc(DType::I32, 2);
  std::vector<SampleDraw> draws(2);
  draws[0].row = 1;
  draws[1].row = 0;
  be->sample(*l, 4, draws, *ids);
  int32_t got[2] = {};
  be->copy_to_host(*ids, 0, sizeof got, got);
  be->synchronize();
  EXPECT_EQ(got[0], 2);  // row 1: 30 at column 2
  EXPECT_EQ(got[1], 1);
  be->softcap(*l, 8, 5.0f);
  const std::vector<float> capped = get(*be, *l, 8);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_FLOAT_EQ(capped[i], 5.0f * std::tanh(logits[i] / 5.0f));

  BatchInfo b;
  b.token_ids = {1, 2};
  b.positions = {0, 1};
  b.slot_mapping = {16, 17};
  b.seqs.push_back({0, 2, 2, {1}, 0, 0});
  be->set_batch(b);
  EXPECT_EQ(log, (Log{"sample 2", "set_batch 2"}));

  const std::string m = error_of([&] {
    auto y = be->alloc(DType::F32, 1);
    be->rope(*y, 1, 1, RopeConfig{});
  });
  EXPECT_NE(m.find("no rope"), std::string::npos) << m;
  EXPECT_NE(m.find("fake backend: rope failed"), std::string::npos) << m;
  const std::string copy = error_of([&] {
    auto y = be->alloc(DType::F32, 1);
    float big[4] = {};
    be->copy_from_host(big, *y, 0, sizeof big);
  });
  EXPECT_NE(copy.find("fake: copy of 16 bytes at 0 past a buffer of 4"), std::string::npos) << copy;
  EXPECT_NE(error_of([&] { be->upload(TensorData{"w", DType::F32, {2}, logits.data()}); }).find("fake: no weights ('w')"),
            std::string::npos);
  EXPECT_NE(error_of([&] { be->moe_combine(*l, *l, 1, 1, 1, *l); }).find("Mixture-of-Experts"), std::string::npos);
  EXPECT_NE(error_of([&] { be->allocate_swap_space(4); }).find("cannot swap"), std::string::npos);
}

TEST(CAbi, DeviceOpenErrorsKeepTheirText) {
  Log log;
  const pglb_registry* reg = fake_registry(&log, false);
  EXPECT_EQ(registry_device_count(reg), 1);
  EXPECT_NE(error_of([&] { make_c_backend(reg, 2, {}, "test"); }).find("fake has one device, not 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_c_backend(reg, 0, {{"colour", "red"}}, "test"); }).find("no option 'colour'"),
            std::string::npos);
}

TEST(CAbi, RegistriesOfAnotherVersionOrSizeAreRefused) {
  Log log;
  pglb_registry copy = *fake_registry(&log, false);
  copy.abi_version = 1;
  const std::string v = error_of([&] { check_registry(&copy, "lib.so"); });
  EXPECT_NE(v.find("'lib.so' was built for backend ABI version 1"), std::string::npos) << v;
  copy.abi_version = PGLB_ABI_VERSION;
  copy.struct_size = 16;
  EXPECT_NE(error_of([&] { check_registry(&copy, "lib.so"); }).find("smaller than"), std::string::npos);
  copy.struct_size = sizeof copy;
  pglb_stream_iface stream = *copy.stream;
  stream.enqueue = nullptr;
  copy.stream = &stream;
  EXPECT_NE(error_of([&] { check_registry(&copy, "lib.so"); }).find("does not provide enqueue"), std::string::npos);
}

}  // namespace
}  // namespace pagellm
