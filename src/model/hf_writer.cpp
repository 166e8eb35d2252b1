#include "model/hf_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/quant_blocks.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/arch.h"
#include "model/families/common.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

// One tensor to write: where it comes from, its HF name, and how it is transformed.
struct Entry {
  TensorData src;  // a view (one expert of a stacked tensor is a slice)
  std::string hf_name;
  bool gemma_norm = false;  // write w - 1
  int permute_heads = 0;    // > 0: un-permute GGUF llama Q/K rows over this many heads
  int shard = 0;
  // Packed bytes written as they are (U8: gpt-oss's MXFP4 blocks and scales),
  // with their row-major shape; src is unused then.
  std::vector<uint8_t> raw = {};
  std::vector<int64_t> raw_shape = {};
};

// The type non-packed tensors are stored in: an MXFP4 checkpoint keeps all
// but the experts in BF16, as gpt-oss's does.
DType stored_type(DType t) { return t == DType::MXFP4 ? DType::BF16 : t; }

using family::decimal;

const char* hf_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::MXFP4: return "BF16";  // all but the experts (checked against the family by the writer)
    default: fail("a Hugging Face folder stores F32, F16 or BF16 tensors (or gpt-oss MXFP4 experts), not {}",
                  dtype_name(t));
  }
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16:
    case DType::MXFP4: return "bfloat16";
    default: fail("a Hugging Face folder stores F32, F16 or BF16 tensors, not {}", dtype_name(t));
  }
}

bool same_values(const TensorData& t, const std::vector<float>& values) {
  return t.type == DType::F32 && t.shape.size() == 1 && t.cols() == static_cast<int64_t>(values.size()) &&
         std::memcmp(t.data, values.data(), values.size() * sizeof(float)) == 0;
}

// A stacked-experts tensor in gpt-oss's HF layout (x @ W: [n_expert, in,
// out]; a fused gate_up interleaves gate and up columns), as an F32 copy.
// The GateUpEven half writes both.
// The up half of a fused gate_up whose gate half (GateUpEven) is `t`, or null
// for any other tensor.
const TensorData* gate_up_partner(const ArchInfo& arch, const TensorSpec& spec, const TensorData& t,
                                  const TensorSource& src, const std::string& gguf) {
  if (spec.transform != Transform::GateUpEven) return nullptr;
  for (const TensorSpec& s : arch.layer)
    if (s.transform == Transform::GateUpOdd && std::string_view(s.hf) == spec.hf) {
      const std::string name = gguf.substr(0, gguf.size() - std::string_view(spec.gguf).size()) + s.gguf;
      const TensorData* odd = src.find(name);
      PAGELLM_CHECK(odd && odd->shape == t.shape, "cannot write a Hugging Face folder: '{}' has no matching '{}'",
                    gguf, name);
      return odd;
    }
  fail("cannot write a Hugging Face folder: '{}' has no odd half", gguf);
}

// Fused experts in nn.Linear's orientation: [n_expert, 2 * ff, in], each
// expert's gate rows (`gate`, the GateUpFirstHalf tensor) then its up rows.
Entry gate_up_halves(const ArchInfo& arch, const TensorSpec& spec, const TensorData& gate, const TensorSource& src,
                     const std::string& gguf, const std::string& hf, std::vector<std::vector<float>>& owned) {
  const TensorData* up = nullptr;
  for (const TensorSpec& s : arch.layer)
    if (s.transform == Transform::GateUpSecondHalf && std::string_view(s.hf) == spec.hf)
      up = src.find(gguf.substr(0, gguf.size() - std::string_view(spec.gguf).size()) + s.gguf);
  PAGELLM_CHECK(up && up->shape == gate.shape && gate.shape.size() == 3,
                "cannot write a Hugging Face folder: '{}' has no up half of its shape", gguf);
  const int64_t cols = gate.cols(), ff = gate.shape[1], experts = gate.shape[2];
  auto& v = owned.emplace_back(static_cast<size_t>(experts * 2 * ff * cols));
  for (int p = 0; p < 2; ++p) {
    const TensorData& from = p == 0 ? gate : *up;
    const size_t row_bytes = dtype_row_bytes(from.type, cols);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = 0; r < ff; ++r)
        dequantize_row_ref(from.type, static_cast<const uint8_t*>(from.data) + (e * ff + r) * row_bytes,
                           v.data() + ((e * 2 + p) * ff + r) * cols, cols);
  }
  TensorData d;
  d.type = DType::F32;
  d.shape = {cols, 2 * ff, experts};
  d.data = v.data();
  return {d, hf};
}

