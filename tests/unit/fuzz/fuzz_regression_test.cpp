// Replays the fuzzers' seed corpus (tests/fuzz/corpus/<target>) and every
// saved finding (tests/fuzz/regressions/<target>) through the fuzz target
// bodies, built without libFuzzer. A fixed crash stays fixed; under
// `make sanitize` the same inputs run with ASan + UBSan.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "targets.h"

namespace pagellm::fuzz {
namespace {

namespace fs = std::filesystem;

// Findings reported but not fixed yet (target/file, relative to
// tests/fuzz/regressions). They still crash, so they are skipped, loudly;
// delete an entry when its fix lands and the test then guards the fix.
const std::set<std::string> kKnownUnfixed = {};

const fs::path kFuzzDir = fs::path(PAGELLM_SOURCE_DIR) / "tests" / "fuzz";

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void replay(const Target& t, const fs::path& file) {
  SCOPED_TRACE(file.string());
  const std::vector<uint8_t> bytes = read_bytes(file);
  // libFuzzer never passes a null pointer, even for an empty input.
  static const uint8_t empty = 0;
  EXPECT_EQ(t.run(bytes.empty() ? &empty : bytes.data(), bytes.size()), 0);
}

class FuzzReplay : public testing::TestWithParam<Target> {};

}  // namespace

// gtest prints parameters; the name says all.
void PrintTo(const Target& t, std::ostream* os) { *os << t.name; }

namespace {

TEST_P(FuzzReplay, SeedCorpus) {
  const auto files = files_in(kFuzzDir / "corpus" / GetParam().name);
  ASSERT_FALSE(files.empty()) << "no seeds in tests/fuzz/corpus/" << GetParam().name;
  for (const auto& f : files) replay(GetParam(), f);
}

TEST_P(FuzzReplay, Regressions) {
  int skipped = 0;
  for (const auto& f : files_in(kFuzzDir / "regressions" / GetParam().name)) {
    const std::string key = std::string(GetParam().name) + "/" + f.filename().string();
    if (kKnownUnfixed.count(key)) {
      std::printf("[ KNOWN    ] %s still unfixed: skipped\n", key.c_str());
      ++skipped;
      continue;
    }
    replay(GetParam(), f);
  }
  if (skipped) std::printf("[ KNOWN    ] %d known-unfixed finding(s) skipped for %s\n", skipped, GetParam().name.data());
}

// A stale entry (renamed or deleted file) would hide nothing and mislead.
TEST(FuzzReplayList, KnownUnfixedFilesExist) {
  for (const std::string& key : kKnownUnfixed) EXPECT_TRUE(fs::exists(kFuzzDir / "regressions" / key)) << key;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, testing::ValuesIn(all_targets().begin(), all_targets().end()),
                         [](const testing::TestParamInfo<Target>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pagellm::fuzz
