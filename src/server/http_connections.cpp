#include "server/http_connections.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "server/http_errors.h"
#include "server/openai_response.h"

namespace pagellm::server {

using Clock = std::chrono::steady_clock;

// One client socket. The reactor owns it while it is idle or reading a
// request; a worker owns it while a request runs (never both: the reactor
// drops the socket from epoll before dispatch).
class Connection {
 public:
  enum class Phase { kReading, kRunning, kReplying, kLingering };

  Connection(int fd, const HttpLimits& limits) : fd(fd), reader(limits) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) address(a, len, remote_ip, remote_port);
    len = sizeof a;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) address(a, len, local_ip, local_port);
  }

  // Writes all of `data` (the socket is non-blocking), waiting for room at
  // most `timeout` each time the client's window is full.
  bool write_all(const char* data, size_t n, std::chrono::milliseconds timeout) {
    while (n > 0 && !write_failed) {
      const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        data += sent;
        n -= static_cast<size_t>(sent);
        response_bytes += static_cast<size_t>(sent);
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_writable(timeout)) continue;
      write_failed = true;
    }
    return !write_failed;
  }

  bool wait_writable(std::chrono::milliseconds timeout) const {
    pollfd p{fd, POLLOUT, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
    while (rc < 0 && errno == EINTR);
    return rc > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
  }

  // Polls without reading: the peer reset (or our probe bounced) -> gone.
  bool gone(const std::function<bool()>& probe) {
    if (write_failed) return true;
    pollfd p{fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    if (p.revents & POLLRDHUP) {
      peer_eof = true;
      if (!probed) {
        probed = true;
        if (response_bytes == 0) {
          // HTTP/1.1 clients must accept interim responses (RFC 9110 15.2).
          static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
          if (http11 && !write_all(kContinue, sizeof kContinue - 1, std::chrono::milliseconds(100))) return true;
          response_bytes = 0;  // an interim reply does not start the response
        } else if (probe && !probe()) {
          return true;
        }
        // A closed socket answers the probe with a reset: wait a moment for
        // it, so the client counts as gone now rather than a poll interval
        // later (a half-closed client that still reads sends none).
        return reset_within(std::chrono::milliseconds(20));
      }
    }
    return false;
  }

  // No events asked: poll wakes only for an error or hang-up (a reset), not
  // for the FIN already seen.
  bool reset_within(std::chrono::milliseconds wait) const {
    pollfd p{fd, 0, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(wait.count()));
    while (rc < 0 && errno == EINTR);
    return rc > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0;
  }

  const int fd;
  std::string local_ip, remote_ip;
  int local_port = 0, remote_port = 0;

  HttpRequestReader reader;
  bool head_checked = false;
  std::string leftover;  // bytes of a pipelined next request
  Phase phase = Phase::kReading;
  Clock::time_point deadline;
  size_t requests = 0;
  bool quick = false;  // runs on the control pool
  std::string path;    // of the request being read, for metrics

  std::string reply;  // a refusal being written by the reactor
  size_t reply_sent = 0;

  // Worker-side state of the running request.
  bool http11 = true;
  bool peer_eof = false;
  bool probed = false;
  bool write_failed = false;
  size_t response_bytes = 0;

 private:
  static void address(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
    char h[NI_MAXHOST], s[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return;
    host = h;
    port = std::atoi(s);
  }
};

namespace {

thread_local std::shared_ptr<Connection> t_client;

// The buffered request as httplib reads it, and the socket it writes to.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(Connection& c, std::string request, std::chrono::milliseconds write_timeout)
      : c_(c), request_(std::move(request)), write_timeout_(write_timeout) {}

  bool is_readable() const override { return pos_ < request_.size(); }
  bool is_writable() const override { return !c_.write_failed && c_.wait_writable(write_timeout_); }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - pos_);
    std::memcpy(ptr, request_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    return c_.write_all(ptr, size, write_timeout_) ? static_cast<ssize_t>(size) : -1;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.remote_ip;
    port = c_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  // httplib only compares it with FD_SETSIZE (for select); we never select.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  Connection& c_;
  std::string request_;
  size_t pos_ = 0;
  std::chrono::milliseconds write_timeout_;
};

std::string error_reply_bytes(int status, const std::string& message, const std::string& code) {
  const std::string body = dump_json(error_body(status, message, "", code));
  return fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}", status,
      http_status_text(status), body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
}

}  // namespace

