// Where tests find shared data and fixtures. The shared data folder (real
// vocabularies, stories260K) lives beside the checkout; PAGELLM_SHARED_DATA
// overrides it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace pagellm::test {

inline std::string shared_data_dir() {
  if (const char* env = std::getenv("PAGELLM_SHARED_DATA"); env && *env) return env;
  return PAGELLM_SHARED_DATA;
}

inline std::string shared_data(const std::string& rel) { return shared_data_dir() + "/" + rel; }
inline std::string fixture(const std::string& rel) { return std::string(PAGELLM_FIXTURES) + "/" + rel; }

// A scratch directory unique to this test process.
inline std::string temp_dir() {
  static const std::string dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("pagellm_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return dir;
}

}  // namespace pagellm::test

// Skips (loudly) when a shared data file is absent, e.g. a checkout without ../shared.
#define REQUIRE_FILE(path)                                                        \
  do {                                                                            \
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing test data: " << (path); \
  } while (0)