Entry stacked_experts(const ArchInfo& arch, const TensorSpec& spec, const TensorData& t, const TensorSource& src,
                      const std::string& gguf, const std::string& hf, std::vector<std::vector<float>>& owned) {
  const TensorData* odd = gate_up_partner(arch, spec, t, src, gguf);
  const bool bias = t.shape.size() == 2;
  const int64_t cols = t.cols(), out = bias ? cols : t.shape[1], in = bias ? 1 : cols, experts = t.shape.back();
  const int64_t parts = odd ? 2 : 1;
  auto& v = owned.emplace_back(static_cast<size_t>(experts * in * out * parts));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int p = 0; p < parts; ++p) {
    const TensorData& from = p == 0 ? t : *odd;
    const size_t row_bytes = dtype_row_bytes(from.type, cols);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = 0; r < (bias ? 1 : out); ++r) {
        dequantize_row_ref(from.type, static_cast<const uint8_t*>(from.data) + (e * (bias ? 1 : out) + r) * row_bytes,
                           row.data(), cols);
        for (int64_t k = 0; k < cols; ++k) {
          // GGUF element (e, o, i) -> HF (e, i, o * parts + p).
          const int64_t o = bias ? k : r, i = bias ? 0 : k;
          v[(e * in + i) * out * parts + o * parts + p] = row[k];
        }
      }
  }
  TensorData d;
  d.type = DType::F32;
  d.shape = bias ? Dims{out * parts, experts} : Dims{out * parts, in, experts};
  d.data = v.data();
  return {d, hf};
}

// MLA's kv_b_proj from llama.cpp's split (attn_k_b: each head's key rows
// transposed, [nope, kv_lora, n_head]; attn_v_b: its value rows), as an F32
// copy [n_head * (nope + v), kv_lora]. The KvBKeys spec writes it.
Entry mla_kv_b(const ArchInfo& arch, const TensorSpec& spec, const TensorData& keys, const TensorSource& src,
               const std::string& gguf, const std::string& hf, std::vector<std::vector<float>>& owned) {
  const TensorData* values = nullptr;
  for (const TensorSpec& s : arch.layer)
    if (s.transform == Transform::KvBValues && std::string_view(s.hf) == spec.hf)
      values = src.find(gguf.substr(0, gguf.size() - std::string_view(spec.gguf).size()) + s.gguf);
  PAGELLM_CHECK(values && keys.shape.size() == 3 && values->shape.size() == 3 && values->shape[0] == keys.shape[1] &&
                    values->shape[2] == keys.shape[2],
                "cannot write a Hugging Face folder: '{}' has no value half of its shape", gguf);
  const int64_t nope = keys.shape[0], D = keys.shape[1], H = keys.shape[2], v = values->shape[1];
  auto& out = owned.emplace_back(static_cast<size_t>(H * (nope + v) * D));
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t d = 0; d < D; ++d) {
      dequantize_row_ref(keys.type, static_cast<const uint8_t*>(keys.data) +
                                        (h * D + d) * dtype_row_bytes(keys.type, nope), row.data(), nope);
      for (int64_t j = 0; j < nope; ++j) out[(h * (nope + v) + j) * D + d] = row[j];
    }
    for (int64_t i = 0; i < v; ++i)
      dequantize_row_ref(values->type, static_cast<const uint8_t*>(values->data) +
                                           (h * v + i) * dtype_row_bytes(values->type, D),
                         out.data() + (h * (nope + v) + nope + i) * D, D);
  }
  TensorData d;
  d.type = DType::F32;
  d.shape = {D, H * (nope + v)};
  d.data = out.data();
  return {d, hf};
}

