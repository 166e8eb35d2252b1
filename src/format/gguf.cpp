#include "format/gguf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/checked_math.h"
#include "core/error.h"

namespace pagellm {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;

size_t scalar_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::BOOL: return 1;
    case GGUFType::U16: case GGUFType::I16: return 2;
    case GGUFType::U32: case GGUFType::I32: case GGUFType::F32: return 4;
    case GGUFType::U64: case GGUFType::I64: case GGUFType::F64: return 8;
    default: return 0;
  }
}

// Sequential reader with bounds checks; errors name the file and offset.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  void need(size_t n, const char* what) const {
    if (n > remaining())
      fail("'{}' is truncated or corrupt: {} needs {} bytes at offset {}, file has {}", path_, what, n, pos_,
           size_);
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }
  const uint8_t* skip(size_t n, const char* what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  [[noreturn]] void corrupt(const std::string& why) const {
    fail("'{}' is not a valid GGUF file: {} (at offset {})", path_, why, pos_);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

GGUFType read_type(Cursor& c, const char* what) {
  const uint32_t t = c.read<uint32_t>(what);
  if (t > static_cast<uint32_t>(GGUFType::F64)) c.corrupt(fmt::format("unknown metadata value type {}", t));
  return static_cast<GGUFType>(t);
}

void read_scalar(Cursor& c, GGUFType t, GGUFValue& v) {
  switch (t) {
    case GGUFType::U8: v.u = c.read<uint8_t>("u8"); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I8: v.i = c.read<int8_t>("i8"); break;
    case GGUFType::U16: v.u = c.read<uint16_t>("u16"); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I16: v.i = c.read<int16_t>("i16"); break;
    case GGUFType::U32: v.u = c.read<uint32_t>("u32"); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I32: v.i = c.read<int32_t>("i32"); break;
    case GGUFType::U64: v.u = c.read<uint64_t>("u64"); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I64: v.i = c.read<int64_t>("i64"); break;
    case GGUFType::F32: v.f = c.read<float>("f32"); break;
    case GGUFType::F64: v.f = c.read<double>("f64"); break;
    case GGUFType::BOOL: {
      const uint8_t b = c.read<uint8_t>("bool");
      if (b > 1) c.corrupt(fmt::format("bool value {}", b));
      v.i = b;
      v.u = b;  // what the writer encodes (GGUFWriter::set_value)
      break;
    }
    case GGUFType::STRING: v.str = c.read_string("string"); break;
    default: c.corrupt("bad scalar type");
  }
  if (t == GGUFType::I8 || t == GGUFType::I16 || t == GGUFType::I32 || t == GGUFType::I64)
    v.u = static_cast<uint64_t>(v.i);
}

void read_value(Cursor& c, GGUFType t, GGUFValue& v, int depth) {
  v.type = t;
  if (t != GGUFType::ARRAY) {
    read_scalar(c, t, v);
    return;
  }
  if (depth > 4) c.corrupt("arrays nested too deeply");
  v.elem_type = read_type(c, "array element type");
  v.count = c.read<uint64_t>("array length");
  if (v.elem_type == GGUFType::STRING) {
    // Each string takes at least its 8-byte length: bound the count first.
    if (v.count > c.remaining() / 8) c.corrupt(fmt::format("string array of {} elements exceeds the file", v.count));
    v.strings.reserve(v.count);
    for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(c.read_string("array string"));
  } else if (v.elem_type == GGUFType::ARRAY) {
    if (v.count > c.remaining() / 12) c.corrupt(fmt::format("nested array of {} elements exceeds the file", v.count));
    v.nested.resize(v.count);
    for (uint64_t k = 0; k < v.count; ++k) read_value(c, GGUFType::ARRAY, v.nested[k], depth + 1);
  } else {
    const size_t es = scalar_size(v.elem_type);
    if (v.count > c.remaining() / es) c.corrupt(fmt::format("array of {} elements exceeds the file", v.count));
    v.raw = c.skip(v.count * es, "array data");
  }
}

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double array_elem_as_double(const GGUFValue& v, uint64_t k) {
  const uint8_t* p = v.raw + k * scalar_size(v.elem_type);
  switch (v.elem_type) {
    case GGUFType::U8: return *p;
    case GGUFType::I8: return static_cast<int8_t>(*p);
    case GGUFType::BOOL: return *p;
    case GGUFType::U16: return load_le<uint16_t>(p);
    case GGUFType::I16: return load_le<int16_t>(p);
    case GGUFType::U32: return load_le<uint32_t>(p);
    case GGUFType::I32: return load_le<int32_t>(p);
    case GGUFType::U64: return static_cast<double>(load_le<uint64_t>(p));
    case GGUFType::I64: return static_cast<double>(load_le<int64_t>(p));
    case GGUFType::F32: return load_le<float>(p);
    case GGUFType::F64: return load_le<double>(p);
    default: return 0;
  }
}

int64_t array_elem_as_int(const GGUFValue& v, uint64_t k) {
  const uint8_t* p = v.raw + k * scalar_size(v.elem_type);
  switch (v.elem_type) {
    case GGUFType::U64: return static_cast<int64_t>(load_le<uint64_t>(p));
    case GGUFType::I64: return load_le<int64_t>(p);
    default: {
      // A float element must hold an integer that int64 can represent; the
      // cast of anything else is undefined behaviour.
      const double d = array_elem_as_double(v, k);
      if (!(d >= -0x1p63 && d < 0x1p63) || d != std::floor(d))
        fail("GGUF array element {} is {}, not an integer", k, d);
      return static_cast<int64_t>(d);
    }
  }
}

}  // namespace

const char* gguf_type_name(GGUFType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64",
                                "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

bool GGUFValue::is_integer() const {
  switch (type) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::U16: case GGUFType::I16: case GGUFType::U32:
    case GGUFType::I32: case GGUFType::U64: case GGUFType::I64: return true;
    default: return false;
  }
}

std::string GGUFValue::to_string() const {
  switch (type) {
    case GGUFType::STRING: {
      std::string s(str.substr(0, 60));
      return "\"" + s + (str.size() > 60 ? "...\"" : "\"");
    }
    case GGUFType::F32: case GGUFType::F64: return fmt::format("{}", f);
    case GGUFType::BOOL: return i ? "true" : "false";
    case GGUFType::ARRAY: return fmt::format("[{} x {}]", count, gguf_type_name(elem_type));
    default:
      if (type == GGUFType::U64) return std::to_string(u);
      return std::to_string(i);
  }
}

int64_t GGUFTensorInfo::rows() const {
  int64_t r = 1;
  for (size_t k = 1; k < shape.size(); ++k) r *= shape[k];
  return r;
}

std::string GGUFTensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  std::unique_ptr<GGUFFile> f(new GGUFFile(path));
  f->parse();
  return f;
}