ClientWatch ClientWatch::current() { return ClientWatch(t_client); }

bool ClientWatch::gone(const std::function<bool()>& probe) { return c_ && c_->gone(probe); }

// A fixed set of threads over a queue of connections with a complete request.
class HttpConnections::Pool {
 public:
  Pool(int threads, std::function<void(const ConnPtr&)> run) : run_(std::move(run)) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() { shutdown(); }
  void push(ConnPtr c) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(c));
    }
    cv_.notify_one();
  }
  // Lets running requests finish; queued ones are not started (returned).
  std::deque<ConnPtr> shutdown() {
    std::deque<ConnPtr> left;
    {
      std::lock_guard lock(mu_);
      if (done_) return left;
      done_ = true;
      left.swap(queue_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    return left;
  }

 private:
  void loop() {
    for (;;) {
      ConnPtr c;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        c = std::move(queue_.front());
        queue_.pop_front();
      }
      run_(c);
    }
  }
  std::function<void(const ConnPtr&)> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ConnPtr> queue_;
  std::vector<std::thread> threads_;
  bool done_ = false;
};

HttpConnections::HttpConnections(ConnectionOptions options, Serve serve, HeadCheck check, IsQuick quick,
                                 OnRefusal on_refusal)
    : options_(std::move(options)),
      serve_(std::move(serve)),
      check_(std::move(check)),
      quick_(std::move(quick)),
      on_refusal_(std::move(on_refusal)) {}

HttpConnections::~HttpConnections() { stop(std::chrono::milliseconds(0)); }

void HttpConnections::start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  PAGELLM_CHECK(epoll_fd_ >= 0 && wake_fd_ >= 0, "cannot create the connection reactor: {}", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  auto run = [this](const ConnPtr& c) { serve_on_worker(c); };
  workers_ = std::make_unique<Pool>(options_.worker_threads, run);
  control_ = std::make_unique<Pool>(options_.control_threads, run);
  reactor_ = std::thread([this] { reactor_loop(); });
}

void HttpConnections::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void HttpConnections::adopt(int fd) {
  if (stopping_ || !reactor_.joinable()) {
    ::close(fd);
    return;
  }
  {
    std::lock_guard lock(inbox_mu_);
    adopted_.push_back(fd);
  }
  wake();
}

void HttpConnections::watch_fd(const ConnPtr& c, uint32_t events, bool add) {
  epoll_event ev{};
  ev.events = events | EPOLLRDHUP;
  ev.data.fd = c->fd;
  epoll_ctl(epoll_fd_, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
}

void HttpConnections::reactor_loop() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!reactor_done_) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t v;
        while (::read(wake_fd_, &v, sizeof v) > 0) {
        }
        continue;
      }
      auto it = conns_.find(events[i].data.fd);
      // A copy: handling may close the connection and erase the map's entry.
      if (it != conns_.end()) handle_events(ConnPtr(it->second), events[i].events);
    }
    std::vector<int> adopted;
    std::vector<ConnPtr> returned;
    {
      std::lock_guard lock(inbox_mu_);
      adopted.swap(adopted_);
      returned.swap(returned_);
    }
    for (int fd : adopted) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      auto c = std::make_shared<Connection>(fd, options_.limits);
      conns_[fd] = c;
      open_++;
      c->deadline = Clock::now() + options_.header_timeout;
      watch_fd(c, EPOLLIN, true);
      if (stopping_) {
        refuse(c, {503, "the server is shutting down", "shutting_down"});
      } else if (conns_.size() > options_.max_connections) {
        refuse(c, {503, fmt::format("too many connections (the limit is {}); try again later", options_.max_connections),
                   "overloaded"});
      }
    }
    for (const ConnPtr& c : returned) resume(c);
    if (Clock::now() - last_sweep >= std::chrono::milliseconds(100)) {
      last_sweep = Clock::now();
      sweep_deadlines();
    }
  }
  for (auto& [fd, c] : conns_) ::close(fd);
  open_ -= conns_.size();
  conns_.clear();
}

