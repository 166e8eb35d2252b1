#include "model/tensor_source.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <cstring>
#include <unordered_map>

#include "core/checked_math.h"
#include "core/quant_blocks.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/json_limits.h"
#include "core/mmap_file.h"
#include "model/arch.h"
#include "model/gguf.h"

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

DType safetensors_dtype(const std::string& s, const std::string& path) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  fail("'{}': safetensors dtype {} is not supported (F32, F16, BF16 are)", path, s);
}

// Bytes per element of the whole-byte safetensors dtypes; 0 for others
// (sub-byte and future types, whose sizes are not checked).
uint64_t safetensors_dtype_bytes(const std::string& s) {
  if (s == "BOOL" || s == "U8" || s == "I8" || s == "F8_E5M2" || s == "F8_E4M3" || s == "F8_E8M0") return 1;
  if (s == "F16" || s == "BF16" || s == "I16" || s == "U16") return 2;
  if (s == "F32" || s == "I32" || s == "U32") return 4;
  if (s == "F64" || s == "I64" || s == "U64" || s == "C64") return 8;
  return 0;
}

// Largest header accepted, as the Rust safetensors crate does.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// One header entry, validated as the safetensors crate does: integer shape
// and offsets (read without converting floats), offsets inside the data
// section, product(shape) computed without overflow.
struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;  // row-major, as stored
  uint64_t begin = 0, end = 0;
  uint64_t elements = 1;
};

