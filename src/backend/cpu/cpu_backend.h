// The CPU backend, built in: registered as device "cpu" (backend/registry.h).
// Tests and benchmarks that want the CPU itself create it here.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/registry.h"

namespace pagellm {

struct CpuBackendOptions {
  int threads = 0;  // <= 0: all cores
  // Multiply in float against dequantized weights instead of quantizing
  // activations to 8 bits: slower, but the result is the exact function of
  // the stored weights (8-bit activations add noise that a long greedy
  // continuation can amplify into a different token).
  bool exact_matmul = false;
  // Repack weights at load into the SIMD kernels' layouts (a second copy);
  // off, products read the file's rows (cpu::PrepareOptions::repack).
  bool repack = true;
  // F16 weight matrices are rounded to BF16 at load and run the BF16
  // kernels (vLLM's --dtype bfloat16; on AVX512-BF16, twice the FMA rate).
  bool f16_as_bf16 = false;
  // From registry options: threads=N, exact_matmul=true|false, repack=true|false, dtype=auto|bfloat16.
  static CpuBackendOptions from(const BackendOptions& o);
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);
inline std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  CpuBackendOptions o;
  o.threads = n_threads;
  return make_cpu_backend(o);
}

}  // namespace pagellm
