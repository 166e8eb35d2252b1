// Helpers for the tests that feed loaders broken and hostile files: scratch
// folders, byte I/O, a raw GGUF builder, and the "succeeds or throws
// pagellm::Error, nothing else" rule of the corruption sweeps.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_paths.h"

namespace pagellm::test {

// Where sweeps write their thousands of files: tmpfs when there is one
// (rewriting a file on a journaling disk costs ~2 ms; on tmpfs ~10 us).
inline std::filesystem::path fast_temp_root() {
  static const std::filesystem::path root = [] {
    std::error_code ec;
    const std::filesystem::path shm = "/dev/shm";
    if (std::filesystem::is_directory(shm, ec) && ::access(shm.c_str(), W_OK) == 0)
      return shm / ("pagellm_test_" + std::to_string(::getpid()));
    return std::filesystem::path(temp_dir());
  }();
  return root;
}

// A fresh folder under fast_temp_root(), removed with the object.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) : path_(fast_temp_root() / name) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::remove(path_.parent_path(), ec);  // only when empty
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Rewrites the JSON header of a safetensors file through `edit`, keeping the
// data bytes (the header is padded with spaces to a multiple of 8 again).
inline void edit_safetensors_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = read_bytes(path);
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t new_len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &new_len, 8);
  write_bytes(path, out + text + bytes.substr(8 + len));
}

// The message of the pagellm::Error `f` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Checks that f throws pagellm::Error whose message contains `needle`.
inline void expect_error_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a pagellm::Error (" << typeid(e).name() << "): " << e.what();
  }
}

// The sweep rule: f succeeds (true) or throws pagellm::Error (false); any
// other exception fails the test, naming `where`.
inline bool loads_or_errors(const std::function<void()>& f, const std::string& where) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": not a pagellm::Error (" << typeid(e).name() << "): " << e.what();
    return false;
  }
}

// Little-endian GGUF bytes written field by field, for headers our writer
// refuses to make.
class RawGGUF {
 public:
  RawGGUF(uint64_t n_tensors, uint64_t n_kv) {
    bytes_ = "GGUF";
    u32(3);
    u64(n_tensors);
    u64(n_kv);
  }
  RawGGUF& u32(uint32_t v) { return raw(&v, 4); }
  RawGGUF& u64(uint64_t v) { return raw(&v, 8); }
  RawGGUF& str(std::string_view s) {
    u64(s.size());
    bytes_.append(s);
    return *this;
  }
  RawGGUF& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  RawGGUF& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  // A tensor entry: name, dims (ne[0] first), GGUF type id, data offset.
  RawGGUF& tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  RawGGUF& pad(size_t align = 32) {
    bytes_.append((align - bytes_.size() % align) % align, '\0');
    return *this;
  }
  RawGGUF& zeros(size_t n) {
    bytes_.append(n, '\0');
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  void write(const std::string& path) const { write_bytes(path, bytes_); }

 private:
  RawGGUF& raw(const void* p, size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string bytes_;
};

// The pagellm binary beside this test binary ("" when it was not built).
inline std::string pagellm_binary() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto bin = self.parent_path() / "pagellm";
  return std::filesystem::exists(bin) ? bin.string() : "";
}

struct CliResult {
  bool exited = false;  // false: killed by a signal
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `bin args` (args are shell-quoted by the caller) and collects its output.
inline CliResult run_cli(const std::string& bin, const std::string& args) {
  CliResult r;
  FILE* p = ::popen(("'" + bin + "' " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace pagellm::test
