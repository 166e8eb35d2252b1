// safetensors reader: the header of one file and the index of a sharded
// folder, validated as the Rust safetensors crate does (integer shapes and
// offsets, offsets inside the data section, no overflow). What the tensors
// mean is the model layer's business (model/tensor_source.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace pagellm {

// Largest header accepted, as the Rust safetensors crate does.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// One header entry: integer shape and offsets (read without converting
// floats), offsets inside the data section, product(shape) without overflow.
struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;  // row-major, as stored
  uint64_t begin = 0, end = 0;
  uint64_t elements = 1;
};

// The entry `name` of a header (throws Error; nlohmann exceptions pass
// through for the caller to name the entry).
SafetensorsEntry parse_safetensors_entry(const nlohmann::json& info, const std::string& name, uint64_t data_size,
                                         const std::string& path);
// For dtypes of known size: end - begin == product(shape) * dtype size.
void check_safetensors_entry_size(const SafetensorsEntry& e, const std::string& name, const std::string& path);
// Bytes per element of the whole-byte dtypes; 0 for others (sub-byte and
// future types, whose sizes are not checked).
uint64_t safetensors_dtype_bytes(const std::string& dtype);
// The DType a float tensor loads as (F32, F16, BF16); throws for others.
DType safetensors_dtype(const std::string& dtype, const std::string& path);

// One mapped file: its parsed header and its data section.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const nlohmann::json& header() const { return header_; }  // an object; "__metadata__" included
  const uint8_t* data() const { return data_; }
  size_t data_size() const { return data_size_; }
  uint64_t header_bytes() const { return header_len_; }  // the data starts at file offset 8 + this

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  nlohmann::json header_;
  const uint8_t* data_ = nullptr;
  size_t data_size_ = 0;
  uint64_t header_len_ = 0;
};

// The weight files of a Hugging Face folder: model.safetensors, or the files
// model.safetensors.index.json lists (in first-listed order) with the tensor
// names it places in each.
struct SafetensorsIndex {
  std::string index_path;  // <dir>/model.safetensors.index.json, present or not
  std::vector<std::string> files;
  std::map<std::string, std::vector<std::string>> listed;
};
SafetensorsIndex read_safetensors_index(const std::string& dir);

}  // namespace pagellm
