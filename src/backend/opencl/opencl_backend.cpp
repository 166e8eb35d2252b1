// The OpenCL backend: one in-order command queue; every op enqueues its
// kernel and returns. The step's metadata is uploaded once per set_batch
// into one int32 device buffer that the kernels index by offset.
#include "backend/opencl/opencl_backend.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/opencl/cl_common.h"
#include "backend/opencl/kernels.h"
#include "backend/opencl/weight_pack.h"
#include "core/error.h"
#include "core/quant_blocks.h"

namespace pagellm {
namespace opencl {
namespace {

// Bytes this backend holds on the device, shared with buffers and weights
// (which may outlive the backend object).
using Usage = std::shared_ptr<std::atomic<int64_t>>;

class Tracked {
 public:
  Tracked(Usage u, size_t bytes) : usage_(std::move(u)), bytes_(static_cast<int64_t>(bytes)) { *usage_ += bytes_; }
  ~Tracked() { *usage_ -= bytes_; }
  Tracked(const Tracked&) = delete;
  Tracked& operator=(const Tracked&) = delete;

 private:
  Usage usage_;
  int64_t bytes_;
};

class ClBuffer : public Buffer {
 public:
  ClBuffer(DType t, size_t n, ClMem m, Usage u, size_t bytes)
      : Buffer(t, n), mem(std::move(m)), tracked_(std::move(u), bytes) {}
  ClMem mem;

 private:
  Tracked tracked_;
};

class ClWeight : public Weight {
 public:
  ClWeight(ClMem m, Usage u, size_t bytes) : mem(std::move(m)), tracked_(std::move(u), bytes) {}
  ClMem mem;
  cl_ulong scale_offset = 0;  // byte offset of the scales (split types, weight_pack.h)
  std::vector<float> host;    // vectors only: a host copy (rope factors are read on the host)

 private:
  Tracked tracked_;
};

cl_mem mem_of(const Buffer& b) {
  const auto* c = dynamic_cast<const ClBuffer*>(&b);
  PAGELLM_CHECK(c, "buffer was not allocated by the OpenCL backend");
  return c->mem.get();
}

const ClWeight& as_cl(const Weight& w) {
  const auto* c = dynamic_cast<const ClWeight*>(&w);
  PAGELLM_CHECK(c, "weight '{}' was not uploaded by the OpenCL backend", w.name);
  return *c;
}

void need(const Buffer& b, int64_t elems, const char* what) {
  PAGELLM_CHECK(b.dtype() == DType::F32, "{}: buffer must be f32", what);
  PAGELLM_CHECK(elems >= 0 && static_cast<size_t>(elems) <= b.size(), "{}: buffer of {} values, op needs {}", what,
                b.size(), elems);
}

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// A __local kernel argument of `bytes`.
struct LocalBytes {
  size_t bytes;
};

void set_args(cl_kernel, cl_uint) {}
template <typename T, typename... Rest>
void set_args(cl_kernel k, cl_uint i, const T& v, const Rest&... rest) {
  if constexpr (std::is_same_v<T, LocalBytes>)
    cl_check(clSetKernelArg(k, i, v.bytes, nullptr), "clSetKernelArg (local)");
  else
    cl_check(clSetKernelArg(k, i, sizeof(T), &v), "clSetKernelArg");
  set_args(k, i + 1, rest...);
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  cl_check(clGetDeviceInfo(d, what, 0, nullptr, &n), "clGetDeviceInfo");
  std::string s(n, '\0');
  cl_check(clGetDeviceInfo(d, what, n, s.data(), nullptr), "clGetDeviceInfo");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  cl_check(clGetDeviceInfo(d, what, sizeof(T), &v, nullptr), "clGetDeviceInfo");
  return v;
}

// Kernel name suffix of each held matrix type.
enum WeightKind { kF32, kF16, kQ8_0, kQ4_0, kQ4_K, kQ5_0, kQ6_K, kNumWeightKinds };
const char* const kWeightSuffix[kNumWeightKinds] = {"f32", "f16", "q8_0", "q4_0", "q4_k", "q5_0", "q6_k"};

WeightKind weight_kind(DType t) {
  switch (t) {
    case DType::F32: return kF32;
    case DType::F16: return kF16;
    case DType::Q8_0: return kQ8_0;
    case DType::Q4_0: return kQ4_0;
    case DType::Q4_K: return kQ4_K;
    case DType::Q5_0: return kQ5_0;
    case DType::Q6_K: return kQ6_K;
    default: fail("no OpenCL kernel reads {} weights", dtype_name(t));
  }
}

class OpenClBackend : public Backend {
 public:
  OpenClBackend(int platform_index, int device_index);
  ~OpenClBackend() override;

  std::string name() const override { return "opencl"; }
  std::string describe() const override { return description_; }
  bool supports(Feature f) const override { return f == Feature::SwapToHost || f == Feature::AsyncOps; }

  MemoryInfo memory_info() const override;
  BufferPtr alloc(DType type, size_t n) override;
  void copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) override;
  void copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) override;
  void synchronize() override {
    cl_check(clFinish(queue_), "clFinish");
    collect_profile();
  }

  bool supports_weight(DType t) const override { return native_matrix_type(t) || convertible_matrix_type(t); }
  std::unique_ptr<Weight> upload(const TensorData& t) override;

  void allocate_kv_cache(const KVCacheSpec& spec) override;
  const KVCacheSpec& kv_cache_spec() const override { return kv_; }
  void copy_blocks(const BlockPairs& src_dst) override;
  void allocate_swap_space(int num_blocks) override;
  void swap_out(const BlockPairs& device_to_host) override;
  void swap_in(const BlockPairs& host_to_device) override;

  void set_batch(const BatchInfo& batch) override;

