#include "model/tensor_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <cstring>
#include <unordered_map>

#include "core/quant_blocks.h"
#include "core/error.h"
#include "core/fp16.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/arch.h"

namespace pagellm {
namespace {

class GGUFSource : public TensorSource {
 public:
  explicit GGUFSource(const GGUFFile& f) {
    for (const auto& t : f.tensors()) tensors_[t.name] = TensorData{t.name, t.type, t.shape, t.data};
  }
  const TensorData* find(const std::string& name) const override {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  size_t count() const override { return tensors_.size(); }

 private:
  std::unordered_map<std::string, TensorData> tensors_;
};

float element_as_float(const TensorData& t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  switch (t.type) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::F16: case DType::BF16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return t.type == DType::F16 ? fp16_to_fp32(v) : bf16_to_fp32(v);
    }
    default: fail("unexpected norm weight type {}", dtype_name(t.type));
  }
}

class SafetensorsSource : public TensorSource {
 public:
  SafetensorsSource(const std::string& dir, const ModelConfig& cfg) {
    namespace fs = std::filesystem;
    const SafetensorsIndex index = read_safetensors_index(dir);
    for (const auto& f : index.files) {
      const std::string path = (fs::path(dir) / f).string();
      PAGELLM_CHECK(fs::exists(path), "'{}' lists weight file '{}', which does not exist", index.index_path, f);
      const auto names = read_file(path, cfg);
      auto listed = index.listed.find(f);
      if (listed == index.listed.end()) continue;
      for (const auto& want : listed->second)
        PAGELLM_CHECK(names.contains(want), "'{}' lists tensor '{}' in '{}', which does not contain it",
                      index.index_path, want, f);
    }
    unpack_mxfp4(arch_info(cfg.arch), dir);
    // RoPE divisors the config states or implies (Llama 3 scaling, LongRoPE),
    // as GGUF files store them.
    for (const TensorSpec& spec : arch_info(cfg.arch).globals) {
      const std::vector<float>* values = config_rope_factors(cfg, spec.slots[0]);
      if (!values || values->empty()) continue;
      const auto& f = owned_.emplace_back(*values);
      tensors_[spec.gguf] = TensorData{spec.gguf, DType::F32, {static_cast<int64_t>(f.size())}, f.data()};
    }
    // transformers ties lm_head to the embedding when the config says so; an
    // untied model without lm_head would get a random output matrix there.
    // A sequence classifier has a score head (score.weight, read by
    // engine/score_head.cpp) in place of lm_head: its embedding stands in,
    // as llama.cpp does for a GGUF without output.weight. (An encoder's
    // table has no output matrix at all.)
    const auto& globals = arch_info(cfg.arch).globals;
    const bool has_output = std::any_of(globals.begin(), globals.end(),
                                        [](const TensorSpec& t) { return t.slots[0] == Slot::Output; });
    if (cfg.tie_word_embeddings) tensors_.erase("output.weight");
    else PAGELLM_CHECK(!has_output || tensors_.contains("output.weight") || !tensors_.contains("token_embd.weight") ||
                           has_score_head_,
                       "'{}': config.json says tie_word_embeddings is false, but there is no lm_head.weight", dir);
  }
  const TensorData* find(const std::string& name) const override {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  size_t count() const override { return tensors_.size(); }

 private:
  // Maps one safetensors file; returns the HF names it holds.
  std::set<std::string> read_file(const std::string& path, const ModelConfig& cfg) {
    auto file = std::make_unique<SafetensorsFile>(path);
    const nlohmann::json& header = file->header();
    const uint8_t* data = file->data();
    const size_t data_size = file->data_size();
    const uint64_t header_len = file->header_bytes();
    const ArchInfo& arch = arch_info(cfg.arch);
    std::set<std::string> names;
    for (auto& [hf_name, info] : header.items()) {
      if (hf_name == "__metadata__") continue;
      names.insert(hf_name);
      if (hf_name == "score.weight") has_score_head_ = true;
      try {
        // Every entry is checked, used or not: a corrupt header is refused whole.
        const SafetensorsEntry e = parse_safetensors_entry(info, hf_name, data_size, path);
        if (stash_mxfp4(arch, hf_name, e, data, path)) continue;
        const std::vector<HfTensor> known = hf_tensors(arch, hf_name);
        const DType type = known.empty() ? DType::F32 : safetensors_dtype(e.dtype, path);
        check_safetensors_entry_size(e, hf_name, path);
        if (known.empty()) continue;
        TensorData t;
        t.type = type;
        PAGELLM_CHECK(!e.shape.empty() && e.shape.size() <= 4, "'{}': tensor {} has {} dimensions", path, hf_name,
                      e.shape.size());
        for (int64_t d : e.shape)
          PAGELLM_CHECK(d > 0, "'{}': tensor {} has an invalid dimension {}", path, hf_name, d);
        t.shape.assign(e.shape.rbegin(), e.shape.rend());  // row-major [out, in] -> ne [in, out]
        t.data = data + e.begin;
        // Kernels read elements in place; the safetensors writer pads the
        // header to 8 bytes, so real files are aligned.
        const size_t elem_bytes = dtype_row_bytes(t.type, 1);
        PAGELLM_CHECK(reinterpret_cast<uintptr_t>(t.data) % elem_bytes == 0,
                      "'{}': tensor {} data (file offset {}) is not aligned to its {}-byte elements", path, hf_name,
                      8 + header_len + e.begin, elem_bytes);
        for (const HfTensor& k : known) {
          PAGELLM_CHECK(!tensors_.contains(k.gguf), "'{}': tensor {} appears twice in the model's files", path,
                        hf_name);
          TensorData part = k.one_expert ? t : transformed(t, *k.spec, hf_name, path, cfg);
          part.name = k.gguf;
          tensors_[k.gguf] = std::move(part);
        }
      } catch (const nlohmann::json::exception& e) {
        fail("'{}': bad safetensors entry {}: {}", path, hf_name, e.what());
      }
    }
    files_.push_back(std::move(file));
    return names;
  }

  // The tensor as the forward pass reads it (GGUF layout): most are used in
  // place; Gemma norms get 1 added and gpt-oss's stacked experts are
  // transposed (and their fused gate_up split) into F32 copies.
  TensorData transformed(const TensorData& t, const TensorSpec& spec, const std::string& hf_name,
                         const std::string& path, const ModelConfig& cfg) {
    const Transform tr = spec.transform;
    if (tr == Transform::None || tr == Transform::RopePermute) return t;
    if (tr == Transform::PositionOffset) {  // a view past the rows before position 0 (RoBERTa's padding row)
      const int64_t skip = cfg.hf_pos_offset;
      PAGELLM_CHECK(t.shape.size() == 2 && skip >= 0 && t.rows() > skip, "'{}': tensor {} has {} rows, not more "
                    "than the {} before position 0 (padding_idx + 1)", path, hf_name, t.rows(), skip);
      TensorData v = t;
      v.shape[1] -= skip;
      v.data = static_cast<const uint8_t*>(t.data) + static_cast<size_t>(skip) * dtype_row_bytes(t.type, t.cols());
      return v;
    }
    if (tr == Transform::FirstRowOnly) {  // row 0 alone: a view
      PAGELLM_CHECK(t.shape.size() == 2, "'{}': tensor {} is not a table of rows", path, hf_name);
      TensorData v = t;
      v.shape[1] = 1;
      return v;
    }
    const int64_t n = static_cast<int64_t>(t.rows()) * t.cols();
    if (tr == Transform::ConvTaps) {  // [conv_dim, 1, K] -> GGUF's [K, conv_dim], F32
      PAGELLM_CHECK(t.shape.size() == 3 && t.shape[1] == 1, "'{}': tensor {} is not a depthwise conv weight "
                    "[channels, 1, kernel]", path, hf_name);
      auto& owned = owned_.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) owned[i] = element_as_float(t, i);
      return TensorData{"", DType::F32, {t.shape[0], t.shape[2]}, owned.data()};
    }
    if (tr == Transform::NegExp) {  // A_log -> -exp(A_log), as llama.cpp's converter stores it
      auto& owned = owned_.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) owned[i] = -std::exp(element_as_float(t, i));
      return TensorData{"", DType::F32, t.shape, owned.data()};
    }
    if (tr == Transform::NormPlusOne) {  // GGUF conversion stores w + 1
      auto& owned = owned_.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) owned[i] = element_as_float(t, i) + 1.0f;
      return TensorData{"", DType::F32, t.shape, owned.data()};
    }
    if (tr == Transform::KvBKeys || tr == Transform::KvBValues) {
      // kv_b_proj [n_head * (nope + v), kv_lora] -> attn_k_b [nope, kv_lora, n_head] (each head's
      // key rows transposed) or attn_v_b [kv_lora, v, n_head] (its value rows), F32.
      const ModelConfig::Mla& m = cfg.mla;
      const int64_t H = cfg.n_head, D = m.kv_lora_rank, nope = m.qk_nope_head_dim, v = m.v_head_dim;
      PAGELLM_CHECK(t.shape.size() == 2 && t.cols() == D && t.rows() == H * (nope + v), "'{}': tensor {} is not "
                    "[{} heads x ({} + {}), {}]", path, hf_name, H, nope, v, D);
      auto& owned = owned_.emplace_back(static_cast<size_t>(H * (tr == Transform::KvBKeys ? nope : v) * D));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          if (tr == Transform::KvBKeys)
            for (int64_t j = 0; j < nope; ++j)
              owned[(h * D + d) * nope + j] = element_as_float(t, (h * (nope + v) + j) * D + d);
          else
            for (int64_t i = 0; i < v; ++i)
              owned[(h * v + i) * D + d] = element_as_float(t, (h * (nope + v) + nope + i) * D + d);
        }
      return TensorData{"", DType::F32, tr == Transform::KvBKeys ? Dims{nope, D, H} : Dims{D, v, H}, owned.data()};
    }
    if (tr == Transform::QkvzQkv || tr == Transform::QkvzZ) {
      // in_proj_qkvz's rows per key head [q (dk) | k (dk) | v | z (its value
      // heads' dv each)] -> GGUF's [all q | all k | all v] or [all z], in their type.
      const ModelConfig::LinearAttn& la = cfg.linear;
      const int64_t nk = la.n_k_heads, dk = la.head_k_dim, vz = nk > 0 ? la.value_dim() / nk : 0;
      const int64_t per_head = 2 * dk + 2 * vz;
      PAGELLM_CHECK(t.shape.size() == 2 && nk > 0 && t.rows() == nk * per_head, "'{}': tensor {} has {} rows, not {} "
                    "key heads of [q, k, v, z] ({} rows each)", path, hf_name, t.rows(), nk, per_head);
      const std::vector<std::pair<int64_t, int64_t>> parts =  // (offset in a head's rows, count)
          tr == Transform::QkvzQkv ? std::vector<std::pair<int64_t, int64_t>>{{0, dk}, {dk, dk}, {2 * dk, vz}}
                                   : std::vector<std::pair<int64_t, int64_t>>{{2 * dk + vz, vz}};
      const size_t row_bytes = dtype_row_bytes(t.type, t.cols());
      int64_t rows = 0;
      for (const auto& p : parts) rows += p.second * nk;
      auto& owned = owned_bytes_.emplace_back(static_cast<size_t>(rows) * row_bytes);
      const auto* from = static_cast<const uint8_t*>(t.data);
      size_t at = 0;
      for (const auto& [offset, count] : parts)
        for (int64_t h = 0; h < nk; ++h) {
          const size_t bytes = static_cast<size_t>(count) * row_bytes;
          std::memcpy(owned.data() + at, from + static_cast<size_t>(h * per_head + offset) * row_bytes, bytes);
          at += bytes;
        }
      return TensorData{"", t.type, {t.cols(), rows}, owned.data()};
    }
    if (tr == Transform::GateUpFirstHalf || tr == Transform::GateUpSecondHalf) {
      TensorData half = fused_experts_half(t, tr == Transform::GateUpSecondHalf, owned_bytes_.emplace_back(),
                                           fmt::format("'{}': tensor {}", path, hf_name));
      half.name.clear();
      return half;
    }
    // Stacked experts: weights ne [out (x2 when fused), in, n_expert], biases
    // ne [out (x2), n_expert]; the result is GGUF's [in, out, n_expert] / [out, n_expert].
    const bool fused = tr == Transform::GateUpEven || tr == Transform::GateUpOdd;
    const bool bias = t.shape.size() == 2;
    PAGELLM_CHECK((bias && spec.experts && !spec.matrix) || (t.shape.size() == 3 && spec.matrix),
                  "'{}': tensor {} has {} dimensions, which its stacked-experts layout does not allow", path, hf_name,
                  t.shape.size());
    PAGELLM_CHECK(!fused || t.shape[0] % 2 == 0, "'{}': tensor {} fuses gate and up, but has an odd {} columns", path,
                  hf_name, t.shape[0]);
    const int64_t out = fused ? t.shape[0] / 2 : t.shape[0], stride = fused ? 2 : 1, first = tr == Transform::GateUpOdd;
    const int64_t in = bias ? 1 : t.shape[1], experts = t.shape.back();
    auto& owned = owned_.emplace_back(static_cast<size_t>(out * in * experts));
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < out; ++o)
          owned[(e * out + o) * in + i] = element_as_float(t, (e * in + i) * t.shape[0] + o * stride + first);
    Dims shape = bias ? Dims{out, experts} : Dims{in, out, experts};
    return TensorData{"", DType::F32, std::move(shape), owned.data()};
  }

  // gpt-oss checkpoints ship their experts as MXFP4: "<name>_blocks" (U8
  // [n_expert, rows, cols / 32, 16], element 2i in the low nibble of byte i,
  // 2i + 1 in the high one) and "<name>_scales" (U8 e8m0 [n_expert, rows,
  // cols / 32]), rows as nn.Linear has them (out x in; gate_up interleaves
  // gate and up rows). Both halves are kept until all files are read, then
  // repacked into GGUF's MXFP4 blocks (scale byte, then element i and
  // i + 16 in one byte) under the table's stacked names.
  struct PackedHalves {
    const uint8_t* data[2] = {nullptr, nullptr};  // blocks, scales
    std::vector<int64_t> shape[2];
  };
  bool stash_mxfp4(const ArchInfo& arch, const std::string& hf_name, const SafetensorsEntry& e, const uint8_t* data,
                   const std::string& path) {
    const bool blocks = hf_name.ends_with("_blocks"), scales = hf_name.ends_with("_scales");
    if (!blocks && !scales) return false;
    const std::string stem = hf_name.substr(0, hf_name.size() - 7);
    const std::vector<HfTensor> known = hf_tensors(arch, stem);
    if (known.empty() || !known[0].spec->experts || !known[0].spec->matrix) return false;
    PAGELLM_CHECK(e.dtype == "U8", "'{}': tensor {} has dtype {}, MXFP4 {} are U8", path, hf_name, e.dtype,
                  blocks ? "blocks" : "scales");
    check_safetensors_entry_size(e, hf_name, path);
    PackedHalves& p = packed_[stem];
    PAGELLM_CHECK(!p.data[scales], "'{}': tensor {} appears twice in the model's files", path, hf_name);
    p.data[scales] = data + e.begin;
    p.shape[scales] = e.shape;
    return true;
  }

  void unpack_mxfp4(const ArchInfo& arch, const std::string& dir) {
    for (const auto& [stem, p] : packed_) {
      PAGELLM_CHECK(p.data[0] && p.data[1], "'{}': {}_{} has no {}_{} to go with it", dir, stem,
                    p.data[0] ? "blocks" : "scales", stem, p.data[0] ? "scales" : "blocks");
      const auto& bs = p.shape[0];
      const auto& ss = p.shape[1];
      PAGELLM_CHECK(bs.size() == 4 && bs[3] == 16 && ss == std::vector<int64_t>(bs.begin(), bs.end() - 1),
                    "'{}': {}_blocks {} and {}_scales {} are not MXFP4 [n_expert, rows, cols / 32, 16] and "
                    "[n_expert, rows, cols / 32]", dir, stem, nlohmann::json(bs).dump(), stem, nlohmann::json(ss).dump());
      const int64_t experts = bs[0], rows = bs[1], groups = bs[2];
      for (const HfTensor& k : hf_tensors(arch, stem)) {
        const Transform tr = k.spec->transform;
        const bool fused = tr == Transform::GateUpEven || tr == Transform::GateUpOdd;
        PAGELLM_CHECK(!fused || rows % 2 == 0, "'{}': {}_blocks fuses gate and up, but has an odd {} rows", dir,
                      stem, rows);
        const int64_t out = fused ? rows / 2 : rows, stride = fused ? 2 : 1, first = tr == Transform::GateUpOdd;
        auto& owned = owned_bytes_.emplace_back(static_cast<size_t>(experts * out * groups) * sizeof(BlockMXFP4));
        auto* dst = reinterpret_cast<BlockMXFP4*>(owned.data());
        for (int64_t e = 0; e < experts; ++e)
          for (int64_t o = 0; o < out; ++o)
            for (int64_t g = 0; g < groups; ++g) {
              const int64_t src_row = (e * rows + o * stride + first) * groups + g;
              const uint8_t* q = p.data[0] + src_row * 16;
              BlockMXFP4& b = dst[(e * out + o) * groups + g];
              b.e = p.data[1][src_row];
              auto nibble = [&](int i) { return (q[i / 2] >> (4 * (i % 2))) & 0x0F; };
              for (int i = 0; i < 16; ++i) b.qs[i] = static_cast<uint8_t>(nibble(i) | (nibble(i + 16) << 4));
            }
        PAGELLM_CHECK(!tensors_.contains(k.gguf), "'{}': {} is given both packed and unpacked", dir, stem);
        tensors_[k.gguf] = TensorData{k.gguf, DType::MXFP4, {groups * QK_MXFP4, out, experts}, owned.data()};
      }
    }
  }

  std::map<std::string, PackedHalves> packed_;
  std::vector<std::vector<uint8_t>> owned_bytes_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::vector<float>> owned_;
  std::unordered_map<std::string, TensorData> tensors_;
  bool has_score_head_ = false;  // score.weight: a sequence classifier (no lm_head needed)
};

}  // namespace

TensorData fused_experts_half(const TensorData& fused, bool second, std::vector<uint8_t>& owned,
                              const std::string& what) {
  PAGELLM_CHECK(fused.shape.size() == 3 && fused.shape[1] % 2 == 0,
                "{} is not experts' gate and up rows [{}, 2 x ff, n_expert]", what, fused.cols());
  const int64_t ff = fused.shape[1] / 2, experts = fused.shape[2];
  const size_t half = static_cast<size_t>(ff) * dtype_row_bytes(fused.type, fused.cols());
  owned.resize(half * static_cast<size_t>(experts));
  const auto* from = static_cast<const uint8_t*>(fused.data) + (second ? half : 0);
  for (int64_t e = 0; e < experts; ++e) std::memcpy(owned.data() + e * half, from + 2 * e * half, half);
  return TensorData{fused.name, fused.type, {fused.cols(), ff, experts}, owned.data()};
}

std::unique_ptr<TensorSource> gguf_tensor_source(const GGUFFile& file) { return std::make_unique<GGUFSource>(file); }

std::unique_ptr<TensorSource> hf_tensor_source(const std::string& dir, const ModelConfig& cfg) {
  return std::make_unique<SafetensorsSource>(dir, cfg);
}

}  // namespace pagellm
