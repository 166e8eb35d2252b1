#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <algorithm>

#include "core/error.h"
#include "core/util.h"

namespace pagellm {

AlignedBuffer allocate_aligned(size_t n) {
  constexpr size_t kHugePage = size_t{2} << 20;
  n = std::max<size_t>(n, 64);
  const bool huge = n >= 2 * kHugePage;
  void* p = nullptr;
  if (posix_memalign(&p, huge ? kHugePage : 64, n) != 0) fail("out of memory allocating {}", format_bytes(n));
#ifdef MADV_HUGEPAGE
  // Only a hint: where the kernel refuses, the buffer keeps 4 KiB pages.
  if (huge) madvise(p, n / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

}  // namespace pagellm