// Qwen3-Next's in_proj_qkvz from GGUF's attn_qkv (`qkv`, the QkvzQkv
// tensor) and attn_gate: per key head its q, k, v and z rows, as an F32 copy.
Entry qkvz_fused(const ArchInfo& arch, const TensorSpec& spec, const TensorData& qkv, const TensorSource& src,
                 const ModelConfig& c, const std::string& gguf, const std::string& hf,
                 std::vector<std::vector<float>>& owned) {
  const TensorData* z = nullptr;
  for (const TensorSpec& s : arch.layer)
    if (s.transform == Transform::QkvzZ && std::string_view(s.hf) == spec.hf)
      z = src.find(gguf.substr(0, gguf.size() - std::string_view(spec.gguf).size()) + s.gguf);
  const ModelConfig::LinearAttn& la = c.linear;
  const int64_t nk = la.n_k_heads, dk = la.head_k_dim, vz = la.value_dim() / nk, cols = qkv.cols();
  PAGELLM_CHECK(z && z->cols() == cols && z->rows() == nk * vz && qkv.rows() == nk * (2 * dk + vz),
                "cannot write a Hugging Face folder: '{}' has no attn_gate of the linear layer's shape", gguf);
  const int64_t per_head = 2 * dk + 2 * vz;
  auto& v = owned.emplace_back(static_cast<size_t>(nk * per_head * cols));
  auto copy_rows = [&](const TensorData& from, int64_t row, int64_t count, int64_t to_row) {
    const size_t row_bytes = dtype_row_bytes(from.type, cols);
    for (int64_t r = 0; r < count; ++r)
      dequantize_row_ref(from.type, static_cast<const uint8_t*>(from.data) + (row + r) * row_bytes,
                         v.data() + (to_row + r) * cols, cols);
  };
  for (int64_t h = 0; h < nk; ++h) {
    const int64_t base = h * per_head;
    copy_rows(qkv, h * dk, dk, base);                   // q
    copy_rows(qkv, nk * dk + h * dk, dk, base + dk);    // k
    copy_rows(qkv, 2 * nk * dk + h * vz, vz, base + 2 * dk);  // v
    copy_rows(*z, h * vz, vz, base + 2 * dk + vz);      // z
  }
  TensorData d;
  d.type = DType::F32;
  d.shape = {cols, nk * per_head};
  d.data = v.data();
  return {d, hf};
}

// A Gated DeltaNet tensor as HF holds it, as an F32 copy: A_log back from
// -exp(A_log), value heads regrouped by key head when the model has them
// tiled (TensorSpec::vheads), the conv taps as [conv_dim, 1, K].
Entry linear_attention_tensor(const TensorSpec& spec, const TensorData& t, const ModelConfig& c, const std::string& hf,
                              std::vector<std::vector<float>>& owned) {
  const ModelConfig::LinearAttn& la = c.linear;
  // A vector's elements are rows of one value.
  const int64_t cols = t.shape.size() == 1 ? 1 : t.cols(), rows = t.shape.size() == 1 ? t.cols() : t.rows();
  std::vector<float> v(static_cast<size_t>(rows * cols));
  const size_t row_bytes = dtype_row_bytes(t.type, t.cols());
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + r * row_bytes, v.data() + r * t.cols(), t.cols());
  if (spec.transform == Transform::NegExp)
    for (float& x : v) {
      PAGELLM_CHECK(x < 0, "cannot write a Hugging Face folder: '{}' holds {}, not a decay rate -exp(A_log)", t.name, x);
      x = std::log(-x);
    }
  auto& out = owned.emplace_back(v);
  if (spec.vheads != VHeads::None && la.v_heads_tiled && la.n_k_heads != la.n_v_heads) {
    const int64_t nk = la.n_k_heads, per_k = la.n_v_heads / la.n_k_heads;
    // Grouped head h (key head h / per_k) is tiled head (h % per_k) * nk + h / per_k.
    auto tiled = [&](int64_t h) { return (h % per_k) * nk + h / per_k; };
    if (spec.vheads == VHeads::Rows) {
      const int64_t unit = rows == la.n_v_heads ? 1 : la.head_v_dim, first = rows - la.n_v_heads * unit;
      for (int64_t h = 0; h < la.n_v_heads; ++h)
        std::copy_n(v.data() + (first + tiled(h) * unit) * cols, unit * cols, out.data() + (first + h * unit) * cols);
    } else {
      const int64_t unit = la.head_v_dim;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < la.n_v_heads; ++h)
          std::copy_n(v.data() + r * cols + tiled(h) * unit, unit, out.data() + r * cols + h * unit);
    }
  }
  TensorData d;
  d.type = DType::F32;
  d.shape = t.shape;
  if (spec.transform == Transform::ConvTaps) d.shape = {t.cols(), 1, t.rows()};  // [conv_dim, 1, K]
  if (spec.matrix && d.shape.size() == 1) d.shape = {d.cols(), 1};                 // HF: [1, cols]
  d.data = out.data();
  return {d, hf};
}