  void embed(const Weight& table, float scale, Buffer& out) override;
  void matmul(const Weight& w, const Buffer& x, int64_t n, Buffer& y) override;
  void add_bias(Buffer& y, const Weight& bias, int64_t n) override;
  void rms_norm(const Buffer& x, const Weight* w, int64_t n_rows, int64_t dim, float eps, Buffer& y) override;
  void rope(Buffer& x, int n_heads, int head_dim, const RopeConfig& cfg) override;
  void store_kv(int layer, Buffer& k, const Buffer& v, const RopeConfig* k_rope) override;
  void attention(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) override;
  void glu(const Buffer& gate, const Buffer& up, int64_t n, Activation act, Buffer& out) override;
  void add(Buffer& y, const Buffer& x, int64_t n) override;
  void gather_rows(const Buffer& x, int64_t dim, const std::vector<int32_t>& rows, Buffer& out) override;

  void set_profiling(bool on) override;
  std::string profile_report() const override;

 private:
  // Op categories of the profile breakdown.
  enum Category { kMatmul, kAttention, kOther, kNumCategories };
  void collect_profile();
  cl_kernel kernel(const char* name);
  template <typename... Args>
  void launch(Category c, cl_kernel k, cl_uint dims, const size_t* global, const size_t* local,
              const Args&... args) {
    set_args(k, 0, args...);
    cl_event ev = nullptr;
    cl_check(clEnqueueNDRangeKernel(queue_, k, dims, nullptr, global, local, 0, nullptr, profiling_ ? &ev : nullptr),
             "clEnqueueNDRangeKernel");
    if (ev) timed_.emplace_back(c, ev);
  }
  ClMem create_buffer(cl_mem_flags flags, size_t bytes, const void* host, const char* what);
  cl_mem rope_table(const RopeConfig& cfg, float* mscale);
  void move_block(int32_t dev, int32_t host, bool to_host);
  void check_block(int32_t b) const {
    PAGELLM_CHECK(b >= 0 && b < kv_.num_blocks, "KV block {} out of range [0, {})", b, kv_.num_blocks);
  }
  void check_batch() const { PAGELLM_CHECK(have_batch_, "OpenCL backend: op needs set_batch first"); }

  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_program program_ = nullptr;
  std::vector<std::pair<std::string, cl_kernel>> kernels_;
  cl_kernel mv_[kNumWeightKinds] = {}, mm_[kNumWeightKinds] = {}, embed_[kNumWeightKinds] = {};
  std::string description_;
  cl_ulong global_mem_ = 0, max_alloc_ = 0, local_mem_ = 0;
  cl_uint compute_units_ = 1;
  bool host_memory_ = false;
  Usage usage_ = std::make_shared<std::atomic<int64_t>>(0);
  ClMem dummy_;  // bound where a kernel's optional buffer is absent

  KVCacheSpec kv_;
  size_t block_bytes_ = 0;  // one block of one layer, K or V
  std::vector<ClMem> k_cache_, v_cache_;
  std::unique_ptr<Tracked> kv_tracked_;  // the cache's share of usage_
  std::vector<uint8_t> swap_;  // host pool: [block][layer][K, V][block_bytes_]
  int swap_blocks_ = 0;

  // The step's metadata (see set_batch), double-buffered on the host: a
  // non-blocking write reads its host memory until it has run.
  ClMem meta_;
  size_t meta_capacity_ = 0;  // int32 values
  std::vector<int32_t> meta_host_[2];
  cl_event meta_done_[2] = {nullptr, nullptr};
  int meta_flip_ = 0;
  bool have_batch_ = false;
  int64_t n_tokens_ = 0;
  int32_t max_token_ = -1;
  int ids_off_ = 0, pos_off_ = 0, slot_off_ = 0, seqs_off_ = 0, bt_off_ = 0;
  int tiles_off_[4] = {}, n_tiles_[4] = {};  // query tiles of 1, 2, 4, 8 tokens
  int64_t max_span_ = 0;                      // the longest sequence's context

  struct RopeTable {
    RopeConfig cfg;
    float mscale = 1.0f;      // cos / sin scale (YaRN)
    std::vector<float> host;  // kept: the upload is non-blocking
    ClMem mem;
  };
  std::vector<RopeTable> rope_tables_;

  ClMem attn_part_;  // split attention partials, grow-only
  size_t attn_part_bytes_ = 0;

