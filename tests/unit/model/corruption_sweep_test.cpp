// Truncation and corruption sweeps over real model files (the tiny dummies our
// tools write): a truncation at every offset of the header and metadata, at a
// stride through the data, and random byte changes with a fixed seed. Every
// load must succeed or throw pagellm::Error: never crash, hang, or allocate
// wildly (the sanitizer run sets ASAN_OPTIONS=max_allocation_size_mb to catch
// that). Loads go through the in-process API; one test runs `pagellm info`.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "hostile_input.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model/hf_writer.h"
#include "model/model.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

using test::loads_or_errors;

Backend& backend() {
  static auto b = make_cpu_backend(1);
  return *b;
}

// Offsets to truncate at: every one below `dense_end`, then `strided` more up to size.
std::vector<size_t> cut_points(size_t dense_end, size_t size, size_t strided) {
  std::vector<size_t> cuts;
  for (size_t n = 0; n < std::min(dense_end, size); ++n) cuts.push_back(n);
  for (size_t k = 0; k < strided && dense_end < size; ++k) cuts.push_back(dense_end + (size - dense_end) * k / strided);
  return cuts;
}

// `bytes` with 1-4 random bytes replaced, mostly below `hot_end`.
std::string mutate(const std::string& bytes, size_t hot_end, std::mt19937& rng) {
  std::string b = bytes;
  const int flips = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < flips; ++k) {
    const size_t at = rng() % 5 ? rng() % std::min(hot_end, b.size()) : rng() % b.size();
    b[at] = static_cast<char>(rng() % 3 ? rng() : b[at] ^ (1u << (rng() % 8)));
  }
  return b;
}

struct Tally {
  int ok = 0, errors = 0;
  void add(bool loaded) { ++(loaded ? ok : errors); }
};

// What `pagellm info` and `pagellm generate` do with a GGUF file.
bool load_gguf_everything(const std::string& path, const std::string& where) {
  std::unique_ptr<GGUFFile> f;
  if (!loads_or_errors([&] { f = GGUFFile::open(path); }, where)) return false;
  for (const auto& [k, v] : f->metadata()) (void)v.to_string();
  for (const auto& t : f->tensors()) (void)t.shape_string();
  loads_or_errors([&] { Tokenizer::from_gguf(*f); }, where + " (tokenizer)");
  return loads_or_errors([&] { Model::load(path, backend()); }, where + " (model)");
}

}  // namespace

TEST(CorruptionSweep, GGUF) {
  test::ScratchDir dir("sweep-gguf");
  ThreadPool pool(2);
  const std::string src = dir.file("src.gguf");
  write_dummy_gguf(src, DummySpec{"tiny-llama", DType::Q8_0, 3}, nullptr, pool);
  const std::string good = test::read_bytes(src);
  // The writer pads each tensor to 32 bytes after a 32-aligned header; a cut
  // in the last tensor's padding still holds every tensor.
  size_t header_end = 0, needed_end = 0;
  {
    auto f = GGUFFile::open(src);
    uint64_t padded = 0, used = 0;
    for (const auto& t : f->tensors()) {
      padded = std::max<uint64_t>(padded, t.offset + (t.nbytes + 31) / 32 * 32);
      used = std::max<uint64_t>(used, t.offset + t.nbytes);
    }
    header_end = good.size() - padded;
    needed_end = header_end + used;
  }
  ASSERT_GT(header_end, 4000u);
  ASSERT_TRUE(load_gguf_everything(src, "original"));

  const std::string p = dir.file("cut.gguf");
  Tally cuts;
  for (size_t n : cut_points(header_end + 64, needed_end, 48)) {
    test::write_bytes(p, std::string_view(good).substr(0, n));
    cuts.add(load_gguf_everything(p, "truncated at " + std::to_string(n)));
  }
  EXPECT_EQ(cuts.ok, 0) << "a truncated file loaded";

  std::mt19937 rng(20240611);
  Tally flips;
  for (int iter = 0; iter < 300; ++iter) {
    test::write_bytes(p, mutate(good, header_end, rng));
    flips.add(load_gguf_everything(p, "mutation " + std::to_string(iter)));
  }
  std::printf("  gguf: header %zu bytes, %d truncations refused; mutations: %d loaded, %d refused\n", header_end,
              cuts.errors, flips.ok, flips.errors);
}

