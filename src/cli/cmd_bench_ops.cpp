// `pagellm bench ops`: single ops timed through the Backend interface, per
// shape and (for the CPU) per ISA level, as llama.cpp's `test-backend-ops
// perf`: matmul per weight type, attention, rms_norm. The levels alternate
// within each round (one backend per level, PAGELLM_ISA set around each of
// its calls), so on a shared machine every level sees the same noise; the
// table gives the median over rounds and the ratio to the first level.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "backend/cpu/peak.h"
#include "backend/registry.h"
#include "bench/memory_probe.h"
#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/util.h"

namespace pagellm::cli {
namespace {

struct OpsFlags {
  std::string device = "cpu";
  int threads = 2;
  std::string isa;  // comma list; empty: every level above scalar this CPU has
  std::string ops = "matmul,attention,rms_norm";
  std::string types = "q4_0,q4_1,q5_0,q5_1,q8_0,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_nl,iq4_xs,mxfp4,f16,bf16";
  std::string ns = "1,8,32,512";
  int64_t rows = 5632, cols = 2048;  // TinyLlama's FFN up / gate
  int ctx = 512;                      // decode attention: keys per sequence
  std::string attn_heads = "32/4x64";  // attention: query heads / KV heads x head dim (TinyLlama)
  std::string kv_dtype = "f16";
  int rounds = 5;
  double min_ms = 20;                 // each timed sample runs the op at least this long
  std::string cold = "128MiB";        // matmul weights (decode attention: KV layers) rotate over this many bytes
  std::string read_size = "256MiB";   // streaming read benchmark; 0: skip it
  std::string output_json;
  // Time samples by the calling thread's CPU time (one thread only): the
  // kernels' own cost, steadier than wall time while others share the cores.
  bool cpu_time = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One ISA level's backend (or the one backend of another device).
struct Level {
  std::string isa;  // PAGELLM_ISA value, empty: leave the environment alone
  std::unique_ptr<Backend> be;
  void enter() const {
    if (!isa.empty()) setenv("PAGELLM_ISA", isa.c_str(), 1);
  }
};

BufferPtr put(Backend& be, const std::vector<float>& v) {
  BufferPtr b = be.alloc(DType::F32, v.size());
  be.copy_from_host(v.data(), *b, 0, v.size() * sizeof(float));
  be.synchronize();
  return b;
}

// A case: one op at one shape, with a call per level (each call enters the
// op on that level's backend and waits for it).
struct Case {
  std::string op, type, shape;
  int64_t n = 0;
  double ops = 0, bytes = 0;  // per call: arithmetic operations, bytes moved
  std::function<void(size_t level)> call;
};

struct Row {
  Case c;
  std::vector<double> median_s;  // per level
};

class OpsBench {
 public:
  OpsBench(const OpsFlags& f) : f_(f) {}

  int run() {
    // Bad names fail before anything is measured.
    for (const std::string& op : split_list(f_.ops))
      PAGELLM_CHECK(op == "matmul" || op == "attention" || op == "rms_norm",
                    "bench ops: unknown op '{}' (matmul, attention, rms_norm)", op);
    for (const std::string& t : split_list(f_.types)) (void)dtype_from_name(t);
    PAGELLM_CHECK(!ns().empty() && std::ranges::all_of(ns(), [](int64_t n) { return n > 0; }),
                  "bench ops: --ns takes positive token counts, got '{}'", f_.ns);
    setup_levels();
    nlohmann::json j;
    j["device"] = f_.device;
    j["threads"] = f_.threads;
    j["cpu"] = cpu_features().describe();
    for (const Level& l : levels_) j["levels"].push_back({{"isa", l.isa}, {"backend", describe(l)}});
    PAGELLM_CHECK(!f_.cpu_time || (f_.device == "cpu" && f_.threads == 1), "--cpu-time needs --device cpu -t 1");
    std::printf("# pagellm bench ops: %s, %d threads, median of %d rounds (%s), levels alternating\n",
                f_.device.c_str(), f_.threads, f_.rounds, f_.cpu_time ? "thread CPU time" : "wall time");
    for (const Level& l : levels_) std::printf("#   %s: %s\n", l.isa.empty() ? "-" : l.isa.c_str(), describe(l).c_str());
    if (const int64_t read = parse_byte_size(f_.read_size); read > 0) j["read"] = measure_read(read);
#if defined(PAGELLM_CPU_X86)
    if (f_.device == "cpu" && cpu_features().detected() >= Isa::Avx512Vnni) j["int8_peak"] = measure_int8_peak();
#endif
    print_header();
    for (const std::string& op : split_list(f_.ops)) {
      if (op == "matmul") {
        for (const std::string& t : split_list(f_.types)) run_matmul(dtype_from_name(t), j);
      } else if (op == "attention") {
        run_attention(j);
      } else if (op == "rms_norm") {
        run_rms_norm(j);
      } else {
        fail("bench ops: unknown op '{}' (matmul, attention, rms_norm)", op);
      }
    }
    restore_env();
    if (!f_.output_json.empty()) {
      std::ofstream out(f_.output_json);
      if (!out) fail("cannot write '{}'", f_.output_json);
      out << j.dump(2) << "\n";
    }
    return 0;
  }