// A stacked MXFP4 expert tensor as gpt-oss checkpoints hold it: "<hf>_blocks"
// [n_expert, rows, cols / 32, 16] (element 2i in the low nibble of byte i)
// and "<hf>_scales" [n_expert, rows, cols / 32], rows out x in, a fused
// gate_up interleaving gate and up rows (the GateUpEven spec writes both).
std::vector<Entry> mxfp4_experts(const ArchInfo& arch, const TensorSpec& spec, const TensorData& t,
                                 const TensorSource& src, const std::string& gguf, const std::string& hf) {
  std::vector<const TensorData*> parts{&t};
  if (const TensorData* odd = gate_up_partner(arch, spec, t, src, gguf)) parts.push_back(odd);
  for (const TensorData* p : parts)
    PAGELLM_CHECK(p->type == DType::MXFP4, "cannot write MXFP4 experts: '{}' is {}", p->name, dtype_name(p->type));
  const int64_t groups = t.cols() / QK_MXFP4, out = t.shape[1], experts = t.shape[2];
  const int64_t n = static_cast<int64_t>(parts.size()), rows = out * n;
  Entry blocks, scales;
  blocks.hf_name = hf + "_blocks";
  scales.hf_name = hf + "_scales";
  blocks.raw.resize(static_cast<size_t>(experts * rows * groups * 16));
  scales.raw.resize(static_cast<size_t>(experts * rows * groups));
  blocks.raw_shape = {experts, rows, groups, 16};
  scales.raw_shape = {experts, rows, groups};
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        // HF row r is row r / n of part r % n.
        const auto* b = static_cast<const BlockMXFP4*>(parts[r % n]->data) + (e * out + r / n) * groups + g;
        const int64_t at = (e * rows + r) * groups + g;
        scales.raw[at] = b->e;
        auto nibble = [&](int i) { return i < 16 ? b->qs[i] & 0x0F : b->qs[i - 16] >> 4; };
        for (int m = 0; m < 16; ++m)
          blocks.raw[at * 16 + m] = static_cast<uint8_t>(nibble(2 * m) | (nibble(2 * m + 1) << 4));
      }
  std::vector<Entry> v;
  v.push_back(std::move(blocks));
  v.push_back(std::move(scales));
  return v;
}

