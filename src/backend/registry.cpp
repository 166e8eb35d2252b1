#include "backend/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "backend/c_backend.h"
#include "core/error.h"

namespace pagellm {

namespace fs = std::filesystem;

namespace {

// Device kinds people name that have a backend in the tree (or will): the
// error for them says what to build instead of "unknown device".
const std::map<std::string, std::string>& known_kinds() {
  static const std::map<std::string, std::string> k = {
      {"opencl", "OpenCL"}, {"cuda", "CUDA"}, {"xpu", "Kunlun XPU"}, {"npu", "Ascend NPU"}};
  return k;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendEntry> entries;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string plugin_file_name(const std::string& kind) { return "libpagellm_backend_" + kind + ".so"; }

}  // namespace

// Registers the built-in CPU backend (backend/cpu/cpu_backend.cpp).
void register_cpu_backend();

namespace {
void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_cpu_backend(); });
}
}  // namespace

DeviceSpec DeviceSpec::parse(const std::string& text) {
  DeviceSpec d;
  const size_t colon = text.find(':');
  d.kind = text.substr(0, colon);
  if (d.kind.empty()) fail("--device '{}': no device kind (expected cpu or opencl[:N])", text);
  for (char& c : d.kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (colon != std::string::npos) {
    const std::string idx = text.substr(colon + 1);
    const auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), d.index);
    if (ec != std::errc() || p != idx.data() + idx.size() || d.index < 0 || idx.empty())
      fail("--device '{}': the device index must be a non-negative integer", text);
  }
  return d;
}

std::string DeviceSpec::str() const { return index == 0 ? kind : kind + ":" + std::to_string(index); }

void register_backend(BackendEntry entry) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  const std::string kind = entry.kind;
  r.entries[kind] = std::move(entry);
}

std::vector<BackendEntry> registered_backends() {
  ensure_builtins();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<BackendEntry> out;
  for (const auto& [k, e] : r.entries) out.push_back(e);
  return out;
}

std::vector<std::string> plugin_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("PAGELLM_PLUGIN_DIR"); env && *env) {
    dirs.emplace_back(env);
    return dirs;
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back((exe.parent_path() / "backends").string());
    dirs.push_back((exe.parent_path().parent_path() / "lib" / "pagellm" / "backends").string());
  }
  return dirs;
}

std::string register_c_backend(const pglb_registry* reg, const std::string& origin) {
  check_registry(reg, origin);
  BackendEntry e;
  e.kind = reg->kind;
  e.description = reg->description ? reg->description : "";
  e.origin = origin;
  e.create = [reg, origin](const DeviceSpec& d, const BackendOptions& o) {
    return make_c_backend(reg, d.index, o, origin);
  };
  e.device_count = [reg] { return registry_device_count(reg); };
  const std::string kind = e.kind;
  register_backend(std::move(e));
  return kind;
}

std::string load_backend_plugin(const std::string& path) {
  if (!fs::exists(path)) fail("backend plugin '{}' does not exist", path);
  const std::string v1 = fmt::format(
      "backend plugin '{}' was built against backend ABI v1 (a C++ pagellm::Backend); this pagellm loads only ABI v2 "
      "plugins (plain C, include/pagellm_backend.h): rebuild it against that header",
      path);
  // RTLD_NOW: a missing symbol fails here, not in the middle of a forward pass.
  // RTLD_LOCAL: plugins do not see each other's symbols. Never closed: the
  // backend's code must outlive every object it made.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const std::string why = dlerror();
    // A v1 plugin took pagellm's C++ symbols from the executable, which no longer exports them.
    const size_t undefined = why.find("undefined symbol: _Z");
    if (undefined != std::string::npos && why.find("7pagellm", undefined) != std::string::npos)
      fail("{} ({})", v1, why);
    fail("cannot load backend plugin '{}': {}", path, why);
  }
  auto entry = reinterpret_cast<pglb_entry_fn>(dlsym(handle, PGLB_ENTRY_POINT));
  if (!entry) {
    if (dlsym(handle, PGLB_V1_ENTRY_POINT)) fail("{}", v1);
    fail("'{}' is not a pagellm backend plugin (no {} entry point)", path, PGLB_ENTRY_POINT);
  }
  return register_c_backend(entry(), path);
}

std::unique_ptr<Backend> create_backend(const std::string& device, const BackendOptions& options) {
  ensure_builtins();
  const DeviceSpec d = DeviceSpec::parse(device);
  auto find = [&]() -> BackendFactory {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.entries.find(d.kind);
    return it == r.entries.end() ? BackendFactory{} : it->second.create;
  };
  BackendFactory f = find();
  std::vector<std::string> tried;
  if (!f) {
    for (const std::string& dir : plugin_search_dirs()) {
      const std::string path = (fs::path(dir) / plugin_file_name(d.kind)).string();
      tried.push_back(path);
      if (fs::exists(path)) {
        load_backend_plugin(path);
        f = find();
        break;
      }
    }
  }
  if (!f) {
    std::string where;
    for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
    auto k = known_kinds().find(d.kind);
    if (k != known_kinds().end())
      fail("pagellm was built without {} support: no backend for --device {} is built in, and its plugin {} was not "
           "found (looked for {}); pass --backend-plugin PATH or set PAGELLM_PLUGIN_DIR",
           k->second, d.kind, plugin_file_name(d.kind), where.empty() ? "nothing" : where);
    std::string have;
    for (const auto& e : registered_backends()) have += (have.empty() ? "" : ", ") + e.kind;
    fail("unknown device '{}' (available: {})", d.kind, have);
  }
  return f(d, options);
}

}  // namespace pagellm
