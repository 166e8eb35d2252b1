// A backend plugin built outside the core binary, for the registry tests: it
// serves device kind "testdev" by wrapping the CPU backend, whose code it
// resolves from the executable that loads it (as every plugin resolves
// pagellm's core). Built twice: once as it should be, once claiming another
// ABI version (PAGELLM_TEST_BAD_ABI), which the loader must refuse.
#include <cstdio>
#include <exception>

#include "backend/cpu/cpu_backend.h"
#include "backend/plugin_abi.h"

namespace {

pagellm::Backend* create(int index, const PagellmBackendOptionsV1* options, char* error, size_t error_len) {
  try {
    pagellm::BackendOptions o;
    for (size_t i = 0; i < options->count; ++i) o[options->keys[i]] = options->values[i];
    if (index != 0) {
      std::snprintf(error, error_len, "testdev has one device, not %d", index);
      return nullptr;
    }
    return pagellm::make_cpu_backend(pagellm::CpuBackendOptions::from(o)).release();
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

#ifdef PAGELLM_TEST_BAD_ABI
constexpr uint32_t kAbi = PAGELLM_BACKEND_ABI_VERSION + 1000;
#else
constexpr uint32_t kAbi = PAGELLM_BACKEND_ABI_VERSION;
#endif

const PagellmBackendPluginV1 kPlugin = {kAbi, "testdev", "test plugin wrapping the CPU backend", create};

}  // namespace

extern "C" __attribute__((visibility("default"))) const PagellmBackendPluginV1* pagellm_backend_plugin(void) {
  return &kPlugin;
}
