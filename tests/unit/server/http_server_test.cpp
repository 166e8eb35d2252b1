// HttpServer + HttpConnections in-process over loopback sockets: routing,
// keep-alive, refusals from the reactor, and ClientWatch seeing a client
// reset, close or half-close while its handler runs. (Under TSan this covers
// the hand-offs between the reactor, the pools and the handlers.)
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace pagellm::server {
namespace {

using namespace std::chrono_literals;

class TestServer {
 public:
  explicit TestServer(ConnectionOptions co = {}) {
    HttpServerOptions o;
    o.port = 0;
    co.worker_threads = 4;
    co.control_threads = 1;
    o.connections = co;
    http_ = std::make_unique<HttpServer>(o);
    http_->get("/ping", [](const httplib::Request&, httplib::Response& res) { res.set_content("pong", "text/plain"); });
    http_->post("/echo", [](const httplib::Request& req, httplib::Response& res) { res.set_content(req.body, "x/y"); });
    // Waits until its client is gone (or 1.5 s), then says which.
    http_->post("/wait", [this](const httplib::Request&, httplib::Response& res) {
      ClientWatch watch = ClientWatch::current();
      const auto deadline = std::chrono::steady_clock::now() + 1500ms;
      bool gone = false;
      while (!gone && std::chrono::steady_clock::now() < deadline) {
        gone = watch.gone();
        std::this_thread::sleep_for(10ms);
      }
      saw_gone_ = gone;
      handled_++;
      res.set_content(gone ? "gone" : "present", "text/plain");
    });
    http_->set_head_check([](const RequestHead& h) -> std::optional<HttpRefusal> {
      if (h.path() == "/secret") return HttpRefusal{401, "no", "invalid_api_key"};
      return std::nullopt;
    });
    http_->bind();
    thread_ = std::thread([this] { http_->run(); });
  }
  ~TestServer() {
    http_->stop();
    thread_.join();
  }
  int port() const { return http_->port(); }
  std::atomic<int> handled_{0};
  std::atomic<bool> saw_gone_{false};

 private:
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) { ASSERT_EQ(send(fd, s.data(), s.size(), MSG_NOSIGNAL), (ssize_t)s.size()); }

// Everything until the server closes (or `until` appears).
std::string read_until(int fd, const std::string& until = "") {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (!until.empty() && out.find(until) != std::string::npos) break;
  }
  return out;
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  TestServer s;
  const int fd = connect_to(s.port());
  for (int i = 0; i < 3; ++i) {
    send_all(fd, "POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
    EXPECT_NE(read_until(fd, "hello").find("200 OK"), std::string::npos);
  }
  send_all(fd, "GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string reply = read_until(fd);
  EXPECT_NE(reply.find("pong"), std::string::npos);
  close(fd);
}

TEST(HttpServer, HeadCheckRefusesBeforeTheBody) {
  TestServer s;
  const int fd = connect_to(s.port());
  send_all(fd, "POST /secret HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n");  // no body follows
  const std::string reply = read_until(fd);
  EXPECT_NE(reply.find("401 Unauthorized"), std::string::npos) << reply;
  EXPECT_NE(reply.find("invalid_api_key"), std::string::npos);
  close(fd);
}

TEST(HttpServer, ReaderRefusalsAndUnknownRoutesAreOpenAIErrors) {
  TestServer s;
  for (const auto& [wire, status] : std::vector<std::pair<std::string, std::string>>{
           {"BAD\r\n\r\n", "400"}, {"GET /nope HTTP/1.1\r\n\r\n", "404"}, {"DELETE /ping HTTP/1.1\r\n\r\n", "405"}}) {
    const int fd = connect_to(s.port());
    send_all(fd, wire);
    const std::string reply = read_until(fd, "}}");
    EXPECT_EQ(reply.substr(9, 3), status) << reply;
    EXPECT_NE(reply.find("\"error\""), std::string::npos) << reply;
    close(fd);
  }
}

TEST(HttpServer, WatchSeesAReset) {
  TestServer s;
  const int fd = connect_to(s.port());
  send_all(fd, "POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  std::this_thread::sleep_for(100ms);
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);  // RST
  for (int i = 0; i < 300 && s.handled_ == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.handled_, 1);
  EXPECT_TRUE(s.saw_gone_);
}

TEST(HttpServer, WatchSeesAClose) {
  TestServer s;
  const int fd = connect_to(s.port());
  send_all(fd, "POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  std::this_thread::sleep_for(100ms);
  close(fd);  // FIN; the probe then bounces
  for (int i = 0; i < 300 && s.handled_ == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.handled_, 1);
  EXPECT_TRUE(s.saw_gone_);
}

TEST(HttpServer, HalfClosedClientGetsItsReply) {
  TestServer s;
  const int fd = connect_to(s.port());
  send_all(fd, "POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  shutdown(fd, SHUT_WR);
  const std::string reply = read_until(fd);
  EXPECT_NE(reply.find("100 Continue"), std::string::npos) << reply;  // the probe
  EXPECT_NE(reply.find("200 OK"), std::string::npos) << reply;
  EXPECT_NE(reply.find("present"), std::string::npos) << reply;
  close(fd);
}

TEST(HttpServer, SlowHeadGets408AndIdleConnectionsClose) {
  ConnectionOptions co;
  co.header_timeout = 300ms;
  co.keep_alive_timeout = 300ms;
  TestServer s(co);
  const int slow = connect_to(s.port());
  send_all(slow, "GET /ping HTTP/1.1\r\n");
  const int idle = connect_to(s.port());
  EXPECT_NE(read_until(slow).find("408 Request Timeout"), std::string::npos);
  EXPECT_EQ(read_until(idle), "");  // closed without a reply
  close(slow);
  close(idle);
}

TEST(HttpServer, ConnectionCapAnswers503) {
  ConnectionOptions co;
  co.max_connections = 3;
  TestServer s(co);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_to(s.port()));
  std::this_thread::sleep_for(100ms);
  const int extra = connect_to(s.port());
  send_all(extra, "GET /ping HTTP/1.1\r\n\r\n");
  EXPECT_NE(read_until(extra).find("503 Service Unavailable"), std::string::npos);
  close(extra);
  for (int fd : held) close(fd);
}

}  // namespace
}  // namespace pagellm::server
