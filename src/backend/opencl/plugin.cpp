// The plugin entry point (backend/plugin_abi.h): the loader finds
// `pagellm_backend_plugin` in libpagellm_backend_opencl.so.
#include <cstdio>
#include <exception>

#include "backend/opencl/opencl_backend.h"
#include "backend/plugin_abi.h"

namespace {

// No exception crosses the C boundary: any failure becomes the message.
pagellm::Backend* create(int index, const PagellmBackendOptionsV1* options, char* error, size_t error_len) {
  try {
    pagellm::BackendOptions o;
    if (options)
      for (size_t i = 0; i < options->count; ++i) o[options->keys[i]] = options->values[i];
    return pagellm::make_opencl_backend(index, o).release();
  } catch (const std::exception& e) {
    if (error && error_len) std::snprintf(error, error_len, "%s", e.what());
  } catch (...) {
    if (error && error_len) std::snprintf(error, error_len, "unknown error creating the OpenCL backend");
  }
  return nullptr;
}

const PagellmBackendPluginV1 kPlugin = {PAGELLM_BACKEND_ABI_VERSION, "opencl",
                                        "OpenCL 1.2 devices (GPUs; CPUs through PoCL)", create};

}  // namespace

extern "C" __attribute__((visibility("default"))) const PagellmBackendPluginV1* pagellm_backend_plugin(void) {
  return &kPlugin;
}