TEST(CorruptionSweep, Safetensors) {
  test::ScratchDir dir("sweep-st");
  ThreadPool pool(2);
  write_dummy_hf(dir.path(), DummySpec{"tiny-llama", DType::BF16, 3}, 1, pool);
  const std::string st = dir.file("model.safetensors");
  const std::string good = test::read_bytes(st);
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  const size_t header_end = 8 + header_len;
  ASSERT_TRUE(loads_or_errors([&] { Model::load(dir.path(), backend()); }, "original"));

  Tally cuts;
  for (size_t n : cut_points(header_end + 64, good.size(), 32)) {
    test::write_bytes(st, std::string_view(good).substr(0, n));
    cuts.add(loads_or_errors([&] { Model::load(dir.path(), backend()); }, "truncated at " + std::to_string(n)));
  }
  EXPECT_EQ(cuts.ok, 0) << "a truncated file loaded";

  std::mt19937 rng(7);
  Tally flips;
  for (int iter = 0; iter < 300; ++iter) {
    test::write_bytes(st, mutate(good, header_end, rng));
    flips.add(loads_or_errors([&] { Model::load(dir.path(), backend()); }, "mutation " + std::to_string(iter)));
  }
  test::write_bytes(st, good);
  std::printf("  safetensors: header %zu bytes, %d truncations refused; mutations: %d loaded, %d refused\n", header_end,
              cuts.errors, flips.ok, flips.errors);

  // config.json: every truncation, and mutations.
  const std::string cfg = dir.file("config.json");
  const std::string cfg_good = test::read_bytes(cfg);
  Tally cfg_cuts, cfg_flips;
  for (size_t n = 0; n < cfg_good.find_last_not_of(" \n") + 1; ++n) {
    test::write_bytes(cfg, std::string_view(cfg_good).substr(0, n));
    cfg_cuts.add(loads_or_errors([&] { config_from_hf_json(cfg); }, "config.json cut at " + std::to_string(n)));
  }
  for (int iter = 0; iter < 1000; ++iter) {
    test::write_bytes(cfg, mutate(cfg_good, cfg_good.size(), rng));
    cfg_flips.add(loads_or_errors([&] { config_from_hf_json(cfg); }, "config.json mutation " + std::to_string(iter)));
  }
  EXPECT_EQ(cfg_cuts.ok, 0) << "a truncated config.json loaded";
  std::printf("  config.json: %d truncations refused; mutations: %d loaded, %d refused\n", cfg_cuts.errors,
              cfg_flips.ok, cfg_flips.errors);
}

TEST(CorruptionSweep, SafetensorsIndex) {
  test::ScratchDir dir("sweep-index");
  ThreadPool pool(2);
  write_dummy_hf(dir.path(), DummySpec{"tiny-llama", DType::BF16, 3}, 2, pool);
  const std::string index = dir.file("model.safetensors.index.json");
  const std::string good = test::read_bytes(index);
  Tally cuts;
  for (size_t n = 0; n < good.find_last_not_of(" \n") + 1; ++n) {
    test::write_bytes(index, std::string_view(good).substr(0, n));
    cuts.add(loads_or_errors([&] { Model::load(dir.path(), backend()); }, "index cut at " + std::to_string(n)));
  }
  EXPECT_EQ(cuts.ok, 0);
}

// The CLI reports a corrupt file in one line and a non-zero exit.
TEST(CorruptionSweep, InfoOnACorruptFileExitsWithAClearError) {
  const std::string bin = test::pagellm_binary();
  if (bin.empty()) GTEST_SKIP() << "pagellm binary not built";
  test::ScratchDir dir("sweep-cli");
  test::RawGGUF g(1, 1);
  g.kv_str("general.architecture", "llama").tensor("huge", {uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0);
  g.pad().zeros(64).write(dir.file("wrap.gguf"));
  const auto r = test::run_cli(bin, "info '" + dir.file("wrap.gguf") + "'");
  ASSERT_TRUE(r.exited) << r.output;
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor 'huge' of shape [2147483648, 2147483648] (F32) is larger than the file"),
            std::string::npos)
      << r.output;
}

}  // namespace pagellm
