// The reverse of backend/c_backend.h: a C++ Backend factory served as a
// plain C registry (include/pagellm_backend.h). The built-in CPU backend is
// registered through it, and a plugin written in C++ (OpenCL) compiles it in
// to export its backend without handing any C++ object across.
//
// Every call is guarded: an exception becomes a status and the device's
// last_error (its message text kept), never a C++ exception across the ABI.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/registry.h"
#include "pagellm_backend.h"

namespace pagellm {

struct ExportedBackend {
  std::string kind;         // "cpu", "opencl"
  std::string description;  // one line
  std::function<int()> device_count;
  std::function<std::unique_ptr<Backend>(int index, const BackendOptions& options)> create;
  // Serve the backend's own device communicator (Backend::comm_unique_id and
  // comm_init) as the registry's comm table; otherwise it is null.
  bool device_comm = false;
};

// The registry of `spec`. It lives as long as the program (as a loaded
// plugin's does): the core may hold it in its backend table for good.
const pglb_registry* export_backend(ExportedBackend spec);

}  // namespace pagellm
