// Argument checks and the row geometry of opforge::rms_norm, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>

#include <cstdint>

#include "grad_checks.h"
#include "message.h"

namespace opforge::rms_norm {

inline bool is_supported_dtype(at::ScalarType t) {
  // Not at::isFloatingType: that also admits the float8 types, which the kernels do not dispatch.
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

inline void check_input(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(is_supported_dtype(x.scalar_type()), op, ": x must be float32, float64, float16 or bfloat16, got ",
              x.scalar_type(), ". Cast it first, e.g. x.float().");
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension (the last one is normalized), got a 0-d tensor. ",
              "Give it one, e.g. x.reshape(1).");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": weight must be 1-D with x.size(-1) = ",
              number_text(x.size(-1)), " elements, got shape ", shape_text(weight.sizes()),
              ". Pass one weight per element of x's last dimension.");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight must have x's dtype ", x.scalar_type(), ", got ",
              weight.scalar_type(), ". Cast one of them, e.g. weight.to(x.dtype).");
  TORCH_CHECK(weight.device() == x.device(), op, ": weight must be on x's device ", x.device(), ", got ",
              weight.device(), ". Move one of them with .to().");
}

inline void check_backward_args(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                const char* op) {
  check_input(x, weight, op);
  check_grad_matches(grad, x, op);
}

// x viewed as rows x hidden: the kernels normalize each row of a contiguous buffer.
struct Rows {
  int64_t rows;
  int64_t hidden;

  bool empty() const {
    return rows == 0 || hidden == 0;
  }
};

inline Rows rows_of(const at::Tensor& x) {
  // The product of the leading sizes, not numel / hidden: that is 0 / 0 for a hidden size of 0.
  const auto sizes = x.sizes();
  return {c10::multiply_integers(sizes.begin(), sizes.end() - 1), sizes.back()};
}

// Outputs are contiguous whatever x's layout (the fake implementations in opforge/ops/rms_norm.py say the same).
inline at::Tensor contiguous_like(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace opforge::rms_norm
