// The entry point of a backend plugin: a shared library that exports one C
// function, `pagellm_backend_plugin`, returning a description of itself.
//
// The loader (backend/registry.cpp) checks `abi_version` before it touches
// anything else. The backend object itself is a C++ pagellm::Backend built
// against the same backend.h, so a plugin must be built with the same
// compiler ABI and the same PAGELLM_BACKEND_ABI_VERSION as the binary that
// loads it (as a CUDA extension must match its framework's build). Bump the
// version whenever backend.h, registry.h or this file change in a way that
// moves a vtable slot or a struct member.
//
// A plugin resolves pagellm's core symbols (errors, logging, fp16, the
// quantization references) from the executable that loads it, which exports
// them; it links no copy of its own. See docs/backends.md.
#pragma once

#include <cstddef>
#include <cstdint>

#define PAGELLM_BACKEND_ABI_VERSION 1u
#define PAGELLM_BACKEND_ENTRY_POINT "pagellm_backend_plugin"

namespace pagellm {
class Backend;
}

extern "C" {

// Options are passed as parallel arrays of NUL-terminated keys and values.
struct PagellmBackendOptionsV1 {
  size_t count;
  const char* const* keys;
  const char* const* values;
};

struct PagellmBackendPluginV1 {
  uint32_t abi_version;     // PAGELLM_BACKEND_ABI_VERSION the plugin was built with
  const char* kind;         // the device kind it serves: "opencl"
  const char* description;  // one line for logs and `pagellm info --devices`
  // Creates the backend of device `index`. On failure returns null and writes a
  // NUL-terminated message of at most error_len bytes to `error`.
  pagellm::Backend* (*create)(int index, const PagellmBackendOptionsV1* options, char* error, size_t error_len);
};

// The symbol every plugin exports.
typedef const PagellmBackendPluginV1* (*PagellmBackendPluginEntry)(void);
}
