#include "model/tensor_source.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "core/fp16.h"
#include "core/mmap_file.h"
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

// HF parameter name -> GGUF tensor name ("" when not a weight we use).
std::string gguf_name(const std::string& hf, Arch arch) {
  static const std::regex layer_re(R"(^(?:model\.|language_model\.model\.|model\.language_model\.)layers\.(\d+)\.(.+)$)");
  static const std::map<std::string, std::string> per_layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
  };
  std::smatch m;
  if (std::regex_match(hf, m, layer_re)) {
    const std::string rest = m[2];
    std::string base;
    if (rest == "post_attention_layernorm.weight")
      base = arch == Arch::Gemma3 ? "post_attention_norm.weight" : "ffn_norm.weight";
    else if (auto it = per_layer.find(rest); it != per_layer.end())
      base = it->second;
    else
      return "";
    return "blk." + m[1].str() + "." + base;
  }
  if (hf == "model.embed_tokens.weight" || hf == "language_model.model.embed_tokens.weight" ||
      hf == "model.language_model.embed_tokens.weight")
    return "token_embd.weight";
  if (hf == "model.norm.weight" || hf == "language_model.model.norm.weight" || hf == "model.language_model.norm.weight")
    return "output_norm.weight";
  if (hf == "lm_head.weight" || hf == "language_model.lm_head.weight") return "output.weight";
  return "";
}

float element_as_float(const TensorData& t, int64_t i) {
  switch (t.type) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::F16: return fp16_to_fp32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::BF16: return bf16_to_fp32(static_cast<const uint16_t*>(t.data)[i]);
    default: fail("unexpected norm weight type {}", dtype_name(t.type));
  }
}

DType safetensors_dtype(const std::string& s, const std::string& path) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  fail("'{}': safetensors dtype {} is not supported (F32, F16, BF16 are)", path, s);
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
      std::ifstream in(index);
      PAGELLM_CHECK(in.good(), "cannot open '{}'", index.string());
      try {
        const nlohmann::json j = nlohmann::json::parse(in);
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
    PAGELLM_CHECK(header_len <= size - 8 && header_len < (uint64_t{1} << 30),
                  "'{}': safetensors header length {} exceeds the file ({} bytes)", path, header_len, size);
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(base + 8, base + 8 + header_len);
    } catch (const std::exception& e) {
      fail("'{}': safetensors header is not valid JSON: {}", path, e.what());
    }
    PAGELLM_CHECK(header.is_object(), "'{}': safetensors header is not a JSON object", path);
    const uint8_t* data = base + 8 + header_len;
    const size_t data_size = size - 8 - header_len;
    std::set<std::string> names;
    for (auto& [hf_name, info] : header.items()) {
      if (hf_name == "__metadata__") continue;
      names.insert(hf_name);
      const std::string name = gguf_name(hf_name, cfg.arch);
      if (name.empty()) continue;
      PAGELLM_CHECK(!tensors_.contains(name), "'{}': tensor {} appears twice in the model's files", path, hf_name);
      try {
        TensorData t;
        t.name = name;
        t.type = safetensors_dtype(info.at("dtype").get<std::string>(), path);
        const auto shape = info.at("shape").get<std::vector<int64_t>>();
        PAGELLM_CHECK(!shape.empty() && shape.size() <= 4, "'{}': tensor {} has {} dimensions", path, hf_name, shape.size());
        t.shape.assign(shape.rbegin(), shape.rend());  // row-major [out, in] -> ne [in, out]
        const auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
        PAGELLM_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
                      "'{}': tensor {} data offsets exceed the file (truncated?)", path, hf_name);
        uint64_t n = 1;
        for (int64_t d : shape) {
          PAGELLM_CHECK(d > 0 && static_cast<uint64_t>(d) <= data_size, "'{}': tensor {} has an invalid dimension {}",
                        path, hf_name, d);
          n *= static_cast<uint64_t>(d);
          PAGELLM_CHECK(n <= data_size, "'{}': tensor {} is larger than the file", path, hf_name);
        }
        PAGELLM_CHECK(offs[1] - offs[0] == dtype_row_bytes(t.type, static_cast<int64_t>(n)),
                      "'{}': tensor {} size does not match its shape", path, hf_name);
        t.data = data + offs[0];
        // Gemma's RMSNorm multiplies by (1 + w); GGUF conversion stores w + 1.
        if (cfg.arch == Arch::Gemma3 && name.size() > 11 && name.ends_with("norm.weight")) {
          auto& owned = owned_.emplace_back(static_cast<size_t>(n));
          for (uint64_t i = 0; i < n; ++i) owned[i] = element_as_float(t, static_cast<int64_t>(i)) + 1.0f;
          t.type = DType::F32;
          t.data = owned.data();
        }
        tensors_[name] = std::move(t);
      } catch (const nlohmann::json::exception& e) {
        fail("'{}': bad safetensors entry {}: {}", path, hf_name, e.what());
      }
    }
    files_.push_back(std::move(file));
    return names;
  }

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
