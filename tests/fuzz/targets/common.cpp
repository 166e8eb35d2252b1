#include "common.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "targets.h"

namespace pagellm::fuzz {

ScratchDir::ScratchDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pagellm-fuzz-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) fail("mkdtemp {}: {}", tmpl, std::strerror(errno));
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ScratchDir::write(const std::string& name, const uint8_t* data, size_t size) const {
  const std::string p = path_ + "/" + name;
  // Not a crash of the code under test: stop loudly rather than fuzz nothing.
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "fuzz: cannot write %s: %s\n", p.c_str(), std::strerror(errno));
    std::exit(2);
  }
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      std::fprintf(stderr, "fuzz: short write to %s: %s\n", p.c_str(), std::strerror(errno));
      std::exit(2);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return p;
}

bool strict() {
  static const bool on = [] {
    const char* v = std::getenv("PAGELLM_FUZZ_STRICT");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void invariant_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz: invariant broken at %s:%d: %s\n", file, line, what);
  std::abort();
}

std::span<const Target> all_targets() {
  static const Target targets[] = {
      {"gguf", gguf},
      {"safetensors", safetensors},
      {"tokenizer_json", tokenizer_json},
      {"request", request},
      {"chat_template", chat_template},
      {"http_request", http_request},
      {"grammar", grammar},
  };
  return targets;
}

}  // namespace pagellm::fuzz
