#include "backend/backend.h"

#include <string>

#include "core/error.h"

namespace pagellm {

// Defaults of the optional parts of the Backend interface.
void Backend::allocate_swap_space(int) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_out(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_in(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }

TensorData expert_slice(const TensorData& t, int64_t e) {
  PAGELLM_CHECK(t.shape.size() == 3, "tensor '{}' is not a stack of experts (it has {} dimensions)", t.name,
                t.shape.size());
  PAGELLM_CHECK(e >= 0 && e < t.shape[2], "expert {} of tensor '{}' (it has {})", e, t.name, t.shape[2]);
  TensorData s;
  s.name = t.name + "[" + std::to_string(e) + "]";
  s.type = t.type;
  s.shape = {t.shape[0], t.shape[1]};
  const size_t bytes = dtype_row_bytes(t.type, t.shape[0]) * static_cast<size_t>(t.shape[1]);
  s.data = static_cast<const uint8_t*>(t.data) + bytes * static_cast<size_t>(e);
  return s;
}

namespace {
[[noreturn]] void no_moe(const Backend& b) {
  fail("the {} backend does not run Mixture-of-Experts layers (use --device cpu)", b.name());
}
}  // namespace

void Backend::moe_route(const Buffer&, int64_t, const MoeRouting&, Buffer&, Buffer&) { no_moe(*this); }
void Backend::matmul_experts(const std::vector<const Weight*>&, const Buffer&, int64_t, int, bool, const Buffer&,
                             Buffer&) {
  no_moe(*this);
}
void Backend::moe_combine(const Buffer&, const Buffer&, int64_t, int, int64_t, Buffer&) { no_moe(*this); }
void Backend::scale_rows_sigmoid(Buffer&, const Buffer&, int64_t, int64_t) { no_moe(*this); }


}  // namespace pagellm
