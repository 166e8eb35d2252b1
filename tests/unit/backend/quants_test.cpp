// Block formats: hand-built blocks, gguf-py fixtures (bit-exact), round-trip
// error bounds, determinism, and the fast kernels against the references.
#include "backend/cpu/quants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/fp16.h"
#include "quant_test_util.h"
#include "test_paths.h"

namespace pagellm::cpu {
namespace {

using test::IsaGuard;
using test::normal_values;

std::vector<float> dequant_ref(DType type, const void* blocks, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row_ref(type, blocks, y.data(), n);
  return y;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

// ---- hand-built blocks: layouts written out from the GGUF spec ---------------

TEST(QuantsHandBuilt, Q4_0) {
  BlockQ4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = j, hi = 15 - j;  // element j in the low nibble, element j+16 in the high one
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    want[j] = 0.5f * static_cast<float>(lo - 8);
    want[j + 16] = 0.5f * static_cast<float>(hi - 8);
  }
  expect_values(dequant_ref(DType::Q4_0, &b, 32), want);
}

TEST(QuantsHandBuilt, Q4_1) {
  BlockQ4_1 b{};
  b.d = fp32_to_fp16(0.25f);
  b.m = fp32_to_fp16(-1.0f);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    want[j] = 0.25f * static_cast<float>(j) - 1.0f;
    want[j + 16] = 0.25f * static_cast<float>(15 - j) - 1.0f;
  }
  expect_values(dequant_ref(DType::Q4_1, &b, 32), want);
}

// Q5: element e's 5th bit is bit e of the little-endian 32-bit qh.
template <typename Block>
void build_q5(Block& b, std::vector<int>& q) {
  q.resize(32);
  uint32_t qh = 0;
  for (int e = 0; e < 32; ++e) q[e] = (e * 7 + 3) % 32;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  for (int e = 0; e < 32; ++e) qh |= static_cast<uint32_t>(q[e] >> 4) << e;
  std::memcpy(b.qh, &qh, 4);
}

TEST(QuantsHandBuilt, Q5_0) {
  BlockQ5_0 b{};
  b.d = fp32_to_fp16(2.0f);
  std::vector<int> q;
  build_q5(b, q);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) want[e] = 2.0f * static_cast<float>(q[e] - 16);
  expect_values(dequant_ref(DType::Q5_0, &b, 32), want);
}

TEST(QuantsHandBuilt, Q5_1) {
  BlockQ5_1 b{};
  b.d = fp32_to_fp16(0.125f);
  b.m = fp32_to_fp16(0.5f);
  std::vector<int> q;
  build_q5(b, q);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) want[e] = 0.125f * static_cast<float>(q[e]) + 0.5f;
  expect_values(dequant_ref(DType::Q5_1, &b, 32), want);
}

TEST(QuantsHandBuilt, Q8_0AndQ8_1AndQ8_K) {
  BlockQ8_0 b0{};
  BlockQ8_1 b1{};
  b0.d = fp32_to_fp16(2.0f);
  b1.d = fp32_to_fp16(0.5f);
  std::vector<float> want0(32), want1(32);
  for (int j = 0; j < 32; ++j) {
    b0.qs[j] = b1.qs[j] = static_cast<int8_t>(4 * j - 64);
    want0[j] = 2.0f * static_cast<float>(4 * j - 64);
    want1[j] = 0.5f * static_cast<float>(4 * j - 64);
  }
  expect_values(dequant_ref(DType::Q8_0, &b0, 32), want0);
  expect_values(dequant_ref(DType::Q8_1, &b1, 32), want1);

  BlockQ8_K bk{};
  bk.d = 0.25f;
  std::vector<float> wantk(256);
  for (int j = 0; j < 256; ++j) {
    bk.qs[j] = static_cast<int8_t>(j - 128);
    wantk[j] = 0.25f * static_cast<float>(j - 128);
  }
  expect_values(dequant_ref(DType::Q8_K, &bk, 256), wantk);
}

