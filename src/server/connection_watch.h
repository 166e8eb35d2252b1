// Has the client of a request gone away? httplib 0.11 does not hand its
// connection's socket to handlers, so the watch finds it once, by the
// request's address pair among this process's sockets, then polls it for a
// hang-up (POLLRDHUP) without reading. Streaming handlers also see failed
// writes; this catches clients that leave while their request waits in the
// queue, runs its prefill, or is non-streaming.
#pragma once

#include <string>

namespace pagellm::server {

class ConnectionWatch {
 public:
  ConnectionWatch(std::string local_addr, int local_port, std::string remote_addr, int remote_port);
  // True once the peer closed or reset the connection. False when the socket
  // cannot be found (the watch then never fires).
  bool peer_closed();

 private:
  int find_socket() const;

  std::string local_addr_, remote_addr_;
  int local_port_, remote_port_;
  int fd_ = -2;  // -2: not looked up yet; -1: not found
};

// Shuts down (both directions) every connected socket of this process whose
// local port is `local_port`: at server shutdown, after the last handler
// finished, this ends idle keep-alive connections at once instead of letting
// httplib's workers wait out the keep-alive timeout.
void shutdown_connections_on_port(int local_port);

}  // namespace pagellm::server
