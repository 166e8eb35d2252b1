// The dot products of quants_neon_impl.h with SDOT (vdotq_s32); compiled with
// +dotprod, called only on CPUs that have it.
#pragma GCC optimize("fp-contract=off")

#define NEON_NS neon_dotprod
#define NEON_DOTPROD 1
#include "backend/cpu/quants_neon_impl.h"