 private:
  std::string describe(const Level& l) const {
    l.enter();
    return l.be->describe();
  }

  void setup_levels() {
    if (const char* old = std::getenv("PAGELLM_ISA")) saved_isa_ = std::string(old);
    std::vector<std::string> names;
    if (f_.device == "cpu") {
      if (!f_.isa.empty()) {
        names = split_list(f_.isa);
      } else {
        for (Isa i : {Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni})
          if (cpu_features().detected() >= i) names.push_back(isa_name(i));
        if (names.empty()) names.push_back(isa_name(Isa::Scalar));
      }
      for (const std::string& n : names) {
        Isa isa;
        PAGELLM_CHECK(parse_isa(n.c_str(), isa), "--isa: '{}' is not one of scalar, avx2, avx512, avx512-vnni", n);
        PAGELLM_CHECK(cpu_features().detected() >= isa, "--isa: this CPU has no {} ({})", n, cpu_features().describe());
      }
    } else {
      names.push_back("");
    }
    for (const std::string& n : names) {
      Level l;
      l.isa = n;
      l.enter();
      BackendOptions o;
      if (f_.device == "cpu" && f_.threads > 0) o["threads"] = std::to_string(f_.threads);
      l.be = create_backend(f_.device, o);
      levels_.push_back(std::move(l));
    }
  }

  void restore_env() {
    if (saved_isa_) setenv("PAGELLM_ISA", saved_isa_->c_str(), 1);
    else unsetenv("PAGELLM_ISA");
  }

  nlohmann::json measure_read(int64_t bytes) {
    bench::MemoryProbeOptions o;
    o.buffer_bytes = bytes;
    o.threads = f_.threads;
    o.reps = std::max(3, f_.rounds);
    o.min_bytes_per_rep = bytes;
    const bench::MemoryProbeResult r = bench::run_memory_probe(o);
    std::vector<double> v = r.gb_per_s;
    std::sort(v.begin(), v.end());
    read_gb_s_ = v[v.size() / 2];
    std::printf("# streaming read of %s, %d threads: %.1f GB/s (median of %zu; best %.1f)\n",
                format_bytes(bytes).c_str(), r.threads, read_gb_s_, v.size(), v.back());
    return {{"bytes", bytes}, {"threads", r.threads}, {"gb_per_s_median", read_gb_s_}, {"gb_per_s", r.gb_per_s}};
  }

  // Independent vpdpbusd back to back on every thread: the int8 ceiling.
#if defined(PAGELLM_CPU_X86)
  nlohmann::json measure_int8_peak() {
    const int threads = std::max(1, f_.threads);
    nlohmann::json j;
    for (int bits : {256, 512}) {
      std::vector<double> v;
      for (int r = 0; r < 3; ++r) v.push_back(cpu::avx512::int8_peak_gops(threads, bits, 0.2));
      std::sort(v.begin(), v.end());
      std::printf("# int8 peak, vpdpbusd %d-bit, %d threads: %.0f GOP/s (median of 3, best %.0f)\n", bits, threads,
                  v[1], v[2]);
      j[std::to_string(bits)] = v;
    }
    // The ceilings of the F16 (FMA) and BF16 (vdpbf16ps) panel kernels.
    for (bool bf16 : {false, true}) {
      if (bf16 && !cpu_features().avx512bf16) continue;
      std::vector<double> v;
      for (int r = 0; r < 3; ++r) v.push_back(cpu::avx512::float_peak_gflops(threads, bf16, 0.2));
      std::sort(v.begin(), v.end());
      std::printf("# %s peak, %s 512-bit, %d threads: %.0f GFLOP/s (median of 3, best %.0f)\n", bf16 ? "bf16" : "f32",
                  bf16 ? "vdpbf16ps" : "fma", threads, v[1], v[2]);
      j[bf16 ? "bf16_dp" : "f32_fma"] = v;
    }
    return j;
  }
#endif