// The tensors the model uses, in file order (embedding, layers, the rest),
// with their HF names, from the architecture table.
std::vector<Entry> plan_tensors(const ModelConfig& c, const TensorSource& src, std::vector<std::vector<float>>& owned,
                                bool mxfp4) {
  const ArchInfo& arch = arch_info(c.arch);
  std::vector<Entry> out;
  auto add = [&](const TensorSpec& spec, const std::string& gguf, const std::string& hf, int il) {
    if (!tensor_in_layer(spec, c, il)) return;
    const TensorData* t = src.find(gguf);
    if (!*spec.hf) {
      // Only RoPE divisors the config states or implies (Llama 3 scaling,
      // LongRoPE) have a config.json form; the loader computes them back from it.
      const std::vector<float>* implied = config_rope_factors(c, spec.slots[0]);
      PAGELLM_CHECK(!t || (implied && same_values(*t, *implied)),
                    "cannot write a Hugging Face folder: tensor '{}' has no config.json equivalent here", gguf);
      return;
    }
    const bool required = tensor_required(spec, c, il);
    if (!t) {
      PAGELLM_CHECK(!required, "cannot write a Hugging Face folder: the model has no tensor '{}'", gguf);
      return;
    }
    if (!required && spec.need != Need::Optional) return;  // a flag the config does not set
    if (spec.experts && hf.find("{}") == std::string::npos) {
      if (spec.transform == Transform::GateUpOdd || spec.transform == Transform::GateUpSecondHalf)
        return;  // written with its gate half
      if (spec.transform == Transform::None) {  // nn.Linear orientation: GGUF's layout as it is
        out.push_back({*t, hf});
        return;
      }
      if (spec.transform == Transform::GateUpFirstHalf) {
        out.push_back(gate_up_halves(arch, spec, *t, src, gguf, hf, owned));
        return;
      }
      if (spec.matrix && mxfp4)
        for (Entry& e : mxfp4_experts(arch, spec, *t, src, gguf, hf)) out.push_back(std::move(e));
      else
        out.push_back(stacked_experts(arch, spec, *t, src, gguf, hf, owned));
      return;
    }
    if (spec.experts) {
      // HF keeps one matrix per expert: "...experts.{}.w1.weight".
      const std::string pattern = hf;
      const size_t at = pattern.find("{}");
      for (int64_t e = 0; e < t->shape[2]; ++e)
        out.push_back({expert_slice(*t, e), pattern.substr(0, at) + std::to_string(e) + pattern.substr(at + 2)});
      return;
    }
    if (spec.transform == Transform::KvBValues) return;  // written with its key half
    if (spec.transform == Transform::KvBKeys) {
      out.push_back(mla_kv_b(arch, spec, *t, src, gguf, hf, owned));
      return;
    }
    if (spec.transform == Transform::QkvzZ) return;  // written with attn_qkv
    if (spec.transform == Transform::QkvzQkv) {
      out.push_back(qkvz_fused(arch, spec, *t, src, c, gguf, hf, owned));
      return;
    }
    if (spec.vheads != VHeads::None || spec.transform == Transform::NegExp || spec.transform == Transform::ConvTaps) {
      out.push_back(linear_attention_tensor(spec, *t, c, hf, owned));
      return;
    }
    if (spec.transform == Transform::PositionOffset && c.hf_pos_offset > 0) {
      // RoBERTa's rows before position 0: zeros (the padding row is zero in
      // transformers; the row before it is never read).
      const int64_t cols = t->cols(), skip = c.hf_pos_offset;
      auto& v = owned.emplace_back(static_cast<size_t>((skip + t->rows()) * cols), 0.0f);
      const size_t row_bytes = dtype_row_bytes(t->type, cols);
      for (int64_t r = 0; r < t->rows(); ++r)
        dequantize_row_ref(t->type, static_cast<const uint8_t*>(t->data) + r * row_bytes,
                           v.data() + (skip + r) * cols, cols);
      out.push_back({TensorData{t->name, DType::F32, {cols, skip + t->rows()}, v.data()}, hf});
      return;
    }
    // GGUF llama files rotate adjacent pairs with Q/K rows permuted; HF rotates halves.
    const bool unpermute = spec.transform == Transform::RopePermute && !c.rope.neox;
    TensorData view = *t;
    if (spec.matrix && view.shape.size() == 1) view.shape = {view.cols(), 1};  // HF: [1, cols]
    out.push_back({view, hf, spec.transform == Transform::NormPlusOne,
                   unpermute ? static_cast<int>(t->rows() / c.head_dim) : 0});
  };
  const TensorSpec& embd = arch.globals.front();
  add(embd, embd.gguf, embd.hf, -1);
  for (int il = 0; il < c.n_layer; ++il)
    for (const TensorSpec& spec : arch.layer)
      add(spec, layer_tensor_name(spec, il), fmt::format("{}{}.{}", arch.hf_layers, il, spec.hf), il);
  for (size_t k = 1; k < arch.globals.size(); ++k)
    add(arch.globals[k], arch.globals[k].gguf, arch.globals[k].hf, -1);
  return out;
}

