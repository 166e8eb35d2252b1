#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include "core/error.h"
#include "server/metrics_render.h"
#include "server/openai_response.h"

namespace pagellm::server {

// httplib::Server whose accepted sockets go to HttpConnections instead of a
// thread each, and whose request handling runs over the buffered requests
// HttpConnections hands back. Also a longer listen backlog: 0.11 hard-codes
// 5, too few for a burst of concurrent clients (the kernel drops SYNs).
class HttpServer::Impl : public httplib::Server {
 public:
  Impl() {
    // The listener thread hands each socket over at once (adopt is quick).
    new_task_queue = [] { return new InlineQueue; };
    // httplib 0.11 sets SO_REUSEPORT, with which a second server on the same
    // port starts silently and the kernel splits clients between the two.
    // SO_REUSEADDR alone keeps quick restarts (TIME_WAIT) and makes a port
    // in use an error.
    set_socket_options([](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
  }
  void widen_backlog(int backlog) { ::listen(svr_sock_, backlog); }
  bool serve_one(httplib::Stream& strm, bool close_after, bool& closed) {
    return process_request(strm, close_after, closed, nullptr);
  }
  HttpConnections* connections = nullptr;

 private:
  struct InlineQueue : httplib::TaskQueue {
    void enqueue(std::function<void()> fn) override { fn(); }
    void shutdown() override {}
  };
  bool process_and_close_socket(socket_t sock) override {
    if (connections)
      connections->adopt(sock);
    else
      ::close(sock);
    return true;
  }
};

void set_error_reply(httplib::Response& res, const ErrorReply& reply) {
  res.status = reply.status;
  res.set_content(dump_json(reply.body), "application/json");
  if (reply.status == 503) res.set_header("Retry-After", "1");
}

HttpServer::HttpServer(HttpServerOptions options, HttpCounters* counters)
    : options_(std::move(options)), counters_(counters), impl_(std::make_unique<Impl>()) {
  const ConnectionOptions& co = options_.connections;
  impl_->set_payload_max_length(co.limits.max_body_bytes);
  // What httplib advertises in Keep-Alive headers; HttpConnections enforces it.
  impl_->set_keep_alive_timeout(std::max<time_t>(1, co.keep_alive_timeout.count() / 1000));
  impl_->set_keep_alive_max_count(co.keep_alive_max_requests);

  // httplib calls this for every response with status >= 400, ours included:
  // only bodies it left empty (its own 400/404/413) are filled here.
  impl_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      auto it = methods_by_path_.find(req.path);
      if (it != methods_by_path_.end()) {
        std::string allow;
        for (const auto& m : it->second) allow += (allow.empty() ? "" : ", ") + m;
        res.set_header("Allow", allow);
        set_error_reply(
            res,
            {405,
             error_body(405, fmt::format("method {} is not allowed on {} (allowed: {})", req.method, req.path, allow),
                        "", "method_not_allowed")});
      } else {
        set_error_reply(res,
                        {404, error_body(404, fmt::format("no route {} {}", req.method, req.path), "", "not_found")});
      }
    } else if (res.status == 413) {
      set_error_reply(
          res, {413, error_body(
                         413, fmt::format("the request body exceeds the limit of {} bytes", options_.max_request_bytes()),
                         "", "request_too_large")});
    } else {
      set_error_reply(
          res, {res.status, error_body(res.status, res.status == 400 ? "malformed HTTP request"
                                                                     : fmt::format("HTTP error {}", res.status))});
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  impl_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (counters_) counters_->add(route_label(req.path), res.status);
  });
}

HttpServer::~HttpServer() { stop(); }

std::string HttpServer::route_label(const std::string& path) const {
  if (methods_by_path_.count(path)) return path;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  if (path.starts_with("/v1/responses/")) return "/v1/responses/{id}";
  if (path.starts_with("/ui/")) return "/ui/{file}";
  return "other";
}

void HttpServer::add(const std::string& method, const std::string& path, Handler handler) {
  if (path.find('(') == std::string::npos) methods_by_path_[path].insert(method);
  auto wrapped = [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      if (req.body.size() > options_.max_request_bytes())  // HttpConnections refuses these first
        throw HttpError(413,
                        fmt::format("the request body exceeds the limit of {} bytes", options_.max_request_bytes()),
                        "request_too_large");
      handler(req, res);
    } catch (...) {
      const ErrorReply reply = error_reply_for_current_exception();
      const std::string& message = reply.body["error"]["message"].get_ref<const std::string&>();
      if (reply.status >= 500)
        spdlog::error("{} {} -> {}: {}", req.method, req.path, reply.status, message);
      else
        spdlog::info("{} {} -> {}: {}", req.method, req.path, reply.status, message);
      set_error_reply(res, reply);
    }
  };
  if (method == "GET")
    impl_->Get(path, wrapped);
  else if (method == "POST")
    impl_->Post(path, wrapped);
  else if (method == "DELETE")
    impl_->Delete(path, wrapped);
  else
    fail("unsupported method {}", method);
}

void HttpServer::get(const std::string& path, Handler handler) { add("GET", path, std::move(handler)); }
void HttpServer::post(const std::string& path, Handler handler) { add("POST", path, std::move(handler)); }
void HttpServer::del(const std::string& path, Handler handler) { add("DELETE", path, std::move(handler)); }

void HttpServer::bind() {
  if (options_.port == 0) {
    port_ = impl_->bind_to_any_port(options_.host);
    PAGELLM_CHECK(port_ > 0, "cannot listen on {} (any port)", options_.host);
  } else {
    PAGELLM_CHECK(impl_->bind_to_port(options_.host, options_.port),
                  "cannot listen on {}:{} (address in use or not available)", options_.host, options_.port);
    port_ = options_.port;
  }
  impl_->widen_backlog(options_.listen_backlog);
  start_connections();
}

void HttpServer::start_connections() {
  connections_ = std::make_unique<HttpConnections>(
      options_.connections,
      [this](httplib::Stream& strm, bool close_after, bool& closed) {
        return impl_->serve_one(strm, close_after, closed);
      },
      head_check_,
      [](const RequestHead& h) { return h.method == "GET"; },
      [this](const std::string& path, int status) {
        if (counters_) counters_->add(route_label(path), status);
      });
  connections_->start();
  impl_->connections = connections_.get();
}

void HttpServer::run() { impl_->listen_after_bind(); }

void HttpServer::stop() {
  if (!impl_ || stopped_.exchange(true)) return;
  impl_->stop();  // no new connections
  // Idle connections close now; responses being written finish (bounded).
  if (connections_) connections_->stop(std::chrono::seconds(5));
}

}  // namespace pagellm::server
