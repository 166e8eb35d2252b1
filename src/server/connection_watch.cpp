#include "server/connection_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace pagellm::server {
namespace {

// Numeric host and port of a socket address, as httplib reports them.
bool address_of(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

struct Endpoint {
  std::string host;
  int port = 0;
};

// Calls visit(fd, local, peer) for each connected socket of this process
// until it returns false.
template <typename Visit>
void for_each_connected_socket(Visit visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    Endpoint p, s;
    if (!address_of(peer, peer_len, p.host, p.port) || !address_of(self, self_len, s.host, s.port)) continue;
    if (!visit(static_cast<int>(fd), s, p)) break;
  }
  closedir(dir);
}

}  // namespace

ConnectionWatch::ConnectionWatch(std::string local_addr, int local_port, std::string remote_addr, int remote_port)
    : local_addr_(std::move(local_addr)),
      remote_addr_(std::move(remote_addr)),
      local_port_(local_port),
      remote_port_(remote_port) {}

int ConnectionWatch::find_socket() const {
  if (local_port_ <= 0 || remote_port_ <= 0) return -1;
  int found = -1;
  for_each_connected_socket([&](int fd, const Endpoint& self, const Endpoint& peer) {
    if (peer.port == remote_port_ && self.port == local_port_ && peer.host == remote_addr_ &&
        self.host == local_addr_) {
      found = fd;
      return false;
    }
    return true;
  });
  return found;
}

void shutdown_connections_on_port(int local_port) {
  for_each_connected_socket([&](int fd, const Endpoint& self, const Endpoint&) {
    if (self.port == local_port) ::shutdown(fd, SHUT_RDWR);
    return true;
  });
}

bool ConnectionWatch::peer_closed() {
  if (fd_ == -2) fd_ = find_socket();
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace pagellm::server