// Splits the tensors, in order, into `shards` contiguous non-empty groups of
// about equal bytes.
void assign_shards(std::vector<Entry>& entries, int shards, const std::vector<size_t>& bytes) {
  const int n = static_cast<int>(entries.size());
  PAGELLM_CHECK(shards >= 1 && shards <= n, "cannot split {} tensors into {} shards", n, shards);
  size_t total = 0;
  for (size_t b : bytes) total += b;
  size_t before = 0;
  int prev = 0;
  for (int i = 0; i < n; ++i) {
    const double mid = (static_cast<double>(before) + bytes[i] / 2.0) / static_cast<double>(total);
    int k = std::min(shards - 1, static_cast<int>(mid * shards));
    k = std::clamp(k, prev, prev + (i > 0 ? 1 : 0));
    k = std::max(k, shards - (n - i));  // leave one tensor for every later shard
    entries[i].shard = k;
    prev = k;
    before += bytes[i];
  }
}

std::string shard_file_name(int k, int shards) {
  return shards == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards);
}

// Converts one tensor to `dtype` in HF row order and appends it to `out`.
void write_tensor(std::ofstream& out, const Entry& e, DType dtype) {
  if (!e.raw.empty()) {
    out.write(reinterpret_cast<const char*>(e.raw.data()), static_cast<std::streamsize>(e.raw.size()));
    return;
  }
  const TensorData& t = e.src;
  const int64_t cols = t.cols(), rows = t.rows();
  const size_t src_row_bytes = dtype_row_bytes(t.type, cols);
  const size_t dst_row_bytes = dtype_row_bytes(dtype, cols);
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> bytes(dst_row_bytes);
  const int64_t hd = e.permute_heads ? rows / e.permute_heads : 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t from = r;
    if (e.permute_heads) {
      // HF row h*hd + j*hd/2 + i holds GGUF row h*hd + 2*i + j (llama.cpp's
      // converter interleaves the two halves of each head).
      const int64_t h = r / hd, within = r % hd, j = within / (hd / 2), i = within % (hd / 2);
      from = h * hd + 2 * i + j;
    }
    dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(from) * src_row_bytes,
                            row.data(), cols);
    if (e.gemma_norm)
      for (float& v : row) v -= 1.0f;
    quantize_row_ref(dtype, row.data(), bytes.data(), cols);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

void write_shard(const fs::path& path, const std::vector<const Entry*>& entries, DType dtype) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const Entry* e : entries) {
    const TensorData& t = e->src;
    if (!e->raw.empty()) {
      header[e->hf_name] = {{"dtype", "U8"}, {"shape", e->raw_shape}, {"data_offsets", {offset, offset + e->raw.size()}}};
      offset += e->raw.size();
      continue;
    }
    const uint64_t size = dtype_row_bytes(dtype, t.cols()) * static_cast<uint64_t>(t.rows());
    header[e->hf_name] = {{"dtype", hf_dtype_name(dtype)},
                          {"shape", std::vector<int64_t>(t.shape.rbegin(), t.shape.rend())},
                          {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  PAGELLM_CHECK(out.good(), "cannot create '{}'", path.string());
  const uint64_t len = text.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);  // little-endian
  out.write(len_bytes, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Entry* e : entries) write_tensor(out, *e, dtype);
  out.close();
  PAGELLM_CHECK(!out.fail(), "error writing '{}'", path.string());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  PAGELLM_CHECK(out.good(), "cannot create '{}'", path.string());
  out << text << "\n";
  out.close();
  PAGELLM_CHECK(!out.fail(), "error writing '{}'", path.string());
}

// Removes weights an earlier write left, so the folder holds one model.
void remove_old_weights(const fs::path& dir) {
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string n = f.path().filename().string();
    const bool shard = n.starts_with("model-") && n.ends_with(".safetensors") && n.find("-of-") != std::string::npos;
    if (n == "model.safetensors" || n == "model.safetensors.index.json" || shard) fs::remove(f.path());
  }
}

}  // namespace