void GGUFFile::parse() {
  const std::string& path = file_.path();
  Cursor c(file_.data(), file_.size(), path);
  if (file_.size() < 4 || c.read<uint32_t>("magic") != kMagic)
    fail("'{}' is not a GGUF file (bad magic bytes)", path);
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) fail("'{}' is GGUF v1, which is not supported (re-convert it to v3)", path);
  if (version_ != 2 && version_ != 3) fail("'{}' has unsupported GGUF version {}", path, version_);
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
  if (n_kv > c.remaining() / 13) c.corrupt(fmt::format("metadata count {} exceeds the file", n_kv));
  // A tensor entry takes at least 8 + 4 + 4 + 8 bytes.
  if (n_tensors > c.remaining() / 24) c.corrupt(fmt::format("tensor count {} exceeds the file", n_tensors));

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(c.read_string("metadata key"));
    GGUFValue v;
    read_value(c, read_type(c, "metadata type"), v, 0);
    if (kv_index_.count(key)) c.corrupt(fmt::format("duplicate metadata key '{}'", key));
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const GGUFValue* a = find("general.alignment")) {
    // The GGUF spec asks for a multiple of 8, which also keeps every tensor's
    // elements aligned in the (page-aligned) mapping.
    if (!a->is_integer() || a->i < 8 || (a->i & (a->i - 1)) != 0 || a->i > (1 << 20))
      fail("'{}' has an invalid general.alignment ({}; a power of two from 8 to 1048576)", path, a->to_string());
    alignment_ = static_cast<uint32_t>(a->i);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensorInfo t;
    t.name = std::string(c.read_string("tensor name"));
    const uint32_t n_dims = c.read<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.corrupt(fmt::format("tensor '{}' has {} dimensions (1 to {} allowed)", t.name, n_dims, kMaxDims));
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = c.read<int64_t>("tensor shape");
      if (ne <= 0 || ne > (int64_t{1} << 40) || t.n_elements > std::numeric_limits<int64_t>::max() / ne)
        c.corrupt(fmt::format("tensor '{}' has invalid dimension {}", t.name, ne));
      t.shape.push_back(ne);
      t.n_elements *= ne;
    }
    const uint32_t raw_type = c.read<uint32_t>("tensor type");
    const DTypeInfo* info = dtype_info(raw_type);
    if (!info) fail("'{}': tensor '{}' has unknown type id {}", path, t.name, raw_type);
    t.type = static_cast<DType>(raw_type);
    if (t.shape[0] % info->block_size != 0)
      fail("'{}': tensor '{}' row length {} is not a multiple of {}'s block size {}", path, t.name, t.shape[0],
           info->name, info->block_size);
    // [2^31, 2^31] F32 is 2^64 bytes: unchecked, the size wrapped to 0 and passed.
    const auto nbytes = checked_mul(static_cast<uint64_t>(t.n_elements / info->block_size), info->block_bytes);
    if (!nbytes || *nbytes > file_.size())
      fail("'{}': tensor '{}' of shape {} ({}) is larger than the file ({} bytes)", path, t.name, t.shape_string(),
           info->name, file_.size());
    t.nbytes = static_cast<size_t>(*nbytes);
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0) c.corrupt(fmt::format("tensor '{}' offset is not aligned", t.name));
    if (tensor_index_.count(t.name)) c.corrupt(fmt::format("duplicate tensor '{}'", t.name));
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next alignment boundary.
  const size_t header_end = c.pos();
  const size_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_start > file_.size())
    fail("'{}' is truncated: tensor data would start at {} but the file has {} bytes", path, data_start,
         file_.size());
  const size_t data_size = file_.size() - std::min(data_start, file_.size());
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail("'{}' is truncated or corrupt: tensor '{}' ({} bytes at data offset {}) exceeds the file's {} data "
           "bytes",
           path, t.name, t.nbytes, t.offset, data_size);
    t.data = file_.data() + data_start + t.offset;
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GGUFTensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GGUFFile::get_string(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (v->type != GGUFType::STRING) fail("'{}': metadata '{}' is {}, expected a string", path(), key, gguf_type_name(v->type));
  return std::string(v->str);
}

