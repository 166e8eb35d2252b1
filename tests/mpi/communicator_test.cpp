// The MPI Communicator under mpirun (ctest runs it with 2 ranks): every
// collective against the values each rank can compute alone, for message
// sizes on both sides of the all-reduce algorithm switch and not divisible
// by the rank count; with --expect-all-reduce, the all-reduce rules installed
// before MPI_Init. With --bench, rank 0 prints the median time of each
// all-reduce algorithm for decode- and prefill-sized messages (docs/scaling.md).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"
#include "dist/device_comm.h"

using pagellm::dist::AllReduceAlgo;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED %s\n", rank, what.c_str());
  ++failures;
}

float value(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 97)) + 0.5f; }

void check_all(pagellm::dist::Communicator& c) {
  const int r = c.rank(), n_ranks = c.size();
  for (size_t n : {size_t{1}, size_t{3}, size_t{1000}, size_t{65536 + 7}, size_t{300001}}) {
    for (AllReduceAlgo algo : {AllReduceAlgo::Auto, AllReduceAlgo::Library, AllReduceAlgo::ReduceScatterAllGather}) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = value(r, i);
      c.all_reduce_sum(v.data(), n, algo);
      bool ok = true;
      for (size_t i = 0; i < n && ok; ++i) {
        float want = 0;
        for (int k = 0; k < n_ranks; ++k) want += value(k, i);
        ok = v[i] == want;
      }
      expect(ok, "all_reduce_sum n=" + std::to_string(n) + " " + pagellm::dist::to_string(algo), r);
    }
    std::vector<float> in(n), out(n * static_cast<size_t>(n_ranks));
    for (size_t i = 0; i < n; ++i) in[i] = value(r, i);
    c.all_gather(in.data(), n, out.data());
    bool ok = true;
    for (int k = 0; k < n_ranks && ok; ++k)
      for (size_t i = 0; i < n && ok; ++i) ok = out[static_cast<size_t>(k) * n + i] == value(k, i);
    expect(ok, "all_gather n=" + std::to_string(n), r);
  }
  const int root = n_ranks - 1;
  char msg[32] = {};
  if (r == root) std::snprintf(msg, sizeof msg, "plan of step %d", 42);
  c.broadcast(msg, sizeof msg, root);
  expect(std::string(msg) == "plan of step 42", "broadcast", r);
  c.barrier();
  // Point to point, around the ring (each rank sends before it receives,
  // except the last, so no pair waits on the other).
  if (n_ranks > 1) {
    const int next = (r + 1) % n_ranks, prev = (r + n_ranks - 1) % n_ranks;
    std::vector<float> out(1000), in(1000);
    for (size_t i = 0; i < out.size(); ++i) out[i] = value(r, i);
    if (r == n_ranks - 1) {
      c.recv(in.data(), in.size() * sizeof(float), prev);
      c.send(out.data(), out.size() * sizeof(float), next);
    } else {
      c.send(out.data(), out.size() * sizeof(float), next);
      c.recv(in.data(), in.size() * sizeof(float), prev);
    }
    bool ok = true;
    for (size_t i = 0; i < in.size() && ok; ++i) ok = in[i] == value(prev, i);
    expect(ok, "send / recv", r);
  }
  // Asynchronous sends, received in order: rank 0 sends every other rank
  // messages of sizes the receivers learn from the message itself, then
  // waits for them (the runner's step messages, sent before rank 0 goes on).
  if (n_ranks > 1) {
    std::vector<std::vector<uint8_t>> sent;
    for (int k = 0; k < 3; ++k) sent.push_back(std::vector<uint8_t>(static_cast<size_t>(100000 * k + 5), uint8_t(k + 1)));
    if (r == 0) {
      uint64_t ticket = 0;
      for (int dst = 1; dst < n_ranks; ++dst)
        for (const auto& m : sent) ticket = c.send_async(m.data(), m.size(), dst);
      c.wait_sends(ticket);
      c.wait_sends(ticket);  // (again: nothing left to wait for)
    } else {
      std::vector<uint8_t> got;
      bool ok = true;
      for (const auto& m : sent) {
        c.recv_any_size(got, 0);
        ok = ok && got == m;
      }
      expect(ok, "send_async / recv_any_size", r);
    }
  }
  // Groups: the even and the odd ranks each sum among themselves.
  auto group = c.split(r % 2, r);
  float sum = static_cast<float>(r);
  group->all_reduce_sum(&sum, 1);
  float want = 0;
  for (int k = r % 2; k < n_ranks; k += 2) want += static_cast<float>(k);
  expect(sum == want && group->rank() == r / 2, "split groups", r);
  expect(c.stats().calls > 0 && c.stats().seconds >= 0, "stats", r);
}