nlohmann::ordered_json hf_config_json(const ModelConfig& c, bool tied, DType dtype) {
  PAGELLM_CHECK(c.rope.n_rot == c.max_head_dim() || arch_info(c.arch).partial_rotary,
                "cannot write config.json: partial RoPE ({} of {} dims)", c.rope.n_rot, c.max_head_dim());
  const ArchInfo& arch = arch_info(c.arch);
  PAGELLM_CHECK(c.qkv_bias == arch.qkv_bias, "cannot write config.json: q/k/v biases are fixed per family ({})",
                arch.gguf_name);
  PAGELLM_CHECK(arch.hf_classes[0].swa == HfSwa::Pattern || arch.swa_every_layer || !family::any_sliding_layer(c),
                "cannot write config.json: sliding-window layers are only written for families with layer_types");
  nlohmann::ordered_json j;
  // A MoE config may be another class (Llama with experts is Mixtral in transformers).
  const bool moe_class = c.moe() && arch.hf_moe_class;
  j["architectures"] = nlohmann::ordered_json::array({moe_class ? arch.hf_moe_class : arch.hf_classes[0].name});
  j["model_type"] = moe_class ? arch.hf_moe_model_type : arch.hf_model_type;
  j["vocab_size"] = c.n_vocab;
  j["hidden_size"] = c.n_embd;
  // Mixtral / gpt-oss: the experts' FFN (set below).
  j["intermediate_size"] = c.n_ff;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_head_kv;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.n_ctx_train;
  j["rms_norm_eps"] = decimal(c.norm_eps);
  j["rope_theta"] = decimal(c.rope.freq_base);
  PAGELLM_CHECK(c.rope.freq_scale == 1.0f || c.rope_llama3.factor == 0,
                "cannot write config.json: linear and llama3 RoPE scaling together");
  if (c.rope.ext_factor > 0) {
    // DeepSeek's mscale sets attn_factor; its family writes its own rope_scaling.
    PAGELLM_CHECK(c.rope.ext_factor == 1.0f && (c.rope.attn_factor == 1.0f || c.is_mla()),
                  "cannot write config.json: YaRN with ext_factor {} / attn_factor {}", c.rope.ext_factor,
                  c.rope.attn_factor);
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", decimal(1.0f / c.rope.freq_scale)},
                         {"original_max_position_embeddings", c.rope.n_ctx_orig},
                         {"beta_fast", decimal(c.rope.beta_fast)},
                         {"beta_slow", decimal(c.rope.beta_slow)},
                         {"truncate", c.rope.yarn_truncate}};
  } else if (c.longrope()) {
    // Phi-3 keeps the original context at the top level; the attention
    // factor is stated so that it reads back exactly.
    j["original_max_position_embeddings"] = c.rope.n_ctx_orig;
    std::vector<double> short_f, long_f;
    for (float f : c.rope_factors_short) short_f.push_back(decimal(f));
    for (float f : c.rope_factors_long) long_f.push_back(decimal(f));
    j["rope_scaling"] = {{"rope_type", "longrope"},
                         {"short_factor", short_f},
                         {"long_factor", long_f},
                         {"attention_factor", decimal(c.rope.attn_factor)}};
  } else if (c.rope.freq_scale != 1.0f) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", decimal(1.0f / c.rope.freq_scale)}};
  }
  if (const auto& l = c.rope_llama3; l.factor > 0)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", decimal(l.factor)},
                         {"low_freq_factor", decimal(l.low_freq_factor)},
                         {"high_freq_factor", decimal(l.high_freq_factor)},
                         {"original_max_position_embeddings", l.original_context}};
  j["tie_word_embeddings"] = tied;
  j["dtype"] = torch_dtype_name(dtype);
  if (dtype == DType::MXFP4)  // as gpt-oss's checkpoints state it
    j["quantization_config"] = {{"quant_method", "mxfp4"},
                                {"modules_to_not_convert",
                                 {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                  "lm_head"}}};
  j["bos_token_id"] = 1;  // the synthetic vocabulary's <s> and </s>
  j["eos_token_id"] = 2;
  if (c.moe() && arch.hf_moe_keys == HfMoeKeys::LocalExperts) {
    PAGELLM_CHECK(c.expert_norm_topk, "cannot write config.json: {} always renormalises its experts' weights",
                  arch.hf_moe_name);
    j["intermediate_size"] = c.n_ff_exp;
    j["num_local_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.n_expert_used;
  } else if (c.moe()) {
    j["num_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.n_expert_used;
    j["moe_intermediate_size"] = c.n_ff_exp;
    if (c.n_ff_shexp) j["shared_expert_intermediate_size"] = c.n_ff_shexp;
    j["norm_topk_prob"] = c.expert_norm_topk;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  if (arch.write_hf) arch.write_hf(c, j);  // the family's own fields
  return j;
}

void write_hf_folder(const std::string& dir, const ModelConfig& cfg, const TensorSource& src,
                     const HFWriteOptions& opts) {
  hf_dtype_name(opts.dtype);  // validates the type
  const bool mxfp4 = opts.dtype == DType::MXFP4;
  PAGELLM_CHECK(!mxfp4 || arch_info(cfg.arch).hf_mxfp4_experts,
                "cannot write a Hugging Face folder with MXFP4 experts for {}", arch_name(cfg.arch));
  const DType dtype = stored_type(opts.dtype);
  std::vector<std::vector<float>> owned;  // transformed copies the entries point into
  std::vector<Entry> entries = plan_tensors(cfg, src, owned, mxfp4);
  const bool tied =
      std::none_of(entries.begin(), entries.end(), [](const Entry& e) { return e.hf_name == "lm_head.weight"; });
  const auto config = hf_config_json(cfg, tied, opts.dtype);
  std::vector<size_t> bytes;
  for (const Entry& e : entries)
    bytes.push_back(!e.raw.empty() ? e.raw.size()
                                   : dtype_row_bytes(dtype, e.src.cols()) * static_cast<size_t>(e.src.rows()));
  assign_shards(entries, opts.shards, bytes);

  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  PAGELLM_CHECK(fs::is_directory(root), "cannot create folder '{}'", dir);
  remove_old_weights(root);
  write_text(root / "config.json", config.dump(2));
  nlohmann::ordered_json weight_map;
  size_t total = 0;
  for (int k = 0; k < opts.shards; ++k) {
    std::vector<const Entry*> mine;
    for (const Entry& e : entries)
      if (e.shard == k) {
        mine.push_back(&e);
        weight_map[e.hf_name] = shard_file_name(k, opts.shards);
      }
    write_shard(root / shard_file_name(k, opts.shards), mine, dtype);
  }
  for (size_t b : bytes) total += b;
  if (opts.shards > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_text(root / "model.safetensors.index.json", index.dump(2));
  }
}

void write_dummy_hf(const std::string& dir, const DummySpec& spec, int shards, ThreadPool& pool) {
  hf_dtype_name(spec.wtype);
  const ModelConfig cfg = dummy_config(spec.shape, dummy_vocab_size(spec.shape, nullptr));
  auto src = make_dummy_source(cfg, spec, pool);
  write_hf_folder(dir, cfg, *src, HFWriteOptions{spec.wtype, shards});
}

}  // namespace pagellm
