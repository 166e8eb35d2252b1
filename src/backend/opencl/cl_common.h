// OpenCL plumbing shared by the backend's files: the 1.2 API only (so any
// driver, PoCL included, can run us), error checks that throw pagellm::Error,
// and a reference-counted cl_mem handle.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <string>
#include <utility>

namespace pagellm::opencl {

const char* cl_error_name(cl_int code);

// Throws Error("OpenCL <what> failed: <code name>") when code != CL_SUCCESS.
void cl_check(cl_int code, const char* what);

// Owns one reference to a cl_mem. Releasing a buffer that queued kernels
// still use is safe: OpenCL frees it once those commands have finished.
class ClMem {
 public:
  ClMem() = default;
  explicit ClMem(cl_mem m) : m_(m) {}
  ~ClMem() { reset(); }
  ClMem(ClMem&& o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
  ClMem& operator=(ClMem&& o) noexcept {
    if (this != &o) {
      reset();
      m_ = std::exchange(o.m_, nullptr);
    }
    return *this;
  }
  ClMem(const ClMem&) = delete;
  ClMem& operator=(const ClMem&) = delete;
  void reset() {
    if (m_) clReleaseMemObject(m_);
    m_ = nullptr;
  }
  cl_mem get() const { return m_; }
  explicit operator bool() const { return m_ != nullptr; }

 private:
  cl_mem m_ = nullptr;
};

}  // namespace pagellm::opencl