  void print_header() {
    std::printf("%-9s %-7s %-22s %5s", "op", "type", "shape", "n");
    for (const Level& l : levels_) std::printf(" | %-11s %9s %8s %7s", l.isa.empty() ? f_.device.c_str() : l.isa.c_str(), "us", "GOP/s", "GB/s");
    if (levels_.size() > 1) std::printf(" | ratio to %s", levels_[0].isa.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }

  // Times every case at every level: per round, the levels in turn (starting
  // one later each round), each sample at least min_ms of back-to-back calls.
  void measure(std::vector<Case>& cases, nlohmann::json& j) {
    const size_t nl = levels_.size();
    for (Case& c : cases) {
      std::vector<int> reps(nl, 1);
      for (size_t l = 0; l < nl; ++l) {  // warm-up, and how many calls make min_ms
        levels_[l].enter();
        c.call(l);
        const double t0 = now_s();
        c.call(l);
        const double one = std::max(1e-7, now_s() - t0);
        reps[l] = static_cast<int>(std::clamp(std::ceil(f_.min_ms * 1e-3 / one), 1.0, 1e6));
      }
      std::vector<std::vector<double>> samples(nl);
      for (int r = 0; r < f_.rounds; ++r) {
        for (size_t k = 0; k < nl; ++k) {
          const size_t l = (k + static_cast<size_t>(r)) % nl;
          levels_[l].enter();
          const double t0 = f_.cpu_time ? thread_cpu_s() : now_s();
          for (int i = 0; i < reps[l]; ++i) c.call(l);
          samples[l].push_back(((f_.cpu_time ? thread_cpu_s() : now_s()) - t0) / reps[l]);
        }
      }
      Row row{c, {}};
      for (auto& s : samples) {
        std::sort(s.begin(), s.end());
        row.median_s.push_back(s[s.size() / 2]);
      }
      print_row(row, j);
    }
  }

  void print_row(const Row& row, nlohmann::json& j) {
    const Case& c = row.c;
    std::printf("%-9s %-7s %-22s %5lld", c.op.c_str(), c.type.c_str(), c.shape.c_str(), static_cast<long long>(c.n));
    nlohmann::json e = {{"op", c.op}, {"type", c.type}, {"shape", c.shape}, {"n", c.n}, {"ops", c.ops}, {"bytes", c.bytes}};
    for (size_t l = 0; l < levels_.size(); ++l) {
      const double s = row.median_s[l];
      std::printf(" | %-11s %9.1f %8.1f %7.1f", "", s * 1e6, c.ops / s / 1e9, c.bytes / s / 1e9);
      e["levels"].push_back({{"isa", levels_[l].isa}, {"median_s", s}, {"gop_per_s", c.ops / s / 1e9},
                             {"gb_per_s", c.bytes / s / 1e9}});
    }
    if (levels_.size() > 1) {
      std::printf(" |");
      for (size_t l = 1; l < levels_.size(); ++l) std::printf(" %.2fx", row.median_s[0] / row.median_s[l]);
    }
    std::printf("\n");
    std::fflush(stdout);
    j["results"].push_back(e);
  }

  std::vector<int64_t> ns() const {
    std::vector<int64_t> v;
    for (const std::string& s : split_list(f_.ns)) {
      size_t used = 0;
      int64_t n = 0;
      try {
        n = std::stoll(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PAGELLM_CHECK(used == s.size() && used > 0, "bench ops: --ns takes comma-separated integers, got '{}'", f_.ns);
      v.push_back(n);
    }
    return v;
  }

  // y[n, rows] = x[n, cols] W^T. The weights rotate over enough copies
  // (f_.cold bytes) that each call reads them from memory, as a model's
  // forward pass does; a few rows of random values quantized once are
  // repeated down the matrix (the time does not depend on the values).
  void run_matmul(DType type, nlohmann::json& j) {
    if (!levels_[0].be->supports_weight(type)) {
      std::printf("%-9s %-7s (not supported by %s)\n", "matmul", dtype_name(type).c_str(), f_.device.c_str());
      return;
    }
    const int64_t rows = f_.rows, cols = f_.cols;
    PAGELLM_CHECK(cols % dtype_block_size(type) == 0, "bench ops: --cols {} is not a multiple of {}'s block size",
                  cols, dtype_name(type));
    const size_t row_bytes = dtype_row_bytes(type, cols), bytes = row_bytes * static_cast<size_t>(rows);
    constexpr int64_t kPatternRows = 64;
    std::vector<uint8_t> pattern(row_bytes * kPatternRows);
    const auto values = random_floats(static_cast<size_t>(kPatternRows * cols), 7);
    for (int64_t r = 0; r < kPatternRows; ++r)
      quantize_row_ref(type, values.data() + r * cols, pattern.data() + r * row_bytes, cols);
    const int copies = static_cast<int>(std::max<int64_t>(1, (parse_byte_size(f_.cold) + bytes - 1) / bytes));
    std::vector<std::vector<uint8_t>> host(static_cast<size_t>(copies), std::vector<uint8_t>(bytes));
    for (auto& h : host)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(h.data() + r * row_bytes, pattern.data() + (r % kPatternRows) * row_bytes, row_bytes);

    const auto list = ns();
    const int64_t max_n = *std::max_element(list.begin(), list.end());
    const auto x = random_floats(static_cast<size_t>(max_n * cols), 8);
    struct PerLevel {
      std::vector<std::unique_ptr<Weight>> w;
      BufferPtr x, y;
      size_t next = 0;
    };
    std::vector<PerLevel> st(levels_.size());
    // Copy by copy across the levels: with each level's copies allocated
    // together, an avx2-vs-avx2 run favoured the first level by up to 1.2x
    // (cause not pinned down; huge pages fell back 0 times).
    for (int c = 0; c < copies; ++c)
      for (size_t l = 0; l < levels_.size(); ++l) {
        levels_[l].enter();  // the CPU repacks per level at upload
        st[l].w.push_back(levels_[l].be->upload({"w", type, {cols, rows}, host[c].data()}));
      }
    for (size_t l = 0; l < levels_.size(); ++l) {
      levels_[l].enter();
      st[l].x = put(*levels_[l].be, x);
      st[l].y = levels_[l].be->alloc(DType::F32, static_cast<size_t>(max_n * rows));
    }
    std::vector<Case> cases;
    for (int64_t n : list) {
      Case c;
      c.op = "matmul";
      c.type = dtype_name(type);
      c.shape = fmt::format("{}x{}", rows, cols);
      c.n = n;
      c.ops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(n);
      c.bytes = static_cast<double>(bytes) + 4.0 * static_cast<double>(n) * static_cast<double>(rows + cols);
      c.call = [this, &st, n](size_t l) {
        PerLevel& s = st[l];
        Backend& be = *levels_[l].be;
        be.matmul(*s.w[s.next], *s.x, n, *s.y);
        s.next = (s.next + 1) % s.w.size();
        be.synchronize();
      };
      cases.push_back(std::move(c));
    }
    measure(cases, j);
  }

  // Attention of --attn-heads (default TinyLlama's: 32 query heads, 4 KV
  // heads of 64; Gemma 3 270M is 4/1x256). n <= 64: n sequences decode one
  // token each over ctx keys; larger n: one sequence's prefill of n tokens
  // (causal).
  void run_attention(nlohmann::json& j) {
    int kHeads = 0, kKvHeads = 0, kDim = 0;
    char end = 0;
    PAGELLM_CHECK(std::sscanf(f_.attn_heads.c_str(), "%d/%dx%d%c", &kHeads, &kKvHeads, &kDim, &end) == 3 &&
                      kHeads > 0 && kKvHeads > 0 && kDim > 0 && kHeads % kKvHeads == 0,
                  "--attn-heads '{}': expected QUERY_HEADS/KV_HEADS x HEAD_DIM, e.g. 32/4x64", f_.attn_heads);
    constexpr int kBlock = 16;
    const DType kv = dtype_from_name(f_.kv_dtype);
    struct PerLevel {
      BatchInfo batch;
      BufferPtr q, out;
      int next_layer = 0;
    };
    for (int64_t n : ns()) {
      const bool decode = n <= 64;
      const int64_t seqs = decode ? n : 1, ctx = decode ? f_.ctx : n, q_len = decode ? 1 : n;
      const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock;
      // Decode reads the cache from memory, as in a model (the weights of a
      // whole step pass between two reads of a layer's cache): the calls
      // rotate over enough layers (--cold bytes) that each reads its keys
      // and values from memory. Prefill's keys are reused enough not to care.
      const int64_t layer_bytes = seqs * ctx * kKvHeads * kDim * 2 * static_cast<int64_t>(dtype_size(kv));
      const int layers =
          decode ? static_cast<int>(std::clamp<int64_t>((parse_byte_size(f_.cold) + layer_bytes - 1) / layer_bytes, 1, 1024))
                 : 1;
      KVCacheSpec spec;
      spec.n_layers = layers;
      spec.n_kv_heads = kKvHeads;
      spec.head_dim = kDim;
      spec.block_size = kBlock;
      spec.num_blocks = static_cast<int>(1 + seqs * blocks_per_seq);
      spec.dtype = kv;
      // The fill batch writes every position; the query batch is the last q_len of each sequence.
      BatchInfo fill, query;
      for (int64_t s = 0; s < seqs; ++s) {
        SeqInfo fs, qs;
        for (int64_t b = 0; b < blocks_per_seq; ++b) fs.block_table.push_back(static_cast<int32_t>(1 + s * blocks_per_seq + b));
        qs.block_table = fs.block_table;
        fs.q_start = static_cast<int32_t>(fill.token_ids.size());
        fs.q_len = fs.ctx_len = static_cast<int32_t>(ctx);
        qs.q_start = static_cast<int32_t>(query.token_ids.size());
        qs.q_len = static_cast<int32_t>(q_len);
        qs.ctx_len = static_cast<int32_t>(ctx);
        for (int64_t p = 0; p < ctx; ++p) {
          const int64_t slot = static_cast<int64_t>(fs.block_table[p / kBlock]) * kBlock + p % kBlock;
          fill.token_ids.push_back(0);
          fill.positions.push_back(static_cast<int32_t>(p));
          fill.slot_mapping.push_back(slot);
          if (p >= ctx - q_len) {
            query.token_ids.push_back(0);
            query.positions.push_back(static_cast<int32_t>(p));
            query.slot_mapping.push_back(slot);
          }
        }
        fill.seqs.push_back(fs);
        query.seqs.push_back(qs);
      }
      const int64_t nq = query.n_tokens(), nf = fill.n_tokens();
      const auto k = random_floats(static_cast<size_t>(nf * kKvHeads * kDim), 1);
      const auto v = random_floats(static_cast<size_t>(nf * kKvHeads * kDim), 2);
      const auto q = random_floats(static_cast<size_t>(nq * kHeads * kDim), 3);
      std::vector<PerLevel> st(levels_.size());
      for (size_t l = 0; l < levels_.size(); ++l) {
        levels_[l].enter();
        Backend& be = *levels_[l].be;
        be.allocate_kv_cache(spec);
        be.set_batch(fill);
        BufferPtr kb = put(be, k), vb = put(be, v);
        for (int layer = 0; layer < layers; ++layer) be.store_kv(layer, *kb, *vb);
        be.synchronize();
        st[l].batch = query;
        be.set_batch(st[l].batch);
        st[l].q = put(be, q);
        st[l].out = be.alloc(DType::F32, q.size());
      }
      AttentionConfig cfg;
      cfg.n_head = kHeads;
      cfg.n_head_kv = kKvHeads;
      cfg.head_dim = kDim;
      cfg.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
      // Query-key pairs: ctx per decode query; the causal triangle for prefill.
      const double pairs = decode ? static_cast<double>(seqs * ctx) : 0.5 * static_cast<double>(n) * static_cast<double>(n + 1);
      Case c;
      c.op = "attention";
      c.type = f_.kv_dtype;
      c.shape = decode ? fmt::format("{} seqs x ctx {}", seqs, ctx) : fmt::format("prefill {}", n);
      if (f_.attn_heads != OpsFlags{}.attn_heads) c.shape += " " + f_.attn_heads;
      c.n = n;
      c.ops = 4.0 * kHeads * kDim * pairs;  // QK and PV, a multiply and an add each
      c.bytes = static_cast<double>(seqs * ctx) * kKvHeads * kDim * 2 * static_cast<double>(dtype_size(kv)) +
                8.0 * static_cast<double>(nq) * kHeads * kDim;
      c.call = [this, &st, cfg, layers](size_t l) {
        Backend& be = *levels_[l].be;
        be.attention(st[l].next_layer, *st[l].q, *st[l].out, cfg);
        st[l].next_layer = (st[l].next_layer + 1) % layers;
        be.synchronize();
      };
      std::vector<Case> cases{std::move(c)};
      measure(cases, j);
    }
  }

  // x[n, 4096] normalized with a weight: one read and one write per value.
  void run_rms_norm(nlohmann::json& j) {
    constexpr int64_t kDim = 4096;
    for (int64_t n : ns()) {
      const auto x = random_floats(static_cast<size_t>(n * kDim), 4), w = random_floats(kDim, 5);
      struct PerLevel {
        std::unique_ptr<Weight> w;
        BufferPtr x, y;
      };
      std::vector<PerLevel> st(levels_.size());
      for (size_t l = 0; l < levels_.size(); ++l) {
        levels_[l].enter();
        Backend& be = *levels_[l].be;
        st[l].w = be.upload({"norm.weight", DType::F32, {kDim}, w.data()});
        st[l].x = put(be, x);
        st[l].y = be.alloc(DType::F32, x.size());
      }
      Case c;
      c.op = "rms_norm";
      c.type = "f32";
      c.shape = fmt::format("{} x {}", n, kDim);
      c.n = n;
      c.ops = 4.0 * static_cast<double>(n * kDim);  // square, add, scale, weight
      c.bytes = 8.0 * static_cast<double>(n * kDim);
      c.call = [this, &st, n](size_t l) {
        Backend& be = *levels_[l].be;
        be.rms_norm(*st[l].x, st[l].w.get(), n, kDim, 1e-5f, *st[l].y);
        be.synchronize();
      };
      std::vector<Case> cases{std::move(c)};
      measure(cases, j);
    }
  }

  const OpsFlags& f_;
  std::vector<Level> levels_;
  std::optional<std::string> saved_isa_;
  double read_gb_s_ = 0;
};

}  // namespace

CLI::App* add_bench_ops(CLI::App& bench, std::function<int()>& run) {
  auto* sub = bench.add_subcommand("ops", "Single ops per shape and ISA level: GOP/s and GB/s (like test-backend-ops perf)");
  auto f = std::make_shared<OpsFlags>();
  sub->add_option("--device", f->device, "Backend")->capture_default_str();
  sub->add_option("-t,--threads", f->threads, "Threads of the CPU backend (other devices ignore it)")->capture_default_str();
  sub->add_option("--isa", f->isa, "CPU levels to alternate, e.g. avx2,avx512-vnni (default: every level from avx2 up "
                                   "this CPU has)");
  sub->add_option("--ops", f->ops, "Ops: matmul, attention, rms_norm")->capture_default_str();
  sub->add_option("--types", f->types, "Matmul weight types")->capture_default_str();
  sub->add_option("--ns", f->ns, "Tokens per call: matmul rows of x; attention: n <= 64 decodes n sequences, larger n "
                                 "is one sequence's prefill")->capture_default_str();
  sub->add_option("--rows", f->rows, "Matmul output features")->capture_default_str();
  sub->add_option("--cols", f->cols, "Matmul input features")->capture_default_str();
  sub->add_option("--ctx", f->ctx, "Decode attention: keys per sequence")->capture_default_str();
  sub->add_option("--attn-heads", f->attn_heads, "Attention shape: query heads / KV heads x head dim")
      ->capture_default_str();
  sub->add_option("--kv-dtype", f->kv_dtype, "Attention cache type: f16, f32 or i8")->capture_default_str();
  sub->add_option("--rounds", f->rounds, "Rounds (the median is reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--min-ms", f->min_ms, "Each sample runs the op back to back at least this long")->capture_default_str();
  sub->add_option("--cold", f->cold, "Matmul weights and decode attention's KV cache rotate over copies of at least this many bytes (beyond the caches)")
      ->capture_default_str();
  sub->add_option("--read-size", f->read_size, "Streaming read benchmark buffer (0: skip)")->capture_default_str();
  sub->add_option("--output-json", f->output_json, "Also write the results as JSON here");
  sub->add_flag("--cpu-time", f->cpu_time, "Time by the thread's CPU time (needs -t 1): steadier on a shared machine");
  run = [f]() { return OpsBench(*f).run(); };
  return sub;
}

}  // namespace pagellm::cli