// The host default of the device communicator on CPU backend buffers: each
// collective against the values every rank computes alone.
void check_device_comm(pagellm::dist::Communicator& c) {
  using namespace pagellm;
  auto be = make_cpu_backend(1);
  auto dc = dist::make_device_comm(*be, c);
  const int r = c.rank(), n_ranks = c.size();
  expect(dc->rank() == r && dc->size() == n_ranks, "device comm rank and size", r);
  auto put = [&](const std::vector<float>& v) {
    BufferPtr b = be->alloc(DType::F32, v.size());
    be->copy_from_host(v.data(), *b, 0, v.size() * sizeof(float));
    return b;
  };
  auto get = [&](const Buffer& b, size_t n) {
    std::vector<float> v(n);
    be->copy_to_host(b, 0, n * sizeof(float), v.data());
    be->synchronize();
    return v;
  };
  const size_t n = 1000, offset = 10, count = 977;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = value(r, i);
  BufferPtr buf = put(mine);
  dc->all_reduce_sum(*buf, offset, count);  // values outside [offset, offset + count) stay
  const std::vector<float> got = get(*buf, n);
  bool ok = true;
  for (size_t i = 0; i < n && ok; ++i) {
    float want = mine[i];
    if (i >= offset && i < offset + count) {
      want = 0;
      for (int k = 0; k < n_ranks; ++k) want += value(k, i);
    }
    ok = got[i] == want;
  }
  expect(ok, "device all_reduce_sum", r);
  BufferPtr in = put(mine), gathered = be->alloc(DType::F32, n * static_cast<size_t>(n_ranks));
  dc->all_gather(*in, n, *gathered);
  const std::vector<float> all = get(*gathered, n * static_cast<size_t>(n_ranks));
  ok = true;
  for (int k = 0; k < n_ranks && ok; ++k)
    for (size_t i = 0; i < n && ok; ++i) ok = all[static_cast<size_t>(k) * n + i] == value(k, i);
  expect(ok, "device all_gather", r);
  BufferPtr b = put(mine);
  dc->broadcast(*b, n, n_ranks - 1);
  const std::vector<float> bc = get(*b, n);
  ok = true;
  for (size_t i = 0; i < n && ok; ++i) ok = bc[i] == value(n_ranks - 1, i);
  expect(ok, "device broadcast", r);
  // Sends are asynchronous (staged on the host): rank 0 sends several before
  // the receiver takes any, and overwrites its buffer after each.
  if (n_ranks > 1) {
    if (r == 0) {
      for (int k = 0; k < 12; ++k) {
        std::vector<float> v(n, static_cast<float>(k));
        be->copy_from_host(v.data(), *b, 0, n * sizeof(float));
        dc->send(*b, n, 1);
      }
    } else if (r == 1) {
      ok = true;
      for (int k = 0; k < 12; ++k) {
        dc->recv(*b, n, 0);
        const std::vector<float> v = get(*b, n);
        ok = ok && std::all_of(v.begin(), v.end(), [k](float x) { return x == static_cast<float>(k); });
      }
      expect(ok, "device send / recv in order", r);
    }
  }
  dc.reset();  // waits for its sends
  c.barrier();
}

void bench(pagellm::dist::Communicator& c) {
  if (c.rank() == 0) std::printf("bytes,algorithm,median_us\n");
  // One token of TinyLlama (2048 floats) up to a 512-token prefill step.
  for (size_t bytes : {size_t{8} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    const size_t n = bytes / sizeof(float);
    std::vector<float> v(n, 1.0f);
    for (AllReduceAlgo algo : {AllReduceAlgo::Library, AllReduceAlgo::ReduceScatterAllGather}) {
      std::vector<double> us;
      for (int rep = 0; rep < 60; ++rep) {
        c.barrier();
        const int64_t t0 = pagellm::ThreadPool::now_ns();
        c.all_reduce_sum(v.data(), n, algo);
        const int64_t t1 = pagellm::ThreadPool::now_ns();
        if (rep >= 10) us.push_back(static_cast<double>(t1 - t0) * 1e-3);
        std::fill(v.begin(), v.end(), 1.0f);
      }
      std::sort(us.begin(), us.end());
      if (c.rank() == 0) std::printf("%zu,%s,%.1f\n", bytes, pagellm::dist::to_string(algo), us[us.size() / 2]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto c = pagellm::dist::make_mpi_communicator();
  if (c->rank() == 0) std::printf("%s\n", c->describe().c_str());
  check_all(*c);
  check_device_comm(*c);
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) bench(*c);
  // --expect-all-reduce TEXT: how describe() says the algorithm is chosen
  // (pagellm's rules by default; the user's OMPI_MCA_coll_tuned_* win).
  if (argc > 2 && std::strcmp(argv[1], "--expect-all-reduce") == 0)
    expect(c->describe().find(argv[2]) != std::string::npos, "describe() has " + std::string(argv[2]), c->rank());
  int bad = failures;
  c->all_reduce_sum(reinterpret_cast<float*>(&bad), 0);  // (keeps every rank here until all are done)
  c->barrier();
  if (c->rank() == 0) std::printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
