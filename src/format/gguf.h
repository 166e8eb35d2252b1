// GGUF v2/v3 reader over mmap. Every offset, count and size is checked against
// the file, so a truncated or hostile file ends in one Error naming the
// problem, never a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace pagellm {

enum class GGUFType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GGUFType t);

// One metadata value. Scalars are widened; strings and string arrays point
// into the mapped file; numeric arrays keep a pointer to their raw bytes.
struct GGUFValue {
  GGUFType type = GGUFType::U8;
  // Scalars (the field matching the type's kind is set).
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string_view str;
  // Arrays.
  GGUFType elem_type = GGUFType::U8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;               // numeric elements, little-endian
  std::vector<std::string_view> strings;      // string elements
  std::vector<GGUFValue> nested;              // array-of-array elements

  bool is_integer() const;
  bool is_float() const { return type == GGUFType::F32 || type == GGUFType::F64; }
  // Short human-readable rendering (arrays abbreviated).
  std::string to_string() const;
};

struct GGUFTensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // ne[0] first: shape[0] is the contiguous (row) length
  uint64_t offset = 0;         // relative to the data section
  size_t nbytes = 0;
  int64_t n_elements = 0;
  const uint8_t* data = nullptr;

  int64_t rows() const;  // product of shape[1..]
  int64_t cols() const { return shape.empty() ? 1 : shape[0]; }
  std::string shape_string() const;
};

class GGUFFile {
 public:
  // Opens and validates the whole header and tensor table. Tensor types we
  // know but cannot compute with still load here; the model loader rejects them.
  static std::unique_ptr<GGUFFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  size_t file_size() const { return file_.size(); }
  uint32_t alignment() const { return alignment_; }

  const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
  const GGUFValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters: a missing key or a wrong type is an Error naming the key.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string_view> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;

 private:
  explicit GGUFFile(const std::string& path) : file_(path) {}
  void parse();

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GGUFTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Writer for GGUF v3 (used by the dummy-model tool and tests).
class GGUFWriter {
 public:
  void set_string(const std::string& key, const std::string& value);
  void set_u32(const std::string& key, uint32_t value);
  void set_i32(const std::string& key, int32_t value);
  void set_f32(const std::string& key, float value);
  void set_bool(const std::string& key, bool value);
  void set_string_array(const std::string& key, const std::vector<std::string>& values);
  void set_f32_array(const std::string& key, const std::vector<float>& values);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& values);
  void set_bool_array(const std::string& key, const std::vector<bool>& values);
  // Copies a GGUF value from a reader (used to carry a vocabulary over).
  void set_value(const std::string& key, const GGUFValue& value);
  // shape is ne[0] first; data must hold dtype_row_bytes(type, shape[0]) * rows bytes.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                  std::vector<uint8_t> data);
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kv_;  // key, encoded (type + value)
  std::vector<Tensor> tensors_;
};

}  // namespace pagellm
