// The device registry and the plugin loader: names, options, the stub error
// of a backend that is not built, and plugins built outside the core binary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "backend/registry.h"
#include "core/error.h"
#include "hostile_input.h"

namespace pagellm {
namespace {

using test::error_of;

TEST(DeviceSpec, ParsesKindAndIndex) {
  EXPECT_EQ(DeviceSpec::parse("cpu").kind, "cpu");
  EXPECT_EQ(DeviceSpec::parse("OpenCL:2").kind, "opencl");
  EXPECT_EQ(DeviceSpec::parse("opencl:2").index, 2);
  EXPECT_EQ(DeviceSpec::parse("opencl:2").str(), "opencl:2");
  for (const char* bad : {"", ":1", "cpu:", "cpu:-1", "cpu:x", "cpu:1x"}) EXPECT_THROW(DeviceSpec::parse(bad), Error) << bad;
}

TEST(BackendRegistry, CpuIsBuiltInAndChecksItsOptions) {
  auto be = create_backend("cpu", {{"threads", "1"}});
  EXPECT_EQ(be->name(), "cpu");
  EXPECT_NE(error_of([] { create_backend("cpu", {{"thread", "1"}}); }).find("no option 'thread'"), std::string::npos);
  EXPECT_NE(error_of([] { create_backend("cpu", {{"threads", "many"}}); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([] { create_backend("cpu", {{"exact_matmul", "perhaps"}}); }).find("not a boolean"),
            std::string::npos);
  EXPECT_NE(error_of([] { create_backend("cpu:1"); }).find("one device"), std::string::npos);
  bool found = false;
  for (const auto& e : registered_backends()) found |= e.kind == "cpu" && e.origin == "built in";
  EXPECT_TRUE(found);
}

// A kind we know but whose plugin is absent gets the "built without" stub
// error; a kind nobody knows lists what there is.
TEST(BackendRegistry, MissingBackendsSayWhatIsMissing) {
  setenv("PAGELLM_PLUGIN_DIR", "/nonexistent-plugin-dir", 1);
  const std::string cuda = error_of([] { create_backend("cuda"); });
  const std::string other = error_of([] { create_backend("tpu"); });
  unsetenv("PAGELLM_PLUGIN_DIR");
  EXPECT_NE(cuda.find("pagellm was built without CUDA support"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("/nonexistent-plugin-dir/libpagellm_backend_cuda.so"), std::string::npos) << cuda;
  EXPECT_NE(other.find("unknown device 'tpu'"), std::string::npos) << other;
  EXPECT_NE(other.find("cpu"), std::string::npos) << other;
}

// The C11 plugin of tests/plugins/c_scalar: built outside the binary, it
// links no pagellm symbol.
TEST(BackendPlugin, LoadsAPlainCPluginBuiltOutsideTheBinary) {
  const std::string dir = PAGELLM_TEST_PLUGIN_DIR;
  EXPECT_EQ(load_backend_plugin(dir + "/libpagellm_backend_cscalar.so"), "cscalar");
  auto be = create_backend("cscalar");
  EXPECT_EQ(be->name(), "cscalar");
  auto buf = be->alloc(DType::F32, 4);
  const float x[4] = {1, 2, 3, 4};
  float y[4] = {};
  be->copy_from_host(x, *buf, 0, sizeof x);
  be->copy_to_host(*buf, 0, sizeof y, y);
  be->synchronize();
  EXPECT_EQ(y[3], 4.0f);
  bool listed = false;
  for (const auto& e : registered_backends())
    if (e.kind == "cscalar") {
      listed = true;
      EXPECT_EQ(e.origin, dir + "/libpagellm_backend_cscalar.so");
      ASSERT_TRUE(e.device_count);
      EXPECT_EQ(e.device_count(), 1);
    }
  EXPECT_TRUE(listed);
  // Errors made inside the plugin come back with their text.
  EXPECT_NE(error_of([] { create_backend("cscalar:3"); }).find("one device, not 3"), std::string::npos);
  EXPECT_NE(error_of([] { create_backend("cscalar", {{"bogus", "1"}}); }).find("no option 'bogus'"),
            std::string::npos);
  const std::string copy = error_of([&] { be->copy_to_host(*buf, 8, 16, y); });
  EXPECT_NE(copy.find("cscalar backend: copy_to_host failed (invalid argument): copy_to_host: 16 bytes at 8 past a "
                      "buffer of 16"),
            std::string::npos)
      << copy;
  EXPECT_FALSE(be->supports_op(op_query(PGLB_OP_MOE_ROUTE)));
  EXPECT_FALSE(be->supports_op(op_query(PGLB_OP_SAMPLE)));
  EXPECT_TRUE(be->supports_op(op_query(PGLB_OP_SOFTCAP)));
  EXPECT_FALSE(be->supports_op(op_query(PGLB_OP_MATMUL, {{DType::Q4_K, {256, 8}}})));
}

TEST(BackendPlugin, RefusesV1WrongAbiSmallStructMissingEntryAndMissingFile) {
  const std::string dir = PAGELLM_TEST_PLUGIN_DIR;
  const std::string v1 = error_of([&] { load_backend_plugin(dir + "/libpagellm_backend_v1.so"); });
  EXPECT_NE(v1.find("was built against backend ABI v1 (a C++ pagellm::Backend); this pagellm loads only ABI v2 "
                    "plugins (plain C, include/pagellm_backend.h): rebuild it against that header"),
            std::string::npos)
      << v1;
  // A v1 plugin that wants pagellm's C++ symbols from the program fails to load: the same message.
  const std::string host = error_of([&] { load_backend_plugin(dir + "/libpagellm_backend_v1_host.so"); });
  EXPECT_NE(host.find("was built against backend ABI v1"), std::string::npos) << host;
  EXPECT_NE(host.find("undefined symbol"), std::string::npos) << host;
  const std::string abi = error_of([&] { load_backend_plugin(dir + "/libpagellm_backend_cscalar_bad_abi.so"); });
  EXPECT_NE(abi.find("libpagellm_backend_cscalar_bad_abi.so' was built for backend ABI version 1002"),
            std::string::npos)
      << abi;
  EXPECT_NE(abi.find("rebuild the plugin"), std::string::npos) << abi;
  const std::string small = error_of([&] { load_backend_plugin(dir + "/libpagellm_backend_cscalar_small_struct.so"); });
  EXPECT_NE(small.find("libpagellm_backend_cscalar_small_struct.so': its registry struct (8 bytes) is smaller"),
            std::string::npos)
      << small;
  EXPECT_NE(error_of([] { load_backend_plugin("/nonexistent.so"); }).find("does not exist"), std::string::npos);
  // A shared library that is not a plugin (libm has no entry point).
  for (const char* lib : {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"}) {
    if (!std::filesystem::exists(lib)) continue;
    EXPECT_NE(error_of([&] { load_backend_plugin(lib); }).find("not a pagellm backend plugin (no pglb_registry_v2"),
              std::string::npos);
    break;
  }
  const std::string dir_file = testing::TempDir() + "/not-a-library.so";
  { std::FILE* f = std::fopen(dir_file.c_str(), "w"); std::fputs("garbage", f); std::fclose(f); }
  EXPECT_NE(error_of([&] { load_backend_plugin(dir_file); }).find("cannot load backend plugin"), std::string::npos);
}

}  // namespace
}  // namespace pagellm