// K-quant 6-bit scales: bytes 0-3 hold scale j (low 6 bits) and the top bits
// of scale j+4; bytes 4-7 the same for mins; bytes 8-11 the low 4 bits of
// scale j+4 (low nibble) and min j+4 (high nibble).
void pack_k_scales(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// Element e of a Q4_K / Q5_K super-block: chunk c = e / 64 holds elements
// 64c..64c+31 in the low nibbles of qs[32c..32c+31] and 64c+32.. in the high
// nibbles; sub-block j = e / 32. Q5_K's 5th bit of e: bit j of qh[e % 32].
template <typename Block>
std::vector<float> build_k45(Block& b, bool five_bits) {
  const int sc[8] = {1, 2, 17, 33, 47, 63, 20, 5}, m[8] = {0, 3, 62, 16, 31, 8, 63, 1};
  b.d = fp32_to_fp16(1.0f);
  b.dmin = fp32_to_fp16(0.5f);
  pack_k_scales(sc, m, b.scales);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, c = e / 64, l = e % 32;
    const int q = five_bits ? (e * 11 + 5) % 32 : (e * 7 + 1) % 16;
    uint8_t& byte = b.qs[32 * c + l];
    byte = static_cast<uint8_t>(j % 2 == 0 ? (byte & 0xF0) | (q & 15) : (byte & 0x0F) | ((q & 15) << 4));
    if constexpr (requires { b.qh; }) {
      if (q >> 4) b.qh[l] = static_cast<uint8_t>(b.qh[l] | (1 << j));
    }
    want[e] = 1.0f * static_cast<float>(sc[j]) * static_cast<float>(q) - 0.5f * static_cast<float>(m[j]);
  }
  return want;
}

TEST(QuantsHandBuilt, Q4_K) {
  BlockQ4_K b{};
  const auto want = build_k45(b, false);
  expect_values(dequant_ref(DType::Q4_K, &b, 256), want);
}

TEST(QuantsHandBuilt, Q5_K) {
  BlockQ5_K b{};
  const auto want = build_k45(b, true);
  expect_values(dequant_ref(DType::Q5_K, &b, 256), want);
}

// Q6_K element e: half h = e / 128, r = e % 128, part k = r / 32, l = r % 32;
// low 4 bits in ql[64h + 32(k & 1) + l] (low nibble for k < 2), top 2 bits
// at bits 2k..2k+1 of qh[32h + l]; scale scales[e / 16]; value d*sc*(q - 32).
TEST(QuantsHandBuilt, Q6_K) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 9 - 70);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
    const int q = (e * 13 + 7) % 64;
    uint8_t& lo = b.ql[64 * h + 32 * (k & 1) + l];
    lo = static_cast<uint8_t>(k < 2 ? (lo & 0xF0) | (q & 15) : (lo & 0x0F) | ((q & 15) << 4));
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * k)));
    want[e] = 0.5f * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q - 32);
  }
  expect_values(dequant_ref(DType::Q6_K, &b, 256), want);
}

// IQ4_NL and MXFP4 share Q4_0's nibble layout; only the level table differs.
TEST(QuantsHandBuilt, IQ4_NLAndMXFP4) {
  BlockIQ4_NL b{};
  BlockMXFP4 m{};
  b.d = fp32_to_fp16(0.5f);
  m.e = 128;  // 2^(128 - 127) / 2 = 1: the doubled e2m1 values as they are
  std::vector<float> want_nl(32), want_fp(32);
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = m.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    want_nl[j] = 0.5f * kIQ4NLValues[j];
    want_nl[j + 16] = 0.5f * kIQ4NLValues[15 - j];
    want_fp[j] = kMXFP4Values[j];
    want_fp[j + 16] = kMXFP4Values[15 - j];
  }
  expect_values(dequant_ref(DType::IQ4_NL, &b, 32), want_nl);
  expect_values(dequant_ref(DType::MXFP4, &m, 32), want_fp);
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
}

