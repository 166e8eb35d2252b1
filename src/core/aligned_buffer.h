// Cache-line aligned heap buffers; large ones ask for transparent huge pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace pagellm {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t[], AlignedFree>;

// n bytes (at least 64), 64-byte aligned. From 4 MiB up the buffer is 2 MiB
// aligned and advised as huge-page memory: weights and KV blocks are streamed
// on every step, and 2 MiB pages take the TLB misses (one per 4 KiB page
// otherwise) out of that stream. Throws Error when out of memory.
AlignedBuffer allocate_aligned(size_t n);

}  // namespace pagellm
