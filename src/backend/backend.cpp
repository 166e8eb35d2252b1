#include "backend/backend.h"

#include "core/error.h"

namespace pagellm {

// Defaults of the optional parts of the Backend interface.
void Backend::allocate_swap_space(int) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_out(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_in(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }


}  // namespace pagellm