// Element e of a Q2_K / Q3_K block: bits 2s..2s+1 of qs[32h + l] for
// e = 128h + 32s + l; sub-block e / 16; Q3_K's "no -4" bit is bit e / 32 of hmask[l].
TEST(QuantsHandBuilt, Q2_KAndQ3_K) {
  BlockQ2_K b2{};
  BlockQ3_K b3{};
  b2.d = fp32_to_fp16(0.25f);
  b2.dmin = fp32_to_fp16(0.125f);
  b3.d = fp32_to_fp16(0.5f);
  int sc3[16];
  for (int j = 0; j < 16; ++j) {
    b2.scales[j] = static_cast<uint8_t>((j * 5 + 1) % 16 | (((j * 3) % 16) << 4));
    sc3[j] = (j * 9) % 64 - 32;  // stored + 32, 6 bits
    const int v = sc3[j] + 32;
    if (j < 8) b3.scales[j] = static_cast<uint8_t>(b3.scales[j] | (v & 15));
    else b3.scales[j - 8] = static_cast<uint8_t>(b3.scales[j - 8] | ((v & 15) << 4));
    b3.scales[8 + j % 4] = static_cast<uint8_t>(b3.scales[8 + j % 4] | ((v >> 4) << (2 * (j / 4))));
  }
  std::vector<float> want2(256), want3(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e / 32) % 4, l = e % 32, j = e / 16;
    const int q = (e * 7 + 3) % 4, high = (e * 5 + 1) % 3 != 0;
    b2.qs[32 * h + l] = static_cast<uint8_t>(b2.qs[32 * h + l] | (q << (2 * s)));
    b3.qs[32 * h + l] = static_cast<uint8_t>(b3.qs[32 * h + l] | (q << (2 * s)));
    if (high) b3.hmask[l] = static_cast<uint8_t>(b3.hmask[l] | (1 << (e / 32)));
    want2[e] = 0.25f * static_cast<float>(b2.scales[j] & 15) * static_cast<float>(q) -
               0.125f * static_cast<float>(b2.scales[j] >> 4);
    want3[e] = 0.5f * static_cast<float>(sc3[j]) * static_cast<float>(q - (high ? 0 : 4));
  }
  expect_values(dequant_ref(DType::Q2_K, &b2, 256), want2);
  expect_values(dequant_ref(DType::Q3_K, &b3, 256), want3);
}

TEST(QuantsHandBuilt, FloatTypes) {
  const std::vector<float> x{1.0f, -2.5f, 0.0f, 65504.0f, 1e-8f, -0.333f};
  std::vector<uint16_t> h(x.size()), bf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = fp32_to_fp16(x[i]);
    bf[i] = fp32_to_bf16(x[i]);
  }
  const auto f16 = dequant_ref(DType::F16, h.data(), 6), b16 = dequant_ref(DType::BF16, bf.data(), 6);
  const auto f32 = dequant_ref(DType::F32, x.data(), 6);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(f16[i], fp16_to_fp32(h[i]));
    EXPECT_EQ(b16[i], bf16_to_fp32(bf[i]));
    EXPECT_EQ(f32[i], x[i]);
  }
  EXPECT_EQ(f16[1], -2.5f);
  EXPECT_EQ(b16[1], -2.5f);
}

TEST(QuantsErrors, BadLengthOrTypeThrows) {
  std::vector<float> x(48, 1.0f);
  std::vector<uint8_t> buf(1024);
  EXPECT_THROW(quantize_row_ref(DType::Q4_0, x.data(), buf.data(), 48), Error);
  EXPECT_THROW(dequantize_row_ref(DType::Q4_K, buf.data(), x.data(), 32), Error);
  EXPECT_THROW(dequantize_row_ref(static_cast<DType>(16), buf.data(), x.data(), 256), Error);  // IQ2_XXS
  EXPECT_THROW(dequantize_row(DType::I32, buf.data(), x.data(), 4), Error);
  EXPECT_THROW(vec_dot(DType::Q8_K, 256, buf.data(), buf.data()), Error);
}

// ---- gguf-py fixtures (tools/gen_quant_fixtures.py) ----------------------------

