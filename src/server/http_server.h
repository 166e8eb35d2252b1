// The HTTP layer: cpp-httplib with a thread pool big enough for many
// concurrent streaming clients, a request size limit (413), OpenAI-shaped
// errors for everything httplib answers itself (404 unknown route, 405 wrong
// method, 413, 400 malformed HTTP), and the one wrapper that turns any
// exception a handler throws into an error reply: handlers never throw out.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "server/http_errors.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagellm::server {

class HttpCounters;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0: any free port
  size_t max_request_bytes = 16u << 20;  // larger bodies get 413
  int threads = 128;                     // connections served at once
  int listen_backlog = 1024;
};

class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  explicit HttpServer(HttpServerOptions options, HttpCounters* counters = nullptr);
  ~HttpServer();

  // `path` is matched exactly (it may hold a regex group, e.g. "/v1/models/(.+)").
  void get(const std::string& path, Handler handler);
  void post(const std::string& path, Handler handler);

  // Binds the listening socket; throws Error when the address is taken.
  void bind();
  // Serves until stop(). Call bind() first.
  void run();
  // Stops accepting, lets responses being written finish (up to 5 s), then
  // closes idle keep-alive connections. run() returns soon after.
  void stop();
  int port() const { return port_; }
  const HttpServerOptions& options() const { return options_; }

 private:
  class Impl;
  void add(const std::string& method, const std::string& path, Handler handler);
  std::string route_label(const std::string& path) const;

  HttpServerOptions options_;
  HttpCounters* counters_;
  std::unique_ptr<Impl> impl_;
  std::map<std::string, std::set<std::string>> methods_by_path_;  // for 405 and metric labels
  int port_ = 0;
  std::atomic<int64_t> in_flight_{0};  // requests routed and not yet answered
};

// Writes an error reply (status, JSON body).
void set_error_reply(httplib::Response& res, const ErrorReply& reply);

}  // namespace pagellm::server
