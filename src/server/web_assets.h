// The files of the web page (src/server/web), built into the binary by
// cmake/embed_files.cmake, so the page needs nothing beside the binary and
// nothing from the network.
#pragma once

#include <span>
#include <string_view>

namespace pagellm::server {

struct WebAsset {
  std::string_view name;  // file name, e.g. "app.js"
  std::string_view bytes;
};

std::span<const WebAsset> web_assets();

}  // namespace pagellm::server
