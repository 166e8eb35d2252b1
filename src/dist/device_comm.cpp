#include "dist/device_comm.h"

#include <deque>
#include <utility>
#include <vector>

#include "core/error.h"

namespace pagellm::dist {

namespace {

class HostDeviceComm : public DeviceComm {
 public:
  HostDeviceComm(Backend& backend, Communicator& host) : be_(backend), host_(host) {}
  ~HostDeviceComm() override {
    if (!sends_.empty()) host_.wait_sends(sends_.back().first);
  }

  std::string describe() const override { return "host copies + " + host_.describe(); }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void all_reduce_sum(Buffer& buf, size_t offset, size_t count) override {
    to_host(buf, offset, count, stage_);
    host_.all_reduce_sum(stage_.data(), count);
    from_host(stage_, buf, offset, count);
  }

  void all_gather(const Buffer& in, size_t count, Buffer& out) override {
    to_host(in, 0, count, stage_);
    gathered_.resize(count * static_cast<size_t>(host_.size()));
    host_.all_gather(stage_.data(), count, gathered_.data());
    from_host(gathered_, out, 0, gathered_.size());
  }

  void broadcast(Buffer& buf, size_t count, int root) override {
    if (host_.rank() == root) to_host(buf, 0, count, stage_);
    else stage_.resize(count);
    host_.broadcast(stage_.data(), count * sizeof(float), root);
    if (host_.rank() != root) from_host(stage_, buf, 0, count);
  }

  // Asynchronous, as a device's send in stream order would be: the values
  // are staged on the host and sent while the caller goes on (the first
  // pipeline stage runs ahead of the later ones so). A staging buffer is
  // reused once its send is done.
  void send(const Buffer& buf, size_t count, int dst) override {
    std::vector<float> staged;
    while (!sends_.empty() && sends_.size() >= kMaxSendsInFlight) {
      host_.wait_sends(sends_.front().first);
      staged = std::move(sends_.front().second);
      sends_.pop_front();
    }
    to_host(buf, 0, count, staged);
    const uint64_t ticket = host_.send_async(staged.data(), count * sizeof(float), dst);
    sends_.emplace_back(ticket, std::move(staged));
  }

  void recv(Buffer& buf, size_t count, int src) override {
    stage_.resize(count);
    host_.recv(stage_.data(), count * sizeof(float), src);
    from_host(stage_, buf, 0, count);
  }

 private:
  static constexpr size_t kMaxSendsInFlight = 8;

  void to_host(const Buffer& buf, size_t offset, size_t count, std::vector<float>& out) {
    out.resize(count);
    be_.copy_to_host(buf, offset * sizeof(float), count * sizeof(float), out.data());
    be_.synchronize();
  }
  void from_host(const std::vector<float>& in, Buffer& buf, size_t offset, size_t count) {
    be_.copy_from_host(in.data(), buf, offset * sizeof(float), count * sizeof(float));
    be_.synchronize();  // `in` is reused right after
  }

  Backend& be_;
  Communicator& host_;
  std::vector<float> stage_, gathered_;
  std::deque<std::pair<uint64_t, std::vector<float>>> sends_;  // (ticket, its staged values)
};

}  // namespace

std::unique_ptr<DeviceComm> make_host_device_comm(Backend& backend, Communicator& host) {
  return std::make_unique<HostDeviceComm>(backend, host);
}

std::unique_ptr<DeviceComm> make_device_comm(Backend& backend, Communicator& host) {
  if (!backend.has_device_comm()) return make_host_device_comm(backend, host);
  std::vector<uint8_t> id;
  if (host.rank() == 0) id = backend.comm_unique_id();
  uint64_t bytes = id.size();
  host.broadcast(&bytes, sizeof bytes, 0);
  PAGELLM_CHECK(bytes > 0 && bytes <= (1u << 20), "device communicator: a unique id of {} bytes", bytes);
  id.resize(bytes);
  host.broadcast(id.data(), id.size(), 0);
  auto comm = backend.comm_init(host.rank(), host.size(), id);
  PAGELLM_CHECK(comm && comm->rank() == host.rank() && comm->size() == host.size(),
                "the {} backend's communicator disagrees with the host group (rank {} of {})", backend.name(),
                host.rank(), host.size());
  return comm;
}

}  // namespace pagellm::dist