  // --profile: kernel times from events (a queue with profiling on only then).
  bool profiling_ = false;
  std::vector<std::pair<Category, cl_event>> timed_;
  double category_ns_[kNumCategories] = {};
};

OpenClBackend::OpenClBackend(int platform_index, int device_index) {
  cl_uint n_platforms = 0;
  if (clGetPlatformIDs(0, nullptr, &n_platforms) != CL_SUCCESS || n_platforms == 0)
    fail("no OpenCL platform found (is an ICD such as PoCL installed?)");
  std::vector<cl_platform_id> platforms(n_platforms);
  cl_check(clGetPlatformIDs(n_platforms, platforms.data(), nullptr), "clGetPlatformIDs");
  PAGELLM_CHECK(platform_index >= 0 && platform_index < static_cast<int>(n_platforms),
                "OpenCL platform {} does not exist ({} found)", platform_index, n_platforms);
  cl_platform_id platform = platforms[platform_index];
  cl_uint n_devices = 0;
  const cl_int rc = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &n_devices);
  if (rc == CL_DEVICE_NOT_FOUND) n_devices = 0;
  else cl_check(rc, "clGetDeviceIDs");
  PAGELLM_CHECK(device_index >= 0 && device_index < static_cast<int>(n_devices),
                "OpenCL device {} does not exist on platform {} ({} found)", device_index, platform_index, n_devices);
  std::vector<cl_device_id> devices(n_devices);
  cl_check(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n_devices, devices.data(), nullptr), "clGetDeviceIDs");
  device_ = devices[device_index];

  global_mem_ = device_value<cl_ulong>(device_, CL_DEVICE_GLOBAL_MEM_SIZE);
  max_alloc_ = device_value<cl_ulong>(device_, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  local_mem_ = device_value<cl_ulong>(device_, CL_DEVICE_LOCAL_MEM_SIZE);
  compute_units_ = std::max<cl_uint>(1, device_value<cl_uint>(device_, CL_DEVICE_MAX_COMPUTE_UNITS));
  // Deprecated after 1.2: a driver that no longer answers means "no".
  cl_bool unified = CL_FALSE;
  if (clGetDeviceInfo(device_, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, nullptr) != CL_SUCCESS)
    unified = CL_FALSE;
  host_memory_ = unified || (device_value<cl_device_type>(device_, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_CPU);
  const size_t max_wg = device_value<size_t>(device_, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  const std::string dev_name = device_string(device_, CL_DEVICE_NAME);
  PAGELLM_CHECK(max_wg >= 256, "OpenCL device '{}' allows work-groups of {} threads; the kernels need 256", dev_name,
                max_wg);

  cl_int err = CL_SUCCESS;
  context_ = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &err);
  cl_check(err, "clCreateContext");
  queue_ = clCreateCommandQueue(context_, device_, 0, &err);
  cl_check(err, "clCreateCommandQueue");

  const char* source = kKernelSource;
  program_ = clCreateProgramWithSource(context_, 1, &source, nullptr, &err);
  cl_check(err, "clCreateProgramWithSource");
  const std::string opts = fmt::format(
      "-cl-std=CL1.2 -DMV_WG={} -DMV_ROWS={} -DMV_NT={} -DTM={} -DTN={} -DNORM_WG={} -DATT_WG={} -DATT_ROWS={} -DATT_LANES={} "
      "-DATT_CHUNK={} -DATT_MAX_D={}",
      kMvGroup, kMvRows, kMvTokens, kTileTokens, kTileRows, kNormGroup, kAttnGroup, kAttnRows, kAttnLanes, kAttnChunk,
      kAttnMaxHeadDim);
  if (clBuildProgram(program_, 1, &device_, opts.c_str(), nullptr, nullptr) != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(program_, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
    std::string log(n, '\0');
    clGetProgramBuildInfo(program_, device_, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
    fail("OpenCL kernels do not build on '{}':\n{}", dev_name, log);
  }
  for (int k = 0; k < kNumWeightKinds; ++k) {
    mv_[k] = kernel(fmt::format("mv_{}", kWeightSuffix[k]).c_str());
    mm_[k] = kernel(fmt::format("mm_{}", kWeightSuffix[k]).c_str());
    embed_[k] = kernel(fmt::format("embed_{}", kWeightSuffix[k]).c_str());
  }
  dummy_ = create_buffer(CL_MEM_READ_WRITE, 64, nullptr, "placeholder");

  size_t plat_n = 0;
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, 0, nullptr, &plat_n);
  std::string plat(plat_n, '\0');
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, plat_n, plat.data(), nullptr);
  while (!plat.empty() && plat.back() == '\0') plat.pop_back();
  description_ = fmt::format("opencl {}:{} '{}' ({}, {} compute units, {} MiB, {} KiB local) on '{}'",
                             platform_index, device_index, dev_name, device_string(device_, CL_DEVICE_VERSION),
                             compute_units_, global_mem_ >> 20, local_mem_ >> 10, plat);
}

OpenClBackend::~OpenClBackend() {
  if (queue_) clFinish(queue_);
  for (auto& [c, e] : timed_) clReleaseEvent(e);
  for (cl_event& e : meta_done_)
    if (e) clReleaseEvent(e);
  for (auto& [name, k] : kernels_) clReleaseKernel(k);
  if (program_) clReleaseProgram(program_);
  if (queue_) clReleaseCommandQueue(queue_);
  // Buffers still held (members, the caller's) keep the context alive until released.
  if (context_) clReleaseContext(context_);
}

cl_kernel OpenClBackend::kernel(const char* name) {
  for (auto& [n, k] : kernels_)
    if (n == name) return k;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(program_, name, &err);
  cl_check(err, name);
  kernels_.emplace_back(name, k);
  return k;
}

ClMem OpenClBackend::create_buffer(cl_mem_flags flags, size_t bytes, const void* host, const char* what) {
  PAGELLM_CHECK(bytes <= max_alloc_, "OpenCL {}: {} bytes exceed the device's largest allocation ({} bytes)", what,
                bytes, max_alloc_);
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(context_, flags | (host ? CL_MEM_COPY_HOST_PTR : 0), std::max<size_t>(bytes, 16),
                            const_cast<void*>(host), &err);
  cl_check(err, what);
  return ClMem(m);
}

MemoryInfo OpenClBackend::memory_info() const {
  MemoryInfo m;
  m.total_bytes = global_mem_;
  const int64_t used = usage_->load();
  m.free_bytes = used >= static_cast<int64_t>(global_mem_) ? 0 : global_mem_ - static_cast<size_t>(used);
  m.host_memory = host_memory_;
  return m;
}

BufferPtr OpenClBackend::alloc(DType type, size_t n) {
  const size_t elem = dtype_size(type);
  PAGELLM_CHECK(elem > 0, "OpenCL buffers hold plain types, not {}", dtype_name(type));
  const size_t bytes = n * elem;
  return std::make_unique<ClBuffer>(type, n, create_buffer(CL_MEM_READ_WRITE, bytes, nullptr, "alloc"), usage_,
                                    bytes);
}

// No staging copy: as backend.h says, `src` must stay valid until
// synchronize(); the write is non-blocking and reads it when it runs.
void OpenClBackend::copy_from_host(const void* src, Buffer& dst, size_t offset, size_t bytes) {
  PAGELLM_CHECK(offset + bytes <= dst.bytes(), "copy_from_host: {} bytes at {} outside a buffer of {}", bytes, offset,
                dst.bytes());
  if (bytes == 0) return;
  cl_check(clEnqueueWriteBuffer(queue_, mem_of(dst), CL_FALSE, offset, bytes, src, 0, nullptr, nullptr),
           "clEnqueueWriteBuffer");
}

void OpenClBackend::copy_to_host(const Buffer& src, size_t offset, size_t bytes, void* dst) {
  PAGELLM_CHECK(offset + bytes <= src.bytes(), "copy_to_host: {} bytes at {} outside a buffer of {}", bytes, offset,
                src.bytes());
  if (bytes == 0) return;
  cl_check(clEnqueueReadBuffer(queue_, mem_of(src), CL_FALSE, offset, bytes, dst, 0, nullptr, nullptr),
           "clEnqueueReadBuffer");
}

std::unique_ptr<Weight> OpenClBackend::upload(const TensorData& t) {
  const int64_t rows = t.rows(), cols = t.cols();
  PAGELLM_CHECK(t.data, "tensor '{}' has no data", t.name);
  std::unique_ptr<ClWeight> w;
  if (t.shape.size() == 1) {
    // Vectors (norms, biases, rope factors) are held as f32.
    std::vector<float> v(static_cast<size_t>(cols));
    dequantize_row_ref(t.type, t.data, v.data(), cols);
    const size_t bytes = v.size() * sizeof(float);
    w = std::make_unique<ClWeight>(create_buffer(CL_MEM_READ_ONLY, bytes, v.data(), t.name.c_str()), usage_, bytes);
    w->held_type = DType::F32;
    w->held_bytes = bytes;
    w->host = std::move(v);
  } else {
    const PackedMatrix p = pack_matrix(t.type, rows, cols, t.data);
    const void* image = p.bytes.empty() ? t.data : p.bytes.data();
    w = std::make_unique<ClWeight>(create_buffer(CL_MEM_READ_ONLY, p.device_bytes, image, t.name.c_str()), usage_,
                                   p.device_bytes);
    w->held_type = p.held_type;
    w->held_bytes = p.device_bytes;
    w->scale_offset = p.scale_offset;
  }
  w->type = t.type;
  w->rows = rows;
  w->cols = cols;
  w->name = t.name;
  return w;
}

void OpenClBackend::allocate_kv_cache(const KVCacheSpec& spec) {
  PAGELLM_CHECK(spec.dtype == DType::F16 || spec.dtype == DType::F32, "KV cache type must be f16 or f32");
  PAGELLM_CHECK(spec.num_blocks > 1 && spec.block_size > 0 && spec.n_layers > 0 && spec.n_kv_heads > 0 &&
                    spec.head_dim > 0,
                "KV cache needs at least 2 blocks and positive sizes");
  PAGELLM_CHECK(static_cast<int64_t>(spec.num_blocks) * spec.block_size < INT32_MAX, "KV cache has too many slots");
  k_cache_.clear();
  v_cache_.clear();
  swap_.clear();
  swap_blocks_ = 0;
  kv_ = spec;
  block_bytes_ = static_cast<size_t>(spec.n_kv_heads) * spec.block_size * spec.head_dim * dtype_size(spec.dtype);
  const size_t layer_bytes = block_bytes_ * static_cast<size_t>(spec.num_blocks);
  // Not cleared: attention skips masked slots' values rather than weighting
  // them by 0, and a fill would make all of it resident on a host device.
  for (int l = 0; l < spec.n_layers; ++l) {
    k_cache_.push_back(create_buffer(CL_MEM_READ_WRITE, layer_bytes, nullptr, "KV cache"));
    v_cache_.push_back(create_buffer(CL_MEM_READ_WRITE, layer_bytes, nullptr, "KV cache"));
  }
  kv_tracked_.reset();
  kv_tracked_ = std::make_unique<Tracked>(usage_, layer_bytes * 2 * static_cast<size_t>(spec.n_layers));
}

void OpenClBackend::copy_blocks(const BlockPairs& src_dst) {
  for (const auto& [src, dst] : src_dst) {
    check_block(src);
    check_block(dst);
    if (src == dst) continue;
    for (int l = 0; l < kv_.n_layers; ++l)
      for (cl_mem m : {k_cache_[l].get(), v_cache_[l].get()})
        cl_check(clEnqueueCopyBuffer(queue_, m, m, src * block_bytes_, dst * block_bytes_, block_bytes_, 0, nullptr,
                                     nullptr),
                 "clEnqueueCopyBuffer");
  }
}

void OpenClBackend::allocate_swap_space(int num_blocks) {
  PAGELLM_CHECK(!k_cache_.empty(), "allocate_swap_space before allocate_kv_cache");
  PAGELLM_CHECK(num_blocks >= 0, "swap space of {} blocks", num_blocks);
  synchronize();  // pending swaps may still read or write the old pool
  swap_.assign(static_cast<size_t>(num_blocks) * kv_.bytes_per_block(), 0);
  swap_blocks_ = num_blocks;
}

// One device block <-> one host block of the pool, every layer, K then V;
// non-blocking, ordered by the queue like every op.
void OpenClBackend::move_block(int32_t dev, int32_t host, bool to_host) {
  check_block(dev);
  PAGELLM_CHECK(host >= 0 && host < swap_blocks_, "swap block {} out of range [0, {})", host, swap_blocks_);
  uint8_t* h = swap_.data() + static_cast<size_t>(host) * kv_.bytes_per_block();
  for (int l = 0; l < kv_.n_layers; ++l) {
    cl_mem caches[2] = {k_cache_[l].get(), v_cache_[l].get()};
    for (int kv = 0; kv < 2; ++kv) {
      uint8_t* part = h + (2 * l + kv) * block_bytes_;
      const size_t offset = dev * block_bytes_;
      if (to_host)
        cl_check(clEnqueueReadBuffer(queue_, caches[kv], CL_FALSE, offset, block_bytes_, part, 0, nullptr, nullptr),
                 "clEnqueueReadBuffer (swap out)");
      else
        cl_check(clEnqueueWriteBuffer(queue_, caches[kv], CL_FALSE, offset, block_bytes_, part, 0, nullptr, nullptr),
                 "clEnqueueWriteBuffer (swap in)");
    }
  }
}

void OpenClBackend::swap_out(const BlockPairs& device_to_host) {
  for (const auto& [dev, host] : device_to_host) move_block(dev, host, true);
}

void OpenClBackend::swap_in(const BlockPairs& host_to_device) {
  for (const auto& [host, dev] : host_to_device) move_block(dev, host, false);
}

// Metadata layout (int32): token ids [n], positions [n], slots [n], per
// sequence (q_start, q_len, ctx_len, block table offset), the block tables,
// then the attention tiles of 1, 2, 4 and 8 query tokens as (first row,
// tokens, sequence): the tile size an attention call uses depends on its
// heads per KV head, so all four are ready.
void OpenClBackend::set_batch(const BatchInfo& batch) {
  const int64_t n = batch.n_tokens();
  PAGELLM_CHECK(static_cast<int64_t>(batch.positions.size()) == n &&
                    static_cast<int64_t>(batch.slot_mapping.size()) == n,
                "batch arrays disagree in length");
  PAGELLM_CHECK(n < INT32_MAX / 8, "batch of {} tokens", n);
  const int64_t n_slots = kv_.num_blocks ? static_cast<int64_t>(kv_.num_blocks) * kv_.block_size : INT32_MAX;
  for (int64_t s : batch.slot_mapping) PAGELLM_CHECK(s >= 0 && s < n_slots, "KV slot {} out of range", s);
  max_span_ = 0;
  for (const auto& seq : batch.seqs) {
    PAGELLM_CHECK(seq.q_len > 0 && seq.q_start >= 0 && seq.q_start + seq.q_len <= n && seq.ctx_len >= seq.q_len,
                  "bad sequence slice in batch");
    if (kv_.num_blocks) {
      const int64_t need_blocks = (seq.ctx_len + kv_.block_size - 1) / kv_.block_size;
      PAGELLM_CHECK(static_cast<int64_t>(seq.block_table.size()) >= need_blocks, "block table too short: {} < {}",
                    seq.block_table.size(), need_blocks);
      for (int64_t b = 0; b < need_blocks; ++b) check_block(seq.block_table[b]);
    }
    max_span_ = std::max<int64_t>(max_span_, seq.ctx_len);
  }

  const int flip = meta_flip_;
  meta_flip_ ^= 1;
  if (meta_done_[flip]) {  // the write that last read this host copy
    cl_check(clWaitForEvents(1, &meta_done_[flip]), "clWaitForEvents");
    clReleaseEvent(meta_done_[flip]);
    meta_done_[flip] = nullptr;
  }
  std::vector<int32_t>& m = meta_host_[flip];
  m.clear();
  ids_off_ = 0;
  m.insert(m.end(), batch.token_ids.begin(), batch.token_ids.end());
  pos_off_ = static_cast<int>(m.size());
  m.insert(m.end(), batch.positions.begin(), batch.positions.end());
  slot_off_ = static_cast<int>(m.size());
  for (int64_t s : batch.slot_mapping) m.push_back(static_cast<int32_t>(s));
  seqs_off_ = static_cast<int>(m.size());
  int32_t bt_len = 0;
  for (const auto& seq : batch.seqs) {
    m.insert(m.end(), {seq.q_start, seq.q_len, seq.ctx_len, bt_len});
    bt_len += static_cast<int32_t>(seq.block_table.size());
  }
  bt_off_ = static_cast<int>(m.size());
  for (const auto& seq : batch.seqs) m.insert(m.end(), seq.block_table.begin(), seq.block_table.end());
  for (int ti = 0; ti < 4; ++ti) {
    const int tt = 1 << ti;
    tiles_off_[ti] = static_cast<int>(m.size());
    for (int32_t si = 0; si < static_cast<int32_t>(batch.seqs.size()); ++si) {
      const auto& seq = batch.seqs[si];
      for (int32_t t0 = 0; t0 < seq.q_len; t0 += tt) m.insert(m.end(), {seq.q_start + t0, std::min(tt, seq.q_len - t0), si});
    }
    n_tiles_[ti] = (static_cast<int>(m.size()) - tiles_off_[ti]) / 3;
  }
  PAGELLM_CHECK(m.size() < static_cast<size_t>(INT32_MAX), "batch metadata too large");

  if (m.size() > meta_capacity_) {
    meta_capacity_ = std::max(m.size(), meta_capacity_ * 2);
    meta_ = create_buffer(CL_MEM_READ_ONLY, meta_capacity_ * sizeof(int32_t), nullptr, "batch metadata");
  }
  if (!m.empty())
    cl_check(clEnqueueWriteBuffer(queue_, meta_.get(), CL_FALSE, 0, m.size() * sizeof(int32_t), m.data(), 0, nullptr,
                                  &meta_done_[flip]),
             "clEnqueueWriteBuffer (batch)");
  n_tokens_ = n;
  max_token_ = -1;
  for (int32_t id : batch.token_ids) {
    PAGELLM_CHECK(id >= 0, "negative token id {}", id);
    max_token_ = std::max(max_token_, id);
  }
  have_batch_ = true;
}

void OpenClBackend::embed(const Weight& table, float scale, Buffer& out) {
  check_batch();
  const ClWeight& w = as_cl(table);
  PAGELLM_CHECK(max_token_ < w.rows, "token id {} outside the vocabulary ({})", max_token_, w.rows);
  need(out, n_tokens_ * w.cols, "embed");
  if (n_tokens_ == 0) return;
  if (w.cols % 8 != 0) {  // a float table (pack_matrix): values one by one
    const size_t global[2] = {round_up(static_cast<size_t>(w.cols), 64), static_cast<size_t>(n_tokens_)};
    launch(kOther, kernel("embed_any"), 2, global, nullptr, w.mem.get(), static_cast<cl_int>(w.held_type == DType::F16),
           static_cast<cl_int>(w.cols), meta_.get(), static_cast<cl_int>(ids_off_), scale, mem_of(out));
    return;
  }
  const size_t global[2] = {round_up(static_cast<size_t>(w.cols / 8), 64), static_cast<size_t>(n_tokens_)};
  launch(kOther, embed_[weight_kind(w.held_type)], 2, global, nullptr, w.mem.get(), w.scale_offset,
         static_cast<cl_int>(w.cols), meta_.get(), static_cast<cl_int>(ids_off_), scale, mem_of(out));
}

void OpenClBackend::matmul(const Weight& weight, const Buffer& x, int64_t n, Buffer& y) {
  const ClWeight& w = as_cl(weight);
  need(x, n * w.cols, "matmul input");
  need(y, n * w.rows, "matmul output");
  PAGELLM_CHECK(w.rows < INT32_MAX && w.cols < INT32_MAX && n < INT32_MAX, "matmul too large");
  if (n == 0) return;
  const WeightKind kind = weight_kind(w.held_type);
  const auto rows = static_cast<cl_int>(w.rows), cols = static_cast<cl_int>(w.cols), nn = static_cast<cl_int>(n);
  if (w.cols % 8 != 0) {  // a float matrix (pack_matrix): the vector kernels read 8 at a time
    const size_t global[2] = {round_up(static_cast<size_t>(w.rows), 64), static_cast<size_t>(n)};
    launch(kMatmul, kernel("matmul_any"), 2, global, nullptr, w.mem.get(),
           static_cast<cl_int>(w.held_type == DType::F16), rows, cols, mem_of(x), nn, mem_of(y));
    return;
  }
  if (n <= kMvTokens) {
    const size_t global[2] = {round_up(static_cast<size_t>(w.rows), kMvRows) / kMvRows * kMvGroup, 1};
    const size_t local[2] = {kMvGroup, 1};
    launch(kMatmul, mv_[kind], 2, global, local, w.mem.get(), w.scale_offset, rows, cols, mem_of(x), nn, mem_of(y));
  } else {
    const size_t global[2] = {round_up(static_cast<size_t>(w.rows), kTileRows) / kTileRows * 16,
                              round_up(static_cast<size_t>(n), kTileTokens) / kTileTokens * 16};
    const size_t local[2] = {16, 16};
    launch(kMatmul, mm_[kind], 2, global, local, w.mem.get(), w.scale_offset, rows, cols, mem_of(x), nn, mem_of(y));
  }
}

void OpenClBackend::add_bias(Buffer& y, const Weight& bias, int64_t n) {
  const ClWeight& b = as_cl(bias);
  PAGELLM_CHECK(b.held_type == DType::F32 && b.rows == 1, "bias '{}' is not a vector", b.name);
  need(y, n * b.cols, "add_bias");
  if (n == 0) return;
  const size_t global[2] = {round_up(static_cast<size_t>(b.cols), 64), static_cast<size_t>(n)};
  launch(kOther, kernel("add_bias"), 2, global, nullptr, mem_of(y), b.mem.get(), static_cast<cl_int>(b.cols),
         static_cast<cl_int>(n));
}

void OpenClBackend::rms_norm(const Buffer& x, const Weight* w, int64_t n_rows, int64_t dim, float eps, Buffer& y) {
  need(x, n_rows * dim, "rms_norm input");
  need(y, n_rows * dim, "rms_norm output");
  if (w)
    PAGELLM_CHECK(w->cols == dim && as_cl(*w).held_type == DType::F32, "norm weight '{}' has {} values, rows have {}",
                  w->name, w->cols, dim);
  if (n_rows == 0) return;
  const size_t global = static_cast<size_t>(n_rows) * kNormGroup, local = kNormGroup;
  launch(kOther, kernel("rms_norm"), 1, &global, &local, mem_of(x), w ? as_cl(*w).mem.get() : dummy_.get(),
         static_cast<cl_int>(w != nullptr), static_cast<cl_int>(dim), eps, mem_of(y));
}

// Each pair's frequency in double, stored as float hi + lo; uploaded once
// per configuration and kept for the backend's life.
cl_mem OpenClBackend::rope_table(const RopeConfig& cfg, float* mscale) {
  for (const auto& t : rope_tables_)
    if (t.cfg.same_table(cfg)) {
      *mscale = t.mscale;
      return t.mem.get();
    }
  const int half = cfg.n_rot / 2;
  const std::vector<float>* factors = nullptr;
  if (cfg.freq_factors) {
    factors = &as_cl(*cfg.freq_factors).host;
    PAGELLM_CHECK(static_cast<int>(factors->size()) >= half, "rope factors '{}' have {} values, need {}",
                  cfg.freq_factors->name, factors->size(), half);
  }
  RopeTable t;
  t.cfg = cfg;
  std::vector<double> freqs;
  t.mscale = static_cast<float>(rope_pair_frequencies(cfg, factors ? factors->data() : nullptr, freqs));
  t.host.resize(static_cast<size_t>(std::max(half, 1)) * 2);
  for (int i = 0; i < half; ++i) {
    const float hi = static_cast<float>(freqs[i]);
    t.host[2 * i] = hi;
    t.host[2 * i + 1] = static_cast<float>(freqs[i] - hi);
  }
  t.mem = create_buffer(CL_MEM_READ_ONLY, t.host.size() * sizeof(float), nullptr, "rope table");
  cl_check(clEnqueueWriteBuffer(queue_, t.mem.get(), CL_FALSE, 0, t.host.size() * sizeof(float), t.host.data(), 0,
                                nullptr, nullptr),
           "clEnqueueWriteBuffer (rope)");
  rope_tables_.push_back(std::move(t));
  *mscale = rope_tables_.back().mscale;
  return rope_tables_.back().mem.get();
}

void OpenClBackend::rope(Buffer& x, int n_heads, int head_dim, const RopeConfig& cfg) {
  check_batch();
  PAGELLM_CHECK(cfg.n_rot > 0 && cfg.n_rot % 2 == 0 && cfg.n_rot <= head_dim, "rope: n_rot {} with head_dim {}",
                cfg.n_rot, head_dim);
  need(x, n_tokens_ * n_heads * head_dim, "rope");
  if (n_tokens_ == 0) return;
  float mscale = 1.0f;
  cl_mem table = rope_table(cfg, &mscale);
  const size_t global[3] = {static_cast<size_t>(cfg.n_rot / 2), static_cast<size_t>(n_heads),
                            static_cast<size_t>(n_tokens_)};
  launch(kOther, kernel("rope"), 3, global, nullptr, mem_of(x), static_cast<cl_int>(n_heads), static_cast<cl_int>(head_dim),
         static_cast<cl_int>(cfg.n_rot), static_cast<cl_int>(cfg.neox), table, mscale, meta_.get(),
         static_cast<cl_int>(pos_off_));
}

void OpenClBackend::store_kv(int layer, Buffer& k, const Buffer& v, const RopeConfig* k_rope) {
  check_batch();
  PAGELLM_CHECK(layer >= 0 && layer < static_cast<int>(k_cache_.size()), "store_kv: layer {} without a KV cache",
                layer);
  const int D = kv_.head_dim;
  PAGELLM_CHECK(D % 2 == 0, "head_dim {} is odd", D);
  need(k, n_tokens_ * kv_.n_kv_heads * D, "store_kv k");
  need(v, n_tokens_ * kv_.n_kv_heads * D, "store_kv v");
  if (k_rope)
    PAGELLM_CHECK(k_rope->n_rot > 0 && k_rope->n_rot % 2 == 0 && k_rope->n_rot <= D, "rope: n_rot {} with head_dim {}",
                  k_rope->n_rot, D);
  if (n_tokens_ == 0) return;
  float mscale = 1.0f;
  cl_mem table = k_rope ? rope_table(*k_rope, &mscale) : dummy_.get();
  const size_t global[3] = {static_cast<size_t>(D / 2), static_cast<size_t>(kv_.n_kv_heads),
                            static_cast<size_t>(n_tokens_)};
  launch(kAttention, kernel("store_kv"), 3, global, nullptr, mem_of(k), mem_of(v), k_cache_[layer].get(), v_cache_[layer].get(),
         static_cast<cl_int>(kv_.dtype == DType::F16), static_cast<cl_int>(kv_.n_kv_heads),
         static_cast<cl_int>(kv_.block_size), static_cast<cl_int>(D), meta_.get(), static_cast<cl_int>(slot_off_),
         static_cast<cl_int>(pos_off_), static_cast<cl_int>(k_rope ? k_rope->n_rot : 0),
         static_cast<cl_int>(k_rope && k_rope->neox), table, mscale);
}

void OpenClBackend::attention(int layer, const Buffer& q, Buffer& out, const AttentionConfig& cfg) {
  check_batch();
  PAGELLM_CHECK(cfg.sinks == nullptr, "the opencl backend does not support attention sinks (use --device cpu)");
  PAGELLM_CHECK(layer >= 0 && layer < static_cast<int>(k_cache_.size()), "attention: layer {} without a KV cache",
                layer);
  PAGELLM_CHECK(cfg.n_head_kv > 0 && cfg.n_head % cfg.n_head_kv == 0 && cfg.n_head_kv == kv_.n_kv_heads &&
                    cfg.head_dim == kv_.head_dim,
                "attention shape does not match the KV cache");
  const int D = cfg.head_dim, G = cfg.n_head / cfg.n_head_kv;
  PAGELLM_CHECK(D > 0 && D <= kAttnMaxHeadDim, "OpenCL attention needs head_dim up to {}, not {}", kAttnMaxHeadDim,
                D);
  const int64_t q_values = n_tokens_ * cfg.n_head * D;
  need(q, q_values, "attention q");
  need(out, q_values, "attention out");
  if (n_tokens_ == 0) return;

  // Rows of a work-group: heads of one KV head times tokens of one tile.
  const int heads_per_wg = std::min(G, kAttnRows);
  const int head_splits = (G + heads_per_wg - 1) / heads_per_wg;
  int ti = 0;
  while (ti < 3 && (2 << ti) * heads_per_wg <= kAttnRows) ++ti;
  const int n_tiles = n_tiles_[ti];
  if (n_tiles == 0) return;

  // Too few work-groups for the device (decode of a few sequences): split
  // each one's keys, at least 256 per split, and merge afterwards.
  const int64_t groups = static_cast<int64_t>(n_tiles) * cfg.n_head_kv * head_splits;
  const int64_t want = 4 * static_cast<int64_t>(compute_units_);
  int64_t span = max_span_;
  if (cfg.sliding_window > 0) span = std::min<int64_t>(span, cfg.sliding_window + (1 << ti));
  int n_split = 1;
  if (groups < want) n_split = static_cast<int>(std::clamp<int64_t>(std::min((want + groups - 1) / groups, span / 256), 1, 64));
  const int64_t part_rows = n_tokens_ * cfg.n_head;
  cl_mem part = dummy_.get();
  if (n_split > 1) {
    const size_t bytes = static_cast<size_t>(n_split) * part_rows * (2 + D) * sizeof(float);
    if (bytes > attn_part_bytes_) {
      attn_part_bytes_ = std::max(bytes, attn_part_bytes_ * 2);
      attn_part_ = create_buffer(CL_MEM_READ_WRITE, attn_part_bytes_, nullptr, "attention partials");
    }
    part = attn_part_.get();
  }

  const size_t qs_bytes = sizeof(float) * kAttnRows * D, kv_bytes = sizeof(float) * kAttnChunk * (D + 1),
               sc_bytes = sizeof(float) * kAttnRows * kAttnChunk;
  PAGELLM_CHECK(qs_bytes + kv_bytes + sc_bytes <= local_mem_, "attention with head_dim {} needs {} bytes of local memory, the device has {}", D,
                qs_bytes + kv_bytes + sc_bytes, local_mem_);
  const size_t global[3] = {static_cast<size_t>(n_tiles) * kAttnGroup,
                            static_cast<size_t>(cfg.n_head_kv) * head_splits, static_cast<size_t>(n_split)};
  const size_t local[3] = {kAttnGroup, 1, 1};
  launch(kAttention, kernel("attention"), 3, global, local, mem_of(q), mem_of(out), k_cache_[layer].get(), v_cache_[layer].get(),
         static_cast<cl_int>(kv_.dtype == DType::F16), meta_.get(), static_cast<cl_int>(tiles_off_[ti]),
         static_cast<cl_int>(seqs_off_), static_cast<cl_int>(bt_off_), static_cast<cl_int>(cfg.n_head),
         static_cast<cl_int>(G), static_cast<cl_int>(heads_per_wg), static_cast<cl_int>(head_splits),
         static_cast<cl_int>(cfg.n_head_kv), static_cast<cl_int>(D), static_cast<cl_int>(kv_.block_size), cfg.scale,
         static_cast<cl_int>(cfg.sliding_window), cfg.softcap, static_cast<cl_int>(n_split),
         static_cast<cl_int>(part_rows), part, LocalBytes{qs_bytes}, LocalBytes{kv_bytes}, LocalBytes{sc_bytes});
  if (n_split > 1) {
    const size_t mg[2] = {static_cast<size_t>(D), static_cast<size_t>(part_rows)};
    launch(kAttention, kernel("attention_merge"), 2, mg, nullptr, part, static_cast<cl_int>(n_split),
           static_cast<cl_int>(part_rows), static_cast<cl_int>(D), mem_of(out));
  }
}

void OpenClBackend::glu(const Buffer& gate, const Buffer& up, int64_t n, Activation act, Buffer& out) {
  need(gate, n, "glu gate");
  need(up, n, "glu up");
  need(out, n, "glu out");
  PAGELLM_CHECK(n < INT32_MAX, "glu of {} values", n);
  if (n == 0) return;
  const size_t global = round_up(static_cast<size_t>(n), 256);
  launch(kOther, kernel("glu"), 1, &global, nullptr, mem_of(gate), mem_of(up), static_cast<cl_int>(n),
         static_cast<cl_int>(act), mem_of(out));
}

void OpenClBackend::add(Buffer& y, const Buffer& x, int64_t n) {
  need(y, n, "add");
  need(x, n, "add");
  PAGELLM_CHECK(n < INT32_MAX, "add of {} values", n);
  if (n == 0) return;
  const size_t global = round_up(static_cast<size_t>(n), 256);
  launch(kOther, kernel("add"), 1, &global, nullptr, mem_of(y), mem_of(x), static_cast<cl_int>(n));
}

// Runs of consecutive rows (all of a decode step's last tokens) are one copy
// each: no kernel, no upload of the row list.
void OpenClBackend::gather_rows(const Buffer& x, int64_t dim, const std::vector<int32_t>& rows, Buffer& out) {
  need(out, static_cast<int64_t>(rows.size()) * dim, "gather_rows out");
  const int64_t x_rows = dim > 0 ? static_cast<int64_t>(x.size()) / dim : 0;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (size_t i = 0; i < rows.size();) {
    PAGELLM_CHECK(rows[i] >= 0 && rows[i] < x_rows, "gather_rows: row {} of {}", rows[i], x_rows);
    size_t e = i + 1;
    while (e < rows.size() && rows[e] == rows[e - 1] + 1 && rows[e] < x_rows) ++e;
    if (row_bytes)
      cl_check(clEnqueueCopyBuffer(queue_, mem_of(x), mem_of(out), rows[i] * row_bytes, i * row_bytes,
                                   (e - i) * row_bytes, 0, nullptr, nullptr),
               "clEnqueueCopyBuffer (gather_rows)");
    i = e;
  }
}

void OpenClBackend::collect_profile() {
  for (auto& [c, e] : timed_) {
    cl_ulong t0 = 0, t1 = 0;
    if (clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof t0, &t0, nullptr) == CL_SUCCESS &&
        clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof t1, &t1, nullptr) == CL_SUCCESS && t1 > t0)
      category_ns_[c] += static_cast<double>(t1 - t0);
    clReleaseEvent(e);
  }
  timed_.clear();
}

