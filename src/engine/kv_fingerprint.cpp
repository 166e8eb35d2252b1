#include "engine/kv_fingerprint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/util.h"

namespace fs = std::filesystem;

namespace pagellm {
namespace {

// Version of what goes into the fingerprint: a change of this code (or of
// how blocks are laid out) starts from empty tiers instead of misreading.
constexpr uint64_t kFingerprintVersion = 1;

// Two lanes over a stream of words and strings.
class Fold {
 public:
  explicit Fold(uint64_t seed) : a_(mix64(seed)), b_(mix64(seed ^ 0x5bd1e9955bd1e995ULL)) {}
  void add(uint64_t v) {
    a_ = mix64(a_ ^ v) + 0x9e3779b97f4a7c15ULL;
    b_ = mix64(b_ + v * 0xc2b2ae3d27d4eb4fULL) ^ (a_ >> 7);
  }
  void add(const std::string& s) {
    add(s.size());
    add(tier_checksum(s.data(), s.size(), 1));
    add(tier_checksum(s.data(), s.size(), 2));
  }
  void add_bytes(const void* p, size_t n) {
    add(n);
    add(tier_checksum(p, n, 3));
    add(tier_checksum(p, n, 4));
  }
  template <typename T>
  void add_all(const std::vector<T>& v) {
    add(v.size());
    for (const T& x : v) add(static_cast<uint64_t>(x));
  }
  TierKey key() const { return {mix64(a_), mix64(b_ ^ a_)}; }

 private:
  uint64_t a_, b_;
};

// Reads n bytes at `at` into buf and folds them in.
void fold_range(std::FILE* file, uint64_t at, size_t n, std::vector<uint8_t>& buf, Fold& f) {
  buf.resize(n);
  if (std::fseek(file, static_cast<long>(at), SEEK_SET) != 0) return f.add(~uint64_t{0});
  f.add(at);
  f.add_bytes(buf.data(), std::fread(buf.data(), 1, n, file));
}

// A file's size and modification time, its first and last MiB, and 64
// pages spread over the rest: a model with other weights of the same shapes
// differs in them, and a file that is replaced gets a new time (a copy then
// starts from an empty tier, never from another model's blocks).
uint64_t file_fingerprint(const fs::path& p) {
  constexpr uint64_t kPart = uint64_t{1} << 20, kPage = 4096, kSamples = 64;
  std::error_code ec;
  const uint64_t size = fs::file_size(p, ec);
  if (ec) return 0;
  Fold f(size);
  f.add(static_cast<uint64_t>(fs::last_write_time(p, ec).time_since_epoch().count()));
  std::vector<uint8_t> buf;
  if (std::FILE* file = std::fopen(p.c_str(), "rb")) {
    fold_range(file, 0, static_cast<size_t>(std::min(size, kPart)), buf, f);
    if (size > 2 * kPart) {
      fold_range(file, size - kPart, kPart, buf, f);
      for (uint64_t i = 1; i <= kSamples; ++i)
        fold_range(file, kPart + (size - 2 * kPart - kPage) / (kSamples + 1) * i, kPage, buf, f);
    } else if (size > kPart) {
      fold_range(file, kPart, static_cast<size_t>(size - kPart), buf, f);
    }
    std::fclose(file);
  }
  return f.key().hi ^ f.key().lo;
}

}  // namespace

uint64_t path_fingerprint(const std::string& path) {
  if (path.empty()) return 0;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_regular_file(p, ec)) return file_fingerprint(p);
  if (!fs::is_directory(p, ec)) return 0;
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(p, ec))
    if (e.is_regular_file(ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  Fold f(files.size());
  for (const fs::path& file : files) {
    f.add(file.filename().string());
    f.add(file_fingerprint(file));
  }
  return f.key().hi ^ f.key().lo;
}

TierKey engine_kv_fingerprint(const EngineConfig& c, const KVCacheSpec& spec, const std::vector<KvGroup>& groups,
                              int32_t max_model_len, const std::string& backend_name) {
  Fold f(kFingerprintVersion);
  f.add(c.load_format);
  if (c.load_format == "dummy") {
    f.add(c.dummy_shape);
    f.add(static_cast<uint64_t>(c.dummy_type));
  } else {
    f.add(path_fingerprint(c.model));
  }
  f.add(path_fingerprint(c.tokenizer));
  f.add(c.hf_overrides);
  f.add(static_cast<uint64_t>(c.lora.max_lora_rank));  // (an adapter's blocks: its files' fingerprint in the root)
  f.add(c.lora.dtype ? static_cast<uint64_t>(*c.lora.dtype) + 1 : 0);
  f.add(static_cast<uint64_t>(spec.dtype));
  f.add(static_cast<uint64_t>(spec.block_size));
  f.add(static_cast<uint64_t>(spec.n_layers));
  f.add(static_cast<uint64_t>(spec.n_kv_heads));
  f.add(static_cast<uint64_t>(spec.head_dim));
  f.add(spec.v_is_k ? 1 : 0);
  f.add_all(spec.layer_group);
  f.add_all(spec.layer_slot);
  f.add_all(spec.layer_kv_heads);
  f.add_all(spec.layer_head_dim);
  f.add(spec.bytes_per_block());
  f.add(groups.size());
  for (const KvGroup& g : groups) {
    f.add(static_cast<uint64_t>(g.kind));
    f.add(static_cast<uint64_t>(g.window));
  }
  f.add(static_cast<uint64_t>(max_model_len));
  f.add(backend_name);
  for (const auto& [k, v] : c.backend_options) {
    if (k == "threads") continue;  // the kernels give the same bits on any thread count
    f.add(k);
    f.add(v);
  }
  f.add(env_or("PAGELLM_ISA", ""));
  return f.key();
}

}  // namespace pagellm
