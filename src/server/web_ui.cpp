#include "server/web_ui.h"

#include <fmt/format.h>
#include <httplib.h>

#include <functional>
#include <string>

#include "server/http_errors.h"
#include "server/http_server.h"
#include "server/web_assets.h"

namespace pagellm::server {
namespace {

std::string_view content_type(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".svg")) return "image/svg+xml";
  if (name.ends_with(".png")) return "image/png";
  return "application/octet-stream";
}

const WebAsset* find_asset(std::string_view name) {
  for (const WebAsset& asset : web_assets())
    if (asset.name == name) return &asset;
  return nullptr;
}

void send_asset(const httplib::Request& req, httplib::Response& res, const WebAsset& asset) {
  // The files change only with the binary: revalidated on each load (cheap
  // 304s), never stale after an upgrade.
  const std::string etag = fmt::format("\"{:016x}\"", std::hash<std::string_view>{}(asset.bytes));
  res.set_header("ETag", etag);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  // Only our own files run; model output is set as text, and this keeps it so.
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                 "frame-ancestors 'none'; form-action 'none'");
  if (req.get_header_value("If-None-Match") == etag) {
    res.status = 304;
    return;
  }
  res.set_content(std::string(asset.bytes), std::string(content_type(asset.name)));
}

}  // namespace

void register_web_ui(HttpServer& http) {
  http.get("/", [](const httplib::Request& req, httplib::Response& res) {
    send_asset(req, res, *find_asset("index.html"));
  });
  http.get("/ui/([A-Za-z0-9._-]+)", [](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    const WebAsset* asset = find_asset(name);
    if (!asset) throw HttpError(404, fmt::format("no file /ui/{}", name), "not_found");
    send_asset(req, res, *asset);
  });
}

}  // namespace pagellm::server
