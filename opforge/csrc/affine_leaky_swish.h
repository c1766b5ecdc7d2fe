// Argument checks and the layout plan of opforge::affine_leaky_swish, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <utility>

#include "grad_checks.h"
#include "message.h"

namespace opforge::affine_leaky_swish {

inline void check_inputs(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, const char* op) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be float32, float64, float16 or bfloat16, got ",
              x.scalar_type(), ". Cast it first, e.g. x.float().");
  TORCH_CHECK(x.dim() == 4, op, ": x must be 4-D (N, C, H, W), got ", number_text(x.dim()), "-D shape ",
              shape_text(x.sizes()),
              ". Add the missing dimensions, e.g. x[..., None, None] for (N, C).");
  for (const auto& [name, p] : {std::pair<const char*, const at::Tensor&>{"scale", scale}, {"shift", shift}}) {
    TORCH_CHECK(p.dim() == 1 && p.size(0) == x.size(1), op, ": ", name, " must be 1-D with x's ",
                number_text(x.size(1)), " channels, got shape ", shape_text(p.sizes()),
                ". Give one value per channel (x.shape[1]).");
    TORCH_CHECK(p.scalar_type() == x.scalar_type(), op, ": ", name, " must have x's dtype ", x.scalar_type(),
                ", got ", p.scalar_type(), ". Cast it, e.g. ", name, ".to(x.dtype).");
    TORCH_CHECK(p.device() == x.device(), op, ": ", name, " must be on x's device ", x.device(), ", got ", p.device(),
                ". Move it with .to(x.device).");
  }
}

inline void check_backward_args(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
                                const at::Tensor& shift) {
  constexpr const char* op = "opforge::affine_leaky_swish_backward";
  check_inputs(x, scale, shift, op);
  check_grad_matches(grad, x, op);
}

// The memory format the kernels walk x in, which is also the output's: channels_last (NHWC) when x is and is not
// also contiguous, else contiguous (NCHW) when x is, else the format ATen suggests for x's strides (x is then copied
// into it). A non-empty tensor that is both (one channel, or H = W = 1) counts as contiguous; an empty one is
// contiguous whatever its strides, so there the channels_last strides (those it was made with) decide.
// opforge/ops/affine_leaky_swish.py's fakes follow the same rule, and must: opcheck compares their strides with the
// kernels'.
inline at::MemoryFormat kernel_format(const at::Tensor& x) {
  const bool nchw = x.is_contiguous();
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast) && (!nchw || x.numel() == 0)) {
    return at::MemoryFormat::ChannelsLast;
  }
  if (nchw) {
    return at::MemoryFormat::Contiguous;
  }
  return x.suggest_memory_format();
}

// x (N, C, H, W) as the kernels see it: a dense buffer of planes (NCHW: N * C planes of H * W elements, channel
// (i / hw) % c) or of rows (NHWC: N * H * W rows of C elements, channel i % c). With H * W = 1 both buffers hold
// the same elements in the same order, and the row walk is used for either.
struct Plan {
  at::MemoryFormat format;
  bool channels_inner;  // the NHWC walk
  int64_t n, c, hw;

  int64_t numel() const {
    return n * c * hw;
  }
  // Contiguous copies of the kernels' operands in this plan's format (no copy when they already are).
  at::Tensor dense(const at::Tensor& t) const {
    return t.contiguous(format);
  }
  at::Tensor empty_like_x(const at::Tensor& x) const {
    return at::empty(x.sizes(), x.options().memory_format(format));
  }
};

inline Plan plan_for(const at::Tensor& x) {
  const at::MemoryFormat format = kernel_format(x);
  const int64_t hw = x.size(2) * x.size(3);
  return Plan{format, format == at::MemoryFormat::ChannelsLast || hw == 1, x.size(0), x.size(1), hw};
}

}  // namespace opforge::affine_leaky_swish
