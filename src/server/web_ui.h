// The web page at / : a chat and completion playground and a live view of
// /metrics (src/server/web), served from the binary. Off with --no-webui.
#pragma once

namespace pagellm::server {

class HttpServer;

// GET / (the page) and GET /ui/<file> (its scripts, styles and icon).
void register_web_ui(HttpServer& http);

}  // namespace pagellm::server
