// A plugin of the old backend ABI (v1: `pagellm_backend_plugin` returning a
// C++ pagellm::Backend factory), which this pagellm must refuse with a clear
// message. The v1 structs are copied here: the core no longer has them.
// Built twice: the _host variant, as real v1 plugins did, needs a C++ symbol
// of pagellm's from the program, which no longer exports any.
#include <cstddef>
#include <cstdint>

namespace {

struct OptionsV1 {
  size_t count;
  const char* const* keys;
  const char* const* values;
};

struct PluginV1 {
  uint32_t abi_version;
  const char* kind;
  const char* description;
  void* (*create)(int index, const OptionsV1* options, char* error, size_t error_len);
};

#ifdef PAGELLM_TEST_V1_NEEDS_HOST
}  // namespace
namespace pagellm {
int v1_host_function();
}
namespace {
void* create(int, const OptionsV1*, char*, size_t) { return pagellm::v1_host_function() ? nullptr : nullptr; }
#else
void* create(int, const OptionsV1*, char*, size_t) { return nullptr; }
#endif

const PluginV1 kPlugin = {1, "testdev", "a plugin of backend ABI v1", create};

}  // namespace

extern "C" __attribute__((visibility("default"))) const PluginV1* pagellm_backend_plugin(void) { return &kPlugin; }
