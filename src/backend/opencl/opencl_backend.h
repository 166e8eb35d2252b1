// The OpenCL backend: any OpenCL 1.2 device (GPUs, PoCL on the CPU). Built
// as the plugin libpagellm_backend_opencl.so (plugin.cpp); the factory is
// declared here for tests that create it directly.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/registry.h"

namespace pagellm {

// Device `index` of OpenCL platform `platform` (option, default 0). Options:
// `platform` only; any other key is refused. Throws Error when there is no
// such platform or device, or the kernels do not build.
std::unique_ptr<Backend> make_opencl_backend(int index, const BackendOptions& options);

}  // namespace pagellm