void HttpConnections::handle_events(const ConnPtr& c, uint32_t events) {
  switch (c->phase) {
    case Connection::Phase::kReading:
      return read_request(c);
    case Connection::Phase::kReplying:
      if (events & (EPOLLERR | EPOLLHUP)) return close_now(c);
      return flush_reply(c);
    case Connection::Phase::kLingering: {
      char buf[16384];
      for (;;) {
        const ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        return close_now(c);
      }
    }
    case Connection::Phase::kRunning:
      return;  // not watched while a worker has it
  }
}

void HttpConnections::read_request(const ConnPtr& c) {
  char buf[65536];
  bool eof = false;
  while (c->reader.state() == HttpRequestReader::State::kHead || c->reader.state() == HttpRequestReader::State::kBody) {
    const ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
    if (n > 0) {
      const bool was_started = c->reader.started();
      const size_t used = c->reader.feed(std::string_view(buf, static_cast<size_t>(n)));
      if (used < static_cast<size_t>(n)) c->leftover.append(buf + used, static_cast<size_t>(n) - used);
      if (!was_started && c->reader.started()) c->deadline = Clock::now() + options_.header_timeout;
      if (c->reader.head_ready() && !c->head_checked) break;  // check before reading the body
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    eof = true;  // closed or reset
    break;
  }
  if (eof) c->peer_eof = true;
  advance(c);
  // A client that closed mid-request is gone; one that half-closed after a
  // whole request still gets its reply (advance dispatched it).
  if (eof && c->phase == Connection::Phase::kReading) close_now(c);
}

void HttpConnections::advance(const ConnPtr& c) {
  HttpRequestReader& r = c->reader;
  if (r.state() == HttpRequestReader::State::kFailed) return refuse(c, r.refusal());
  if (r.head_ready() && !c->head_checked) {
    c->head_checked = true;
    c->path = r.head().path();
    if (check_)
      if (auto refusal = check_(r.head())) return refuse(c, *refusal);
    c->deadline = Clock::now() + options_.body_timeout;
    if (r.expects_continue() && r.state() == HttpRequestReader::State::kBody) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] ssize_t n = ::send(c->fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    // The body may already be buffered: go on reading it now.
    if (r.state() == HttpRequestReader::State::kBody && !c->peer_eof) return read_request(c);
  }
  if (r.state() == HttpRequestReader::State::kFailed) return refuse(c, r.refusal());
  if (r.state() == HttpRequestReader::State::kComplete) dispatch(c);
}

void HttpConnections::refuse(const ConnPtr& c, const HttpRefusal& r) {
  spdlog::debug("HTTP {} from {}:{}: {}", r.status, c->remote_ip, c->remote_port, r.message);
  if (on_refusal_) on_refusal_(c->path, r.status);
  c->reply = error_reply_bytes(r.status, r.message, r.code);
  c->reply_sent = 0;
  c->phase = Connection::Phase::kReplying;
  c->deadline = Clock::now() + options_.write_timeout;
  watch_fd(c, EPOLLOUT, false);
  flush_reply(c);
}

void HttpConnections::flush_reply(const ConnPtr& c) {
  while (c->reply_sent < c->reply.size()) {
    const ssize_t n =
        ::send(c->fd, c->reply.data() + c->reply_sent, c->reply.size() - c->reply_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->reply_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    return close_now(c);
  }
  linger(c);
}

// After a refusal the client may still be sending: read and drop what comes
// for a moment, so that closing does not reset the connection before the
// client has read the reply.
void HttpConnections::linger(const ConnPtr& c) {
  ::shutdown(c->fd, SHUT_WR);
  c->phase = Connection::Phase::kLingering;
  c->deadline = Clock::now() + std::chrono::seconds(2);
  watch_fd(c, EPOLLIN, false);
}

void HttpConnections::dispatch(const ConnPtr& c) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  c->phase = Connection::Phase::kRunning;
  c->quick = quick_ && quick_(c->reader.head());
  c->http11 = c->reader.head().version == "HTTP/1.1";
  c->probed = false;
  c->write_failed = false;
  c->response_bytes = 0;
  running_++;
  {
    std::lock_guard lock(running_mu_);
    running_conns_.push_back(c);
  }
  (c->quick ? control_ : workers_)->push(c);
}

void HttpConnections::serve_on_worker(const ConnPtr& c) {
  const bool close_after = stopping_ || c->peer_eof || c->requests + 1 >= options_.keep_alive_max_requests;
  bool closed = false, ok = false;
  {
    RequestStream strm(*c, c->reader.normalized(), options_.write_timeout);
    t_client = c;
    try {
      ok = serve_(strm, close_after, closed);
    } catch (const std::exception& e) {
      spdlog::error("HTTP request failed outside its handler: {}", e.what());
    }
    t_client.reset();
  }
  c->requests++;
  if (!ok || closed || close_after || c->write_failed) c->peer_eof = true;  // resume() closes it
  {
    std::lock_guard lock(running_mu_);
    std::erase(running_conns_, c);
  }
  {
    std::lock_guard lock(inbox_mu_);
    returned_.push_back(c);
  }
  running_--;
  wake();
}

void HttpConnections::resume(const ConnPtr& c) {
  if (c->peer_eof || stopping_) {
    ::shutdown(c->fd, SHUT_RDWR);
    return close_now(c);
  }
  c->reader.reset();
  c->head_checked = false;
  c->path.clear();
  c->phase = Connection::Phase::kReading;
  c->deadline = Clock::now() + options_.keep_alive_timeout;
  watch_fd(c, EPOLLIN, true);
  if (!c->leftover.empty()) {
    std::string pipelined;
    pipelined.swap(c->leftover);
    const size_t used = c->reader.feed(pipelined);
    c->leftover = pipelined.substr(used);
    if (c->reader.started()) c->deadline = Clock::now() + options_.header_timeout;
    advance(c);
  }
}

void HttpConnections::close_now(const ConnPtr& conn) {
  const ConnPtr c = conn;  // `conn` may be the map's own entry, which erase destroys
  if (conns_.erase(c->fd) == 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  open_--;
}

void HttpConnections::sweep_deadlines() {
  const auto now = Clock::now();
  std::vector<ConnPtr> expired;
  for (auto& [fd, c] : conns_)
    if (c->phase != Connection::Phase::kRunning && now >= c->deadline) expired.push_back(c);
  for (const ConnPtr& c : expired) {
    if (c->phase == Connection::Phase::kReading && c->reader.started()) {
      const bool in_head = !c->reader.head_ready();
      refuse(c, {408,
                 in_head ? fmt::format("the request head was not received within {} s",
                                       options_.header_timeout.count() / 1000.0)
                         : fmt::format("the request body was not received within {} s",
                                       options_.body_timeout.count() / 1000.0),
                 "request_timeout"});
    } else {
      close_now(c);  // idle keep-alive, or a reply / linger that timed out
    }
  }
}

void HttpConnections::stop(std::chrono::milliseconds grace) {
  if (!reactor_.joinable() || stopping_.exchange(true)) return;
  wake();
  // Running requests finish on their own (they were told to close after).
  const auto deadline = Clock::now() + grace;
  while (running_ > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard lock(running_mu_);
    for (const ConnPtr& c : running_conns_) ::shutdown(c->fd, SHUT_RDWR);  // their writes fail now
  }
  for (Pool* p : {workers_.get(), control_.get()})
    for (const ConnPtr& c : p->shutdown()) {  // queued, never started
      std::lock_guard lock(inbox_mu_);
      c->peer_eof = true;
      returned_.push_back(c);
    }
  reactor_done_ = true;
  wake();
  reactor_.join();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

}  // namespace pagellm::server
