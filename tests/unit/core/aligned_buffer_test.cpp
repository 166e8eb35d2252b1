#include "core/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pagellm {
namespace {

TEST(AlignedBuffer, SmallBuffersAreCacheLineAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{3} << 20}) {
    const AlignedBuffer b = allocate_aligned(n);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u) << n;
    std::memset(b.get(), 0x5A, std::max<size_t>(n, 64));  // every byte is ours (ASan would tell)
  }
}

TEST(AlignedBuffer, LargeBuffersAreHugePageAligned) {
  const size_t n = (size_t{9} << 20) + 123;  // not a multiple of the huge page
  const AlignedBuffer b = allocate_aligned(n);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % (size_t{2} << 20), 0u);
  std::memset(b.get(), 0xA5, n);
  EXPECT_EQ(b[n - 1], 0xA5);
}

}  // namespace
}  // namespace pagellm
