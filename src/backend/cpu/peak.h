// Measured compute ceilings of this CPU, for benchmarks (bench ops).
#pragma once

namespace pagellm::cpu::avx512 {

// GOP/s (a multiply and an add per int8 product) of `threads` threads each
// issuing independent vpdpbusd of `bits` (256 or 512) for `seconds` of its
// CPU time; the sum of the threads' rates (the cores' peak when each has a
// core of its own). Call only when the CPU has AVX-512 VNNI.
double int8_peak_gops(int threads, int bits, double seconds);

// GFLOP/s (a multiply and an add per product) of `threads` threads issuing
// independent 512-bit FMAs (bf16 false) or vdpbf16ps (bf16 true; call only
// when the CPU has AVX512-BF16), as int8_peak_gops.
double float_peak_gflops(int threads, bool bf16, double seconds);

}  // namespace pagellm::cpu::avx512