struct Fixture {
  DType type;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

Fixture read_fixture(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4];
  uint32_t header[3];
  f.read(magic, 4);
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  if (!f || std::memcmp(magic, "PQF1", 4) != 0) throw Error("bad fixture " + path);
  Fixture fx{static_cast<DType>(header[0]), std::vector<uint8_t>(header[2]), std::vector<float>(header[1])};
  f.read(reinterpret_cast<char*>(fx.blocks.data()), static_cast<std::streamsize>(fx.blocks.size()));
  f.read(reinterpret_cast<char*>(fx.values.data()), static_cast<std::streamsize>(4 * fx.values.size()));
  if (!f) throw Error("truncated fixture " + path);
  return fx;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (fp32_to_bits(got[i]) != fp32_to_bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (++mismatches <= 5) ADD_FAILURE() << what << " element " << i << ": " << got[i] << " != " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

class DequantFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DequantFixture, BitIdenticalToGgufPy) {
  const std::string path = pagellm::test::fixture("quants/" + GetParam());
  REQUIRE_FILE(path);
  const Fixture fx = read_fixture(path);
  const auto n = static_cast<int64_t>(fx.values.size());
  ASSERT_EQ(dtype_row_bytes(fx.type, n), fx.blocks.size());
  expect_same_bits(dequant_ref(fx.type, fx.blocks.data(), n), fx.values, "reference");
  for (Isa isa : test::testable_isas()) {
    IsaGuard guard(isa);
    std::vector<float> y(fx.values.size());
    dequantize_row(fx.type, fx.blocks.data(), y.data(), n);
    expect_same_bits(y, fx.values, std::string("fast ") + isa_name(isa));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Quants, DequantFixture,
    ::testing::Values("dequant_Q5_0_model.bin", "dequant_Q8_0_model.bin", "dequant_Q4_K_model.bin",
                      "dequant_Q6_K_model.bin", "dequant_Q4_0_random.bin", "dequant_Q4_1_random.bin",
                      "dequant_Q5_0_random.bin", "dequant_Q5_1_random.bin", "dequant_Q8_0_random.bin",
                      "dequant_Q4_K_random.bin", "dequant_Q5_K_random.bin", "dequant_Q6_K_random.bin",
                      "dequant_Q2_K_random.bin", "dequant_Q3_K_random.bin", "dequant_IQ4_NL_random.bin",
                      "dequant_IQ4_XS_random.bin", "dequant_MXFP4_random.bin"),
    [](const auto& info) { return info.param.substr(8, info.param.size() - 12); });

class QuantFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantFixture, SameBytesAsGgufPy) {
  const std::string path = pagellm::test::fixture("quants/" + GetParam());
  REQUIRE_FILE(path);
  const Fixture fx = read_fixture(path);
  const auto q = test::quantize_ref(fx.type, fx.values);
  ASSERT_EQ(q.size(), fx.blocks.size());
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i], fx.blocks[i]) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Quants, QuantFixture,
                         ::testing::Values("quant_Q4_0.bin", "quant_Q4_1.bin", "quant_Q5_0.bin", "quant_Q5_1.bin",
                                           "quant_Q8_0.bin", "quant_BF16.bin", "quant_MXFP4.bin"),
                         [](const auto& info) { return info.param.substr(6, info.param.size() - 10); });

// ---- round trips ---------------------------------------------------------------

// Relative RMS error of quantize -> dequantize on N(0, 1) data. The bounds are
// ~1.3x what the quantizers reach (e.g. Q4_0: step = amax/8 of a 32-block,
// amax ~ 2.1 sigma, so rms = step/sqrt(12) ~ 0.076); they fail on any layout
// or rounding bug, which costs far more.
TEST(QuantsRoundTrip, ErrorWithinTypeBound) {
  const std::map<DType, double> bound{
      {DType::F32, 0.0},     {DType::F16, 4e-4},    {DType::BF16, 3e-3},   {DType::Q4_0, 0.10},
      {DType::Q4_1, 0.10},   {DType::Q5_0, 0.05},   {DType::Q5_1, 0.05},   {DType::Q8_0, 0.0065},
      {DType::Q8_1, 0.0065}, {DType::Q4_K, 0.085},  {DType::Q5_K, 0.042},  {DType::Q6_K, 0.022},
      {DType::Q8_K, 0.009},  {DType::Q2_K, 0.36},   {DType::Q3_K, 0.20},   {DType::IQ4_NL, 0.097},
      {DType::IQ4_XS, 0.098}, {DType::MXFP4, 0.15},
  };
  const std::vector<float> x = normal_values(8192, 7);
  for (const auto& [type, max_err] : bound) {
    const auto q = test::quantize_ref(type, x);
    const auto y = dequant_ref(type, q.data(), static_cast<int64_t>(x.size()));
    const double err = test::normalized_error(y, x);
    EXPECT_LE(err, max_err) << dtype_name(type);
    RecordProperty(dtype_name(type), std::to_string(err));
    // Quantizing the same data again gives the same bytes.
    EXPECT_EQ(test::quantize_ref(type, x), q) << dtype_name(type);
  }
}

