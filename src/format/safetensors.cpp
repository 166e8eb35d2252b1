#include "format/safetensors.h"

#include <cstring>
#include <filesystem>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/json_limits.h"

namespace pagellm {

DType safetensors_dtype(const std::string& s, const std::string& path) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  fail("'{}': safetensors dtype {} is not supported (F32, F16, BF16 are)", path, s);
}

uint64_t safetensors_dtype_bytes(const std::string& s) {
  if (s == "BOOL" || s == "U8" || s == "I8" || s == "F8_E5M2" || s == "F8_E4M3" || s == "F8_E8M0") return 1;
  if (s == "F16" || s == "BF16" || s == "I16" || s == "U16") return 2;
  if (s == "F32" || s == "I32" || s == "U32") return 4;
  if (s == "F64" || s == "I64" || s == "U64" || s == "C64") return 8;
  return 0;
}

SafetensorsEntry parse_safetensors_entry(const nlohmann::json& info, const std::string& name, uint64_t data_size,
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

void check_safetensors_entry_size(const SafetensorsEntry& e, const std::string& name, const std::string& path) {
  const uint64_t es = safetensors_dtype_bytes(e.dtype);
  if (es == 0) return;
  const auto bytes = checked_mul(e.elements, es);
  PAGELLM_CHECK(bytes && *bytes == e.end - e.begin,
                "'{}': tensor {} size does not match its shape ({} bytes for {} elements of {})", path, name,
                e.end - e.begin, e.elements, e.dtype);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(std::make_unique<MappedFile>(path)) {
  const uint8_t* base = file_->data();
  const size_t size = file_->size();
  PAGELLM_CHECK(size >= 8, "'{}' is truncated (no safetensors header)", path);
  std::memcpy(&header_len_, base, 8);
  PAGELLM_CHECK(header_len_ <= size - 8, "'{}': safetensors header length {} exceeds the file ({} bytes)", path,
                header_len_, size);
  PAGELLM_CHECK(header_len_ <= kMaxSafetensorsHeaderBytes,
                "'{}': safetensors header length {} exceeds the limit of {} bytes", path, header_len_,
                kMaxSafetensorsHeaderBytes);
  const std::string_view header_text(reinterpret_cast<const char*>(base + 8), header_len_);
  header_ = parse_json_bounded(header_text, kConfigJsonLimits, "'" + path + "': safetensors header");
  PAGELLM_CHECK(header_.is_object(), "'{}': safetensors header is not a JSON object", path);
  data_ = base + 8 + header_len_;
  data_size_ = size - 8 - header_len_;
}

SafetensorsIndex read_safetensors_index(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  SafetensorsIndex out;
  out.index_path = index.string();
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
        PAGELLM_CHECK(plain, "'{}': weight file name '{}' is not a plain file name", index.string(), f);
        if (!out.listed.contains(f)) out.files.push_back(f);
        out.listed[f].push_back(name);
      }
    } catch (const nlohmann::json::exception& e) {
      fail("'{}' is not a valid safetensors index: {}", index.string(), e.what());
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    out.files.push_back("model.safetensors");
  } else {
    fail("'{}' has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  return out;
}

}  // namespace pagellm
