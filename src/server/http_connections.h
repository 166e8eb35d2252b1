// Client connections, from accept to close, in front of cpp-httplib's
// request handling. httplib 0.11 gives each connection a thread from the
// moment it is accepted, reads heads and bodies without an overall deadline,
// inflates or de-chunks bodies before any limit applies, and hides the socket
// from handlers. Here instead:
//   - one reactor thread (epoll) owns every connection that is not running a
//     request: it reads the head and body with HttpRequestReader under their
//     deadlines and limits, answers refusals itself (400/401/408/413/431/503)
//     and keeps idle keep-alive connections without a thread;
//   - a complete request goes to a worker pool (generation requests) or a
//     small control pool (health, metrics, models, tokenize), so probes are
//     answered while every worker streams;
//   - the worker runs httplib's routing over the buffered request and writes
//     the response to the socket; handlers see their client through
//     ClientWatch, which polls the socket itself (a reset peer has no address
//     left to look up).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_request_reader.h"

namespace httplib {
class Stream;
}

namespace pagellm::server {

struct ConnectionOptions {
  HttpLimits limits;
  std::chrono::milliseconds header_timeout{10'000};     // first byte of a request -> end of its head
  std::chrono::milliseconds body_timeout{60'000};       // end of the head -> end of the body
  std::chrono::milliseconds keep_alive_timeout{5'000};  // idle between requests
  std::chrono::milliseconds write_timeout{10'000};      // one blocked write to a client that does not read
  size_t keep_alive_max_requests = 1000;                // then the connection closes
  size_t max_connections = 2048;                        // more get 503 at once
  int worker_threads = 128;                             // requests served at once (streams hold one each)
  int control_threads = 4;                              // for quick routes
};

class Connection;

// The client of the request this thread is serving.
class ClientWatch {
 public:
  // The current request's client; outside a served request (unit tests that
  // call handlers directly) a watch that never fires.
  static ClientWatch current();

  // True once the client is gone (reset, or closed and our probe bounced).
  // A client that only half-closed (FIN after its request) may still be
  // reading: the first time a FIN is seen the watch probes once, with an
  // interim "100 Continue" before the response has started, or with
  // `probe` (an SSE comment, say) after it has; a peer that had closed
  // answers with a reset, which the next call sees.
  bool gone(const std::function<bool()>& probe = {});

 private:
  explicit ClientWatch(std::shared_ptr<Connection> c) : c_(std::move(c)) {}
  std::shared_ptr<Connection> c_;
};

class HttpConnections {
 public:
  // Runs one buffered request through the routes (httplib's process_request)
  // and writes the response to `strm`; false when the connection must close.
  using Serve = std::function<bool(httplib::Stream& strm, bool close_after, bool& connection_closed)>;
  // Called with the head before the body is read (authentication): a refusal
  // is answered at once and the body never read.
  using HeadCheck = std::function<std::optional<HttpRefusal>(const RequestHead&)>;
  // Which pool a request runs on.
  using IsQuick = std::function<bool(const RequestHead&)>;
  // Told of every refusal the reactor answers itself (for metrics).
  using OnRefusal = std::function<void(const std::string& path, int status)>;

  HttpConnections(ConnectionOptions options, Serve serve, HeadCheck check, IsQuick quick, OnRefusal on_refusal);
  ~HttpConnections();

  void start();
  // Takes an accepted socket (from the listener thread).
  void adopt(int fd);
  // Closes idle and half-read connections, lets running requests finish
  // for up to `grace`, then ends the rest.
  void stop(std::chrono::milliseconds grace);

  size_t open_connections() const { return open_.load(); }
  const ConnectionOptions& options() const { return options_; }

 private:
  class Pool;
  using ConnPtr = std::shared_ptr<Connection>;

  void reactor_loop();
  void handle_events(const ConnPtr& c, uint32_t events);
  void read_request(const ConnPtr& c);
  void advance(const ConnPtr& c);
  void refuse(const ConnPtr& c, const HttpRefusal& r);
  void flush_reply(const ConnPtr& c);
  void linger(const ConnPtr& c);
  void dispatch(const ConnPtr& c);
  void serve_on_worker(const ConnPtr& c);
  void resume(const ConnPtr& c);  // back from a worker: next request or close
  void close_now(const ConnPtr& c);
  void sweep_deadlines();
  void watch_fd(const ConnPtr& c, uint32_t events, bool add);
  void wake();

  ConnectionOptions options_;
  Serve serve_;
  HeadCheck check_;
  IsQuick quick_;
  OnRefusal on_refusal_;

  int epoll_fd_ = -1, wake_fd_ = -1;
  std::thread reactor_;
  std::unique_ptr<Pool> workers_, control_;
  std::atomic<bool> stopping_{false}, reactor_done_{false};
  std::atomic<size_t> open_{0}, running_{0};

  // Reactor-thread state.
  std::unordered_map<int, ConnPtr> conns_;
  // Handed to the reactor by other threads.
  std::mutex inbox_mu_;
  std::vector<int> adopted_;
  std::vector<ConnPtr> returned_;
  std::vector<ConnPtr> running_conns_;  // for stop(): their sockets are shut down at the deadline
  std::mutex running_mu_;
};

}  // namespace pagellm::server