// A scaled-up copy of the data quantizes to scaled-up values (the scale search
// is relative), and constant / zero blocks come back exactly.
TEST(QuantsRoundTrip, ScaleAndConstantBlocks) {
  // Coarser types: their own error bound.
  const std::map<DType, double> coarse{{DType::Q2_K, 0.36}, {DType::Q3_K, 0.20}, {DType::MXFP4, 0.15}};
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K, DType::Q8_K, DType::Q2_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    std::vector<float> x(512, 0.0f);
    const auto y0 = dequant_ref(type, test::quantize_ref(type, x).data(), 512);
    for (float v : y0) ASSERT_EQ(v, 0.0f) << dtype_name(type);
    const auto big = normal_values(512, 11, 1000.0f), tiny = normal_values(512, 11, 0.05f);
    const double e_big = test::normalized_error(dequant_ref(type, test::quantize_ref(type, big).data(), 512), big);
    const double e_tiny = test::normalized_error(dequant_ref(type, test::quantize_ref(type, tiny).data(), 512), tiny);
    EXPECT_NEAR(e_big, e_tiny, 0.01) << dtype_name(type) << " " << e_big << " " << e_tiny;
    EXPECT_LT(e_big, coarse.count(type) ? coarse.at(type) : 0.12) << dtype_name(type) << " " << e_big;
  }
}

// The quantizers are pure float arithmetic without FMAs or library calls
// beyond sqrt/round: these checksums pin their output on every machine.
// Data: Irwin-Hall(12) - 6 from a fixed LCG, exact in float.
TEST(QuantsRoundTrip, DeterministicBytes) {
  std::vector<float> x(1024);
  uint32_t state = 12345;
  for (float& v : x) {
    int sum = 0;
    for (int k = 0; k < 12; ++k) {
      state = state * 1664525u + 1013904223u;
      sum += static_cast<int>(state >> 20);  // 12-bit uniform
    }
    v = static_cast<float>(sum - 6 * 4096) / 4096.0f;
  }
  auto fnv = [](const std::vector<uint8_t>& b) {
    uint64_t h = 1469598103934665603ull;
    for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
    return h;
  };
  std::map<DType, uint64_t> got;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::Q2_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS,
                  DType::MXFP4})
    got[t] = fnv(test::quantize_ref(t, x));
  // A deliberate quantizer change updates this table (from the failure message).
  const std::map<DType, uint64_t> want{
      {DType::Q4_0, 0xa50c0cf020d82433ull}, {DType::Q4_1, 0x858669367297fb75ull},
      {DType::Q5_0, 0x367b30948588bf59ull}, {DType::Q5_1, 0x5cd6520fc626213eull},
      {DType::Q8_0, 0x7261f04b10fff193ull}, {DType::Q8_1, 0x183a0ad62688c959ull},
      {DType::Q4_K, 0xfa539f3859f6fe58ull}, {DType::Q5_K, 0xd0afd86ea1839812ull},
      {DType::Q6_K, 0xa1b7537a33379a2eull}, {DType::Q8_K, 0x0294542cf2eb87b8ull},
      {DType::Q2_K, 0x5d305267f7e3f9c0ull}, {DType::Q3_K, 0xf008bea1aeac56caull},
      {DType::IQ4_NL, 0x41bb9031c42bf0a0ull}, {DType::IQ4_XS, 0x57814d202f17a0f1ull},
      {DType::MXFP4, 0xaf9f0f45a51b7736ull},
  };
  for (const auto& [t, h] : want) EXPECT_EQ(got[t], h) << dtype_name(t) << ": got 0x" << std::hex << got[t];
}

