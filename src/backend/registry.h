// Where backends are found and created: the ONE place that maps a device
// name (`--device cpu|opencl[:N]`, vLLM's flag) to a backend. Built-in
// backends (the CPU) register here; plugin backends are shared libraries
// loaded at start-up, from `--backend-plugin PATH` or from the plugin folder,
// that export the plain C registry of include/pagellm_backend.h (ABI v2).
// Every backend, the CPU included, runs through that C ABI
// (backend/c_backend.h). Options meant for one backend (`threads`,
// `exact_matmul`, an OpenCL `platform`) travel as strings to that backend,
// which checks them; the engine never sees them.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace pagellm {

// "opencl:1" -> {"opencl", 1}; "cpu" -> {"cpu", 0}. Throws Error on a bad index.
struct DeviceSpec {
  std::string kind = "cpu";
  int index = 0;
  static DeviceSpec parse(const std::string& text);
  std::string str() const;
};

// Backend-specific settings, key -> value. A backend refuses keys it does not
// know (a typo must not pass silently).
using BackendOptions = std::map<std::string, std::string>;

using BackendFactory = std::function<std::unique_ptr<Backend>(const DeviceSpec&, const BackendOptions&)>;

struct BackendEntry {
  std::string kind;         // "cpu", "opencl"
  std::string description;  // one line
  std::string origin;       // "built in" or the plugin's path
  BackendFactory create;
  std::function<int()> device_count;  // devices of this kind here (may be null)
};

// Adds (or replaces) the backend of a device kind.
void register_backend(BackendEntry entry);

// Creates the backend of `device`. A kind without a registered backend is
// looked for as a plugin in the plugin folder first; then the error says
// what was tried ("pagellm was built without OpenCL support" for a known
// kind whose plugin was not built).
std::unique_ptr<Backend> create_backend(const std::string& device, const BackendOptions& options = {});

// Registers the backend of a C registry (checked first; `origin`: "built in"
// or the plugin's path); returns its kind.
std::string register_c_backend(const pglb_registry* reg, const std::string& origin);

// Loads a plugin library and registers its backend; returns its kind.
// Throws Error naming the path on a missing file, a missing entry point, a
// plugin of ABI v1 (a C++ Backend), or an ABI version or table size mismatch.
std::string load_backend_plugin(const std::string& path);

// The folder searched for `libpagellm_backend_<kind>.so`: $PAGELLM_PLUGIN_DIR
// if set, else `backends/` beside the running executable, else
// `../lib/pagellm/backends` from it (an installed layout).
std::vector<std::string> plugin_search_dirs();

// Registered kinds with their entries (for `pagellm info --devices`).
std::vector<BackendEntry> registered_backends();

// Reads a `threads`-style integer option; `fallback` when absent. Throws
// Error (naming the backend and key) when the value is not an integer.
int backend_option_int(const BackendOptions& o, const std::string& backend, const std::string& key, int fallback);
bool backend_option_bool(const BackendOptions& o, const std::string& backend, const std::string& key, bool fallback);
std::string backend_option_string(const BackendOptions& o, const std::string& key, const std::string& fallback);
// Throws Error when `o` has a key outside `known` (a typo must not pass).
void check_backend_options(const BackendOptions& o, const std::string& backend, const std::vector<std::string>& known);

}  // namespace pagellm
