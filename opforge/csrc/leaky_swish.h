// Argument checks of opforge::leaky_swish and its variants, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>

#include "grad_checks.h"

namespace opforge::leaky_swish {

// `name`: the argument as the op's schema calls it (the in-place op's is `self`).
inline void check_input(const at::Tensor& x, const char* op, const char* name = "x") {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": ", name,
              " must be float32, float64, float16 or bfloat16, got ", x.scalar_type(), ". Cast it first, e.g. ", name,
              ".float().");
}

inline void check_backward_args(const at::Tensor& grad, const at::Tensor& x) {
  constexpr const char* op = "opforge::leaky_swish_backward";
  check_input(x, op);
  check_grad_matches(grad, x, op);
}

// out= as in PyTorch's native out= ops: out keeps its dtype and device (no implicit cast or move), and is resized
// to x's shape when it has another one, with ATen's warning when a non-empty out is resized (at::native::
// resize_output, which gives a resized out contiguous strides).
inline void check_out(const at::Tensor& x, const at::Tensor& out) {
  constexpr const char* op = "opforge::leaky_swish.out";
  check_input(x, op);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), op, ": out must have x's dtype ", x.scalar_type(), ", got ",
              out.scalar_type(), ". Allocate out with x's dtype, e.g. torch.empty_like(x).");
  TORCH_CHECK(out.device() == x.device(), op, ": out must be on x's device ", x.device(), ", got ", out.device(),
              ". Allocate out on x's device, e.g. torch.empty_like(x).");
}

inline void prepare_out(const at::Tensor& x, const at::Tensor& out) {
  check_out(x, out);
  at::native::resize_output(out, x.sizes());
}

}  // namespace opforge::leaky_swish
