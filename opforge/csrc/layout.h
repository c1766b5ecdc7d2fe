// Layout handling shared by the CPU and CUDA kernels: both walk dense buffers with one flat index.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

namespace opforge {

// `t` with exactly `like`'s sizes and strides: itself when it already has them, else a copy (which also
// materializes a broadcast). The flat kernels below can then walk both buffers with one index.
inline at::Tensor with_layout_of(const at::Tensor& t, const at::Tensor& like) {
  if (t.sizes() == like.sizes() && t.strides() == like.strides()) {
    return t;
  }
  return at::empty_like(like).copy_(t);
}

// Output for an elementwise op on `x`: keeps `x`'s strides when it is dense (a transposed or channels_last input
// gives a like-strided output, as ATen's own pointwise ops do), else the suggested memory format's contiguous
// layout. The fake (meta) implementations return torch.empty_like(x), which follows the same rule.
inline at::Tensor elementwise_output_like(const at::Tensor& x) {
  return at::empty_like(x);
}

}  // namespace opforge
