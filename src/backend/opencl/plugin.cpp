// The plugin entry point: libpagellm_backend_opencl.so exports the plain C
// registry of include/pagellm_backend.h (ABI v2), made by backend/c_export
// from the C++ OpenCL backend. No C++ object crosses to the core.
#include <CL/cl.h>

#include "backend/c_export.h"
#include "backend/opencl/opencl_backend.h"

namespace {

// Devices of the first platform (the default `platform` option); 0 when
// there is no OpenCL platform at all.
int opencl_device_count() {
  cl_uint n_platforms = 0;
  if (clGetPlatformIDs(0, nullptr, &n_platforms) != CL_SUCCESS || n_platforms == 0) return 0;
  std::vector<cl_platform_id> platforms(n_platforms);
  if (clGetPlatformIDs(n_platforms, platforms.data(), nullptr) != CL_SUCCESS) return 0;
  cl_uint n_devices = 0;
  if (clGetDeviceIDs(platforms[0], CL_DEVICE_TYPE_ALL, 0, nullptr, &n_devices) != CL_SUCCESS) return 0;
  return static_cast<int>(n_devices);
}

const pglb_registry* make_registry() {
  pagellm::ExportedBackend x;
  x.kind = "opencl";
  x.description = "OpenCL 1.2 devices (GPUs; CPUs through PoCL)";
  x.device_count = opencl_device_count;
  x.create = [](int index, const pagellm::BackendOptions& o) { return pagellm::make_opencl_backend(index, o); };
  return pagellm::export_backend(std::move(x));
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const pglb_registry* pglb_registry_v2(void) {
  static const pglb_registry* reg = make_registry();
  return reg;
}
