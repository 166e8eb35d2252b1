// ConnectionWatch over real loopback sockets: it finds the accepted socket by
// its address pair and sees the client hang up.
#include "server/connection_watch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace pagellm::server {
namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (peer)
    getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

struct Loopback {
  int listener = -1, client = -1, accepted = -1;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(listener, 4);
    a.sin_port = htons(static_cast<uint16_t>(port_of(listener, false)));
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a);
    accepted = accept(listener, nullptr, nullptr);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted})
      if (fd >= 0) close(fd);
  }
  ConnectionWatch watch() const {
    return ConnectionWatch("127.0.0.1", port_of(accepted, false), "127.0.0.1", port_of(accepted, true));
  }
};

bool eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 200; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ServerConnectionWatch, SeesTheClientClose) {
  Loopback l;
  ASSERT_GE(l.accepted, 0);
  ConnectionWatch w = l.watch();
  EXPECT_FALSE(w.peer_closed());
  // Data waiting to be read is not a hang-up.
  ASSERT_EQ(send(l.client, "x", 1, 0), 1);
  EXPECT_FALSE(w.peer_closed());
  close(l.client);
  l.client = -1;
  EXPECT_TRUE(eventually([&] { return w.peer_closed(); }));
}

TEST(ServerConnectionWatch, UnknownConnectionNeverFires) {
  ConnectionWatch w("127.0.0.1", 1, "127.0.0.1", 2);
  EXPECT_FALSE(w.peer_closed());
  ConnectionWatch none("", -1, "", -1);
  EXPECT_FALSE(none.peer_closed());
}

TEST(ServerConnectionWatch, ShutdownConnectionsOnPort) {
  Loopback l;
  ASSERT_GE(l.accepted, 0);
  shutdown_connections_on_port(port_of(l.accepted, false));
  char c;
  EXPECT_EQ(recv(l.client, &c, 1, 0), 0);  // the client sees the server end the connection
}

}  // namespace
}  // namespace pagellm::server
