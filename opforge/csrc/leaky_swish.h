// Argument checks of opforge::leaky_swish, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

namespace opforge::leaky_swish {

inline void check_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be float32, float64, float16 or bfloat16, got ",
              x.scalar_type(), ". Cast it first, e.g. x.float().");
}

inline void check_backward_args(const at::Tensor& grad, const at::Tensor& x) {
  constexpr const char* op = "opforge::leaky_swish_backward";
  check_input(x, op);
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": grad must have x's shape ", x.sizes(), ", got ", grad.sizes(), ".");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), op, ": grad must have x's dtype ", x.scalar_type(), ", got ",
              grad.scalar_type(), ".");
  TORCH_CHECK(grad.device() == x.device(), op, ": grad must be on x's device ", x.device(), ", got ", grad.device(),
              ".");
}

}  // namespace opforge::leaky_swish
