#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <regex>
#include <thread>

#include "core/error.h"
#include "server/connection_watch.h"
#include "server/metrics_render.h"
#include "server/openai_response.h"

namespace pagellm::server {

namespace {
thread_local bool t_counted_request = false;  // this thread's request is in in_flight_
}  // namespace

// httplib::Server with a longer listen backlog: 0.11 hard-codes 5, too few
// for a burst of concurrent clients (the kernel drops SYNs past it).
class HttpServer::Impl : public httplib::Server {
 public:
  void widen_backlog(int backlog) { ::listen(svr_sock_, backlog); }
};

void set_error_reply(httplib::Response& res, const ErrorReply& reply) {
  res.status = reply.status;
  res.set_content(dump_json(reply.body), "application/json");
  if (reply.status == 503) res.set_header("Retry-After", "1");
}

HttpServer::HttpServer(HttpServerOptions options, HttpCounters* counters)
    : options_(std::move(options)), counters_(counters), impl_(std::make_unique<Impl>()) {
  const size_t threads = static_cast<size_t>(std::max(1, options_.threads));
  impl_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->set_payload_max_length(options_.max_request_bytes);

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
                         413, fmt::format("the request body exceeds the limit of {} bytes", options_.max_request_bytes),
                         "", "request_too_large")});
    } else {
      set_error_reply(
          res, {res.status, error_body(res.status, res.status == 400 ? "malformed HTTP request"
                                                                     : fmt::format("HTTP error {}", res.status))});
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  // Requests between routing and the end of their response (written or
  // failed), so that stop() lets them finish. Both hooks run on the
  // connection's thread.
  impl_->set_pre_routing_handler([this](const httplib::Request&, httplib::Response&) {
    in_flight_++;
    t_counted_request = true;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  impl_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (counters_) counters_->add(route_label(req.path), res.status);
    if (t_counted_request) {
      t_counted_request = false;
      in_flight_--;
    }
  });
}

HttpServer::~HttpServer() { stop(); }

std::string HttpServer::route_label(const std::string& path) const {
  if (methods_by_path_.count(path)) return path;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  return "other";
}

void HttpServer::add(const std::string& method, const std::string& path, Handler handler) {
  if (path.find('(') == std::string::npos) methods_by_path_[path].insert(method);
  auto wrapped = [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      if (req.body.size() > options_.max_request_bytes)  // chunked uploads skip httplib's own check
        throw HttpError(413, fmt::format("the request body exceeds the limit of {} bytes", options_.max_request_bytes),
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
  else
    fail("unsupported method {}", method);
}

void HttpServer::get(const std::string& path, Handler handler) { add("GET", path, std::move(handler)); }
void HttpServer::post(const std::string& path, Handler handler) { add("POST", path, std::move(handler)); }

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
}

void HttpServer::run() { impl_->listen_after_bind(); }

void HttpServer::stop() {
  if (!impl_ || !impl_->is_running()) return;
  impl_->stop();  // no new connections
  // Responses being written finish (bounded); then idle keep-alive
  // connections, which would hold their workers for the keep-alive timeout,
  // are ended at once.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (in_flight_ > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (port_ > 0) shutdown_connections_on_port(port_);
}

}  // namespace pagellm::server