// ---- fast kernels against the references ----------------------------------------

TEST(QuantsFast, ActivationQuantizationMatchesReferenceBytes) {
  // Random data plus exact rounding ties: amax 127 makes d = 1, so k + 0.5
  // lands exactly half way.
  std::vector<float> x = normal_values(4096, 3, 2.0f);
  for (int j = 0; j < 256; ++j) x[j] = j == 0 ? 127.0f : static_cast<float>(j % 120) - 60.5f;
  for (DType type : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
    const auto want = test::quantize_ref(type, x);
    for (Isa isa : test::testable_isas()) {
      IsaGuard guard(isa);
      std::vector<uint8_t> got(want.size());
      quantize_row(type, x.data(), got.data(), static_cast<int64_t>(x.size()));
      EXPECT_EQ(got, want) << dtype_name(type) << " " << isa_name(isa);
    }
  }
}

TEST(QuantsFast, DequantizeMatchesReferenceBits) {
  const std::vector<float> x = normal_values(2048, 5);
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                     DType::Q8_0, DType::Q8_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::Q2_K,
                     DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    const auto q = test::quantize_ref(type, x);
    const auto want = dequant_ref(type, q.data(), 2048);
    for (Isa isa : test::testable_isas()) {
      IsaGuard guard(isa);
      std::vector<float> y(2048);
      dequantize_row(type, q.data(), y.data(), 2048);
      expect_same_bits(y, want, dtype_name(type) + " " + isa_name(isa));
    }
  }
}

// vec_dot of every weight type: scalar, AVX2 and AVX-512 VNNI agree to float
// rounding (their integer sums are exact), and all are within the 8-bit activation
// quantization error of the exact dot of the dequantized weights.
TEST(QuantsFast, VecDotAgainstExactDot) {
  for (DType type : test::weight_types()) {
    for (int64_t n : {256, 1024, 4096}) {
      double max_rel = 0, max_isa_diff = 0;
      for (int trial = 0; trial < 8; ++trial) {
        const auto w = normal_values(static_cast<size_t>(n), 100 + trial);
        const auto x = normal_values(static_cast<size_t>(n), 200 + trial);
        const auto wq = test::quantize_ref(type, w);
        const auto wd = dequant_ref(type, wq.data(), n);
        double exact = 0, norm = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += static_cast<double>(wd[i]) * x[i];
          norm += static_cast<double>(wd[i]) * wd[i];
        }
        // Typical size of the dot: |w| * rms(x) (one dot can be near zero).
        const double scale = std::sqrt(norm);
        const DType act = vec_dot_type(type);
        std::vector<uint8_t> xq(act == DType::F32 ? 0 : dtype_row_bytes(act, n));
        float results[4] = {};
        int k = 0;
        for (Isa isa : test::testable_isas()) {
          IsaGuard guard(isa);
          const void* a = x.data();
          if (act != DType::F32) {
            quantize_row(act, x.data(), xq.data(), n);
            a = xq.data();
          }
          results[k++] = vec_dot(type, n, wq.data(), a);
        }
        max_rel = std::max(max_rel, std::fabs(results[0] - exact) / scale);
        for (int j = 1; j < k; ++j)
          max_isa_diff = std::max(max_isa_diff, std::fabs(static_cast<double>(results[0]) - results[j]) / scale);
      }
      const bool float_type = !dtype_is_quantized(type);
      // 8-bit activations: rms error ~0.5% of |w| rms(x) per dot; max of 8 trials.
      EXPECT_LT(max_rel, float_type ? 1e-5 : 0.03) << dtype_name(type) << " n=" << n;
      EXPECT_LT(max_isa_diff, 1e-5) << dtype_name(type) << " n=" << n;
      RecordProperty(dtype_name(type) + "_" + std::to_string(n), std::to_string(max_rel));
    }
  }
}

TEST(QuantsIsa, OverrideAndSupport) {
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  {
    IsaGuard guard(Isa::Scalar);
    EXPECT_EQ(kernel_isa(), Isa::Scalar);
  }
  EXPECT_EQ(kernel_isa(), cpu_features().best());
  if (!isa_supported(Isa::Avx512)) {
    EXPECT_THROW(set_isa_override(Isa::Avx512), Error);
  }
  if (!isa_supported(Isa::Avx512Vnni)) {
    EXPECT_THROW(set_isa_override(Isa::Avx512Vnni), Error);
  }
}