std::string GGUFFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

int64_t GGUFFile::get_int(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (!v->is_integer()) fail("'{}': metadata '{}' is {}, expected an integer", path(), key, gguf_type_name(v->type));
  return v->i;
}

int64_t GGUFFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  fail("'{}': metadata '{}' is {}, expected a number", path(), key, gguf_type_name(v->type));
}

double GGUFFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GGUFFile::get_bool(const std::string& key, bool fallback) const {
  const GGUFValue* v = find(key);
  if (!v) return fallback;
  if (v->type == GGUFType::BOOL || v->is_integer()) return v->i != 0;
  fail("'{}': metadata '{}' is {}, expected a bool", path(), key, gguf_type_name(v->type));
}

std::vector<std::string_view> GGUFFile::get_string_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (v->type != GGUFType::ARRAY || v->elem_type != GGUFType::STRING)
    fail("'{}': metadata '{}' is not an array of strings", path(), key);
  return v->strings;
}

std::vector<float> GGUFFile::get_float_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (v->type != GGUFType::ARRAY || v->raw == nullptr)
    fail("'{}': metadata '{}' is not a numeric array", path(), key);
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = static_cast<float>(array_elem_as_double(*v, k));
  return out;
}

std::vector<int64_t> GGUFFile::get_int_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) fail("'{}': missing metadata key '{}'", path(), key);
  if (v->type != GGUFType::ARRAY || v->raw == nullptr)
    fail("'{}': metadata '{}' is not a numeric array", path(), key);
  std::vector<int64_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = array_elem_as_int(*v, k);
  return out;
}

// ---------------------------------------------------------------- writer

