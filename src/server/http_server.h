// The HTTP layer: connections are read under limits and deadlines by
// HttpConnections (http_connections.h); cpp-httplib routes each complete
// request to its handler. OpenAI-shaped errors for everything answered
// outside the handlers (404 unknown route, 405 wrong method, 400/408/413/431
// from the reader), and the one wrapper that turns any exception a handler
// throws into an error reply: handlers never throw out.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "server/http_connections.h"
#include "server/http_errors.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagellm::server {

class HttpCounters;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  int listen_backlog = 1024;
  ConnectionOptions connections;  // limits, deadlines, pools
  size_t max_request_bytes() const { return connections.limits.max_body_bytes; }
};

class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  explicit HttpServer(HttpServerOptions options, HttpCounters* counters = nullptr);
  ~HttpServer();

  // `path` is matched exactly (it may hold a regex group, e.g. "/v1/models/(.+)").
  // GET routes run on the control pool: quick answers even when every
  // worker streams.
  void get(const std::string& path, Handler handler);
  void post(const std::string& path, Handler handler);
  void del(const std::string& path, Handler handler);
  // Runs on each request's head before its body is read; a refusal is
  // answered at once (authentication).
  void set_head_check(HttpConnections::HeadCheck check) { head_check_ = std::move(check); }

  // Binds the listening socket; throws Error when the address is taken.
  void bind();
  // Serves until stop(). Call bind() first.
  void run();
  // Stops accepting, closes idle connections, lets running requests finish
  // (up to 5 s), then ends the rest. run() returns soon after.
  void stop();
  int port() const { return port_; }
  size_t open_connections() const { return connections_ ? connections_->open_connections() : 0; }
  const HttpServerOptions& options() const { return options_; }

 private:
  class Impl;
  void start_connections();
  void add(const std::string& method, const std::string& path, Handler handler);
  std::string route_label(const std::string& path) const;

  HttpServerOptions options_;
  HttpCounters* counters_;
  std::unique_ptr<Impl> impl_;
  std::map<std::string, std::set<std::string>> methods_by_path_;  // for 405 and metric labels
  HttpConnections::HeadCheck head_check_;
  std::unique_ptr<HttpConnections> connections_;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
};

// Writes an error reply (status, JSON body).
void set_error_reply(httplib::Response& res, const ErrorReply& reply);

}  // namespace pagellm::server