// PAGELLM_ISA caps the level by name; an unknown name, or one of the other
// architecture, is a clear error.
TEST(QuantsIsa, EnvironmentCapsTheLevel) {
  for (Isa isa : isa_levels()) {
    Isa parsed = Isa::Scalar;
    ASSERT_TRUE(parse_isa(isa_name(isa), parsed)) << isa_name(isa);
    EXPECT_EQ(parsed, isa);
    setenv("PAGELLM_ISA", isa_name(isa), 1);
    EXPECT_EQ(cpu_features().best(), std::min(isa, cpu_features().detected())) << isa_name(isa);
    EXPECT_EQ(kernel_isa(), cpu_features().best());
  }
  setenv("PAGELLM_ISA", "avx1024", 1);
  EXPECT_THROW(cpu_features().best(), Error);
#if defined(PAGELLM_CPU_ARM)
  setenv("PAGELLM_ISA", "avx2", 1);
#else
  setenv("PAGELLM_ISA", "neon", 1);
#endif
  EXPECT_THROW(cpu_features().best(), Error);
  unsetenv("PAGELLM_ISA");
  EXPECT_EQ(cpu_features().best(), cpu_features().detected());
}

// Which level runs each type, and the start-up line that says so.
TEST(QuantsIsa, KernelsPerTypeAreNamed) {
  EXPECT_EQ(kernel_isa_for(Isa::Scalar, DType::Q4_0), Isa::Scalar);
#if defined(PAGELLM_CPU_ARM)
  for (DType type : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    EXPECT_EQ(kernel_isa_for(Isa::Neon, type), Isa::Neon) << dtype_name(type);
    EXPECT_EQ(kernel_isa_for(Isa::NeonI8mm, type), Isa::NeonDotprod) << dtype_name(type);
  }
  EXPECT_EQ(kernel_isa_for(Isa::NeonDotprod, DType::Q8_0), Isa::NeonDotprod);
  EXPECT_EQ(kernel_isa_for(Isa::NeonI8mm, DType::Q4_0), Isa::NeonI8mm);
  EXPECT_EQ(kernel_isa_for(Isa::NeonI8mm, DType::BF16), Isa::Scalar);
  EXPECT_EQ(kernel_isa_for(Isa::NeonI8mm, DType::F16), Isa::Scalar);
  EXPECT_EQ(describe_kernels(Isa::Scalar), "scalar kernels");
  EXPECT_EQ(describe_kernels(Isa::Neon),
            "neon kernels for Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4, scalar for the "
            "other types");
  EXPECT_EQ(describe_kernels(Isa::NeonI8mm),
            "neon-i8mm kernels for Q4_0 Q8_0 (steps of 2+ tokens), neon-dotprod for one-token steps and Q4_1 Q5_0 "
            "Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4, scalar for the other types");
#else
  EXPECT_EQ(kernel_isa_for(Isa::Avx512, DType::Q4_0), Isa::Avx2);
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4})
    EXPECT_EQ(kernel_isa_for(Isa::Avx512Vnni, type), Isa::Avx512Vnni) << dtype_name(type);
  EXPECT_EQ(kernel_isa_for(Isa::Avx512Vnni, DType::F16), Isa::Avx2);
  EXPECT_EQ(describe_kernels(Isa::Avx2), "avx2 kernels");
  const std::string float_types = cpu_features().avx512bf16 ? "F16 BF16" : "F16";
  EXPECT_EQ(describe_kernels(Isa::Avx512),
            "avx512 kernels for " + float_types + " and attention, avx2 kernels for the other types and ops");
  EXPECT_EQ(describe_kernels(Isa::Avx512Vnni),
            "avx512-vnni kernels for Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 (one-token "
            "steps of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q6_K: avx2), avx512 for " + float_types +
                " and attention, avx2 for the other types and ops");
#endif
}

}  // namespace
}  // namespace pagellm::cpu
