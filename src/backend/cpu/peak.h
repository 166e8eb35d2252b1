// Measured compute ceilings of this CPU, for benchmarks (bench ops).
#pragma once

namespace pagellm::cpu::avx512 {

// GOP/s (a multiply and an add per int8 product) of `threads` threads each
// issuing independent vpdpbusd of `bits` (256 or 512) for `seconds` of its
// CPU time; the sum of the threads' rates (the cores' peak when each has a
// core of its own). Call only when the CPU has AVX-512 VNNI.
double int8_peak_gops(int threads, int bits, double seconds);

}  // namespace pagellm::cpu::avx512