// Profiling is a property of the queue: switch to a new one (buffers belong
// to the context, so nothing else changes).
void OpenClBackend::set_profiling(bool on) {
  synchronize();
  for (double& c : category_ns_) c = 0;
  if (on == profiling_) return;
  cl_int err = CL_SUCCESS;
  cl_command_queue q = clCreateCommandQueue(context_, device_, on ? CL_QUEUE_PROFILING_ENABLE : 0, &err);
  cl_check(err, "clCreateCommandQueue");
  clReleaseCommandQueue(queue_);
  queue_ = q;
  profiling_ = on;
}

std::string OpenClBackend::profile_report() const {
  const double total = category_ns_[kMatmul] + category_ns_[kAttention] + category_ns_[kOther];
  if (total <= 0) return "no profile (run with profiling on)";
  auto pct = [&](int c) { return 100.0 * category_ns_[c] / total; };
  return fmt::format("kernels: matmul {:.1f} ms ({:.0f}%), attention {:.1f} ms ({:.0f}%), other {:.1f} ms ({:.0f}%)",
                     category_ns_[kMatmul] / 1e6, pct(kMatmul), category_ns_[kAttention] / 1e6, pct(kAttention),
                     category_ns_[kOther] / 1e6, pct(kOther));
}

}  // namespace
}  // namespace opencl

std::unique_ptr<Backend> make_opencl_backend(int index, const BackendOptions& options) {
  check_backend_options(options, "opencl", {"platform"});
  const int platform = backend_option_int(options, "opencl", "platform", 0);
  return std::make_unique<opencl::OpenClBackend>(platform, index);
}

}  // namespace pagellm
