// The core's side of the plain C backend ABI (include/pagellm_backend.h): a
// pagellm::Backend over a plugin's registry. Every backend the core runs,
// plugins and the built-in CPU alike, goes through here (the CPU through
// backend/c_export.h), so the ABI is exercised on every run.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/registry.h"
#include "pagellm_backend.h"

namespace pagellm {

// Throws Error naming `origin` (the plugin's path, or "built in") when the
// registry is of another ABI version, has tables too small to hold their
// required members, or misses a required function.
void check_registry(const pglb_registry* reg, const std::string& origin);

// The registry's device count (0 when it does not say).
int registry_device_count(const pglb_registry* reg);

// Opens device `index` of a checked registry with `options` and one stream
// of its own; the Backend closes them when it and everything it handed out
// (buffers, weights, communicators) are gone. Failures of the plugin become
// Error naming the kind, the call and the plugin's last_error.
std::unique_ptr<Backend> make_c_backend(const pglb_registry* reg, int index, const BackendOptions& options,
                                        const std::string& origin);

}  // namespace pagellm