namespace {
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  const size_t at = b.size();
  b.resize(at + n);
  if (n) std::memcpy(b.data() + at, p, n);
}
template <typename T>
void put_raw(std::vector<uint8_t>& b, T v) {
  put_bytes(b, &v, sizeof(T));
}
void put_u32(std::vector<uint8_t>& b, uint32_t v) { put_raw(b, v); }
void put_u64(std::vector<uint8_t>& b, uint64_t v) { put_raw(b, v); }
void put_str(std::vector<uint8_t>& b, std::string_view s) {
  put_u64(b, s.size());
  put_bytes(b, s.data(), s.size());
}
void encode_value(std::vector<uint8_t>& b, const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::STRING: put_str(b, v.str); break;
    case GGUFType::ARRAY: {
      put_u32(b, static_cast<uint32_t>(v.elem_type));
      put_u64(b, v.count);
      if (v.elem_type == GGUFType::STRING) {
        for (auto s : v.strings) put_str(b, s);
      } else if (v.elem_type == GGUFType::ARRAY) {
        for (const auto& n : v.nested) encode_value(b, n);
      } else {
        put_bytes(b, v.raw, v.count * scalar_size(v.elem_type));
      }
      break;
    }
    case GGUFType::F32: put_raw<float>(b, static_cast<float>(v.f)); break;
    case GGUFType::F64: put_raw<double>(b, v.f); break;
    default: {
      const size_t n = scalar_size(v.type);
      const uint64_t bits = v.u;
      put_bytes(b, &bits, n);
    }
  }
}
}  // namespace

void GGUFWriter::set_string(const std::string& key, const std::string& value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::STRING));
  put_str(b, value);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_u32(const std::string& key, uint32_t value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::U32));
  put_u32(b, value);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_i32(const std::string& key, int32_t value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::I32));
  put_raw<int32_t>(b, value);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_f32(const std::string& key, float value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::F32));
  put_raw<float>(b, value);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_bool(const std::string& key, bool value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::BOOL));
  put_raw<uint8_t>(b, value ? 1 : 0);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_string_array(const std::string& key, const std::vector<std::string>& values) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::ARRAY));
  put_u32(b, static_cast<uint32_t>(GGUFType::STRING));
  put_u64(b, values.size());
  for (const auto& s : values) put_str(b, s);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_f32_array(const std::string& key, const std::vector<float>& values) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::ARRAY));
  put_u32(b, static_cast<uint32_t>(GGUFType::F32));
  put_u64(b, values.size());
  for (float v : values) put_raw<float>(b, v);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::ARRAY));
  put_u32(b, static_cast<uint32_t>(GGUFType::I32));
  put_u64(b, values.size());
  for (int32_t v : values) put_raw<int32_t>(b, v);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_bool_array(const std::string& key, const std::vector<bool>& values) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(GGUFType::ARRAY));
  put_u32(b, static_cast<uint32_t>(GGUFType::BOOL));
  put_u64(b, values.size());
  for (bool v : values) put_raw<uint8_t>(b, v ? 1 : 0);
  kv_.emplace_back(key, std::move(b));
}
void GGUFWriter::set_value(const std::string& key, const GGUFValue& value) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(value.type));
  encode_value(b, value);
  kv_.emplace_back(key, std::move(b));
}

void GGUFWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                            std::vector<uint8_t> data) {
  int64_t rows = 1;
  for (size_t k = 1; k < shape.size(); ++k) rows *= shape[k];
  const size_t expect = dtype_row_bytes(type, shape.at(0)) * static_cast<size_t>(rows);
  PAGELLM_CHECK(data.size() == expect, "tensor '{}': {} bytes given, {} expected", name, data.size(), expect);
  tensors_.push_back({name, type, shape, std::move(data)});
}

void GGUFWriter::write(const std::string& path) const {
  constexpr size_t kAlign = 32;
  std::vector<uint8_t> head;
  put_u32(head, kMagic);
  put_u32(head, 3);
  put_u64(head, tensors_.size());
  put_u64(head, kv_.size());
  for (const auto& [key, enc] : kv_) {
    put_str(head, key);
    put_bytes(head, enc.data(), enc.size());
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_str(head, t.name);
    put_u32(head, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put_u64(head, static_cast<uint64_t>(d));
    put_u32(head, static_cast<uint32_t>(t.type));
    put_u64(head, offset);
    offset += (t.data.size() + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, 0);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  PAGELLM_CHECK(out.good(), "cannot write '{}'", path);
  out.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
  static const uint8_t zeros[kAlign] = {};
  for (const auto& t : tensors_) {
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    const size_t pad = (kAlign - t.data.size() % kAlign) % kAlign;
    out.write(reinterpret_cast<const char*>(zeros), static_cast<std::streamsize>(pad));
  }
  PAGELLM_CHECK(out.good(), "error writing '{}'", path);
}

}  // namespace pagellm