SafetensorsEntry parse_entry(const nlohmann::json& info, const std::string& name, uint64_t data_size,
                             const std::string& path) {
  PAGELLM_CHECK(info.is_object(), "'{}': safetensors entry {} is not an object", path, name);
  SafetensorsEntry e;
  e.dtype = info.at("dtype").get<std::string>();
  const auto& shape = info.at("shape");
  PAGELLM_CHECK(shape.is_array() && shape.size() <= 8, "'{}': tensor {} shape must be an array of up to 8 dimensions",
                path, name);
  for (const auto& d : shape) {
    PAGELLM_CHECK(d.is_number_integer() && (d.is_number_unsigned() || d.get<int64_t>() >= 0),
                  "'{}': tensor {} has an invalid dimension {}", path, name, d.dump());
    const uint64_t n = d.get<uint64_t>();
    const auto product = checked_mul(e.elements, n);
    PAGELLM_CHECK(product && *product <= data_size, "'{}': tensor {} shape {} is larger than the file", path, name,
                  shape.dump());
    e.elements = *product;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const auto& offs = info.at("data_offsets");
  PAGELLM_CHECK(offs.is_array() && offs.size() == 2 && offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
                "'{}': tensor {} data_offsets must be two non-negative integers", path, name);
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  PAGELLM_CHECK(e.begin <= e.end && e.end <= data_size,
                "'{}': tensor {} data offsets exceed the file (truncated?): [{}, {}] in a data section of {} bytes",
                path, name, e.begin, e.end, data_size);
  return e;
}

// For dtypes of known size: end - begin == product(shape) * dtype size.
void check_entry_size(const SafetensorsEntry& e, const std::string& name, const std::string& path) {
  const uint64_t es = safetensors_dtype_bytes(e.dtype);
  if (es == 0) return;
  const auto bytes = checked_mul(e.elements, es);
  PAGELLM_CHECK(bytes && *bytes == e.end - e.begin,
                "'{}': tensor {} size does not match its shape ({} bytes for {} elements of {})", path, name,
                e.end - e.begin, e.elements, e.dtype);
}

class SafetensorsSource : public TensorSource {
 public:
  SafetensorsSource(const std::string& dir, const ModelConfig& cfg) {
    namespace fs = std::filesystem;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    // file -> tensors the index places there (checked after reading)
    std::map<std::string, std::vector<std::string>> listed;
    std::vector<std::string> files;
    if (fs::exists(index)) {
      nlohmann::json j;
      try {
        j = read_json_file_bounded(index.string(), kConfigJsonLimits);
      } catch (const Error& e) {
        fail("'{}' is not a valid safetensors index: {}", index.string(), e.what());
      }
      try {
        const auto& map = j.at("weight_map");
        PAGELLM_CHECK(map.is_object() && !map.empty(), "'{}': weight_map is empty or not an object", index.string());
        for (const auto& [name, file] : map.items()) {
          const std::string f = file.get<std::string>();
          // Shards sit beside the index; a path elsewhere is a broken (or hostile) index.
          const bool plain = !f.empty() && f != "." && f != ".." && f.find_first_of("/\\") == std::string::npos;
          PAGELLM_CHECK(plain,
                        "'{}': weight file name '{}' is not a plain file name", index.string(), f);
          if (!listed.contains(f)) files.push_back(f);
          listed[f].push_back(name);
        }
      } catch (const nlohmann::json::exception& e) {
        fail("'{}' is not a valid safetensors index: {}", index.string(), e.what());
      }
    } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
      files.push_back("model.safetensors");
    } else {
      fail("'{}' has neither model.safetensors nor model.safetensors.index.json", dir);
    }
    for (const auto& f : files) {
      const std::string path = (fs::path(dir) / f).string();
      PAGELLM_CHECK(fs::exists(path), "'{}' lists weight file '{}', which does not exist", index.string(), f);
      const auto names = read_file(path, cfg);
      for (const auto& want : listed[f])
        PAGELLM_CHECK(names.contains(want), "'{}' lists tensor '{}' in '{}', which does not contain it",
                      index.string(), want, f);
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
    if (cfg.tie_word_embeddings) tensors_.erase("output.weight");
    else PAGELLM_CHECK(tensors_.contains("output.weight") || !tensors_.contains("token_embd.weight"),
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
    auto file = std::make_unique<MappedFile>(path);
    const uint8_t* base = file->data();
    const size_t size = file->size();
    PAGELLM_CHECK(size >= 8, "'{}' is truncated (no safetensors header)", path);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);
    PAGELLM_CHECK(header_len <= size - 8, "'{}': safetensors header length {} exceeds the file ({} bytes)", path,
                  header_len, size);
    PAGELLM_CHECK(header_len <= kMaxHeaderBytes, "'{}': safetensors header length {} exceeds the limit of {} bytes",
                  path, header_len, kMaxHeaderBytes);
    const std::string_view header_text(reinterpret_cast<const char*>(base + 8), header_len);
    const nlohmann::json header =
        parse_json_bounded(header_text, kConfigJsonLimits, "'" + path + "': safetensors header");
    PAGELLM_CHECK(header.is_object(), "'{}': safetensors header is not a JSON object", path);
    const uint8_t* data = base + 8 + header_len;
    const size_t data_size = size - 8 - header_len;
    const ArchInfo& arch = arch_info(cfg.arch);
    std::set<std::string> names;
    for (auto& [hf_name, info] : header.items()) {
      if (hf_name == "__metadata__") continue;
      names.insert(hf_name);
      try {
        // Every entry is checked, used or not: a corrupt header is refused whole.
        const SafetensorsEntry e = parse_entry(info, hf_name, data_size, path);
        if (stash_mxfp4(arch, hf_name, e, data, path)) continue;
        const std::vector<HfTensor> known = hf_tensors(arch, hf_name);
        const DType type = known.empty() ? DType::F32 : safetensors_dtype(e.dtype, path);
        check_entry_size(e, hf_name, path);
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
          TensorData part = transformed(t, *k.spec, hf_name, path);
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
                         const std::string& path) {
    const Transform tr = spec.transform;
    if (tr == Transform::None || tr == Transform::RopePermute) return t;
    const int64_t n = static_cast<int64_t>(t.rows()) * t.cols();
    if (tr == Transform::NormPlusOne) {  // GGUF conversion stores w + 1
      auto& owned = owned_.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) owned[i] = element_as_float(t, i) + 1.0f;
      return TensorData{"", DType::F32, t.shape, owned.data()};
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
    check_entry_size(e, hf_name, path);
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
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::vector<float>> owned_;
  std::unordered_map<std::string, TensorData> tensors_;
};

}  // namespace

std::unique_ptr<TensorSource> gguf_tensor_source(const GGUFFile& file) { return std::make_unique<GGUFSource>(file); }

std::unique_ptr<TensorSource> hf_tensor_source(const std::string& dir, const ModelConfig& cfg) {
  return std::make_unique<SafetensorsSource>(dir, cfg);
}

}  // namespace pagellm
