// Layout handling shared by the CPU and CUDA kernels: both walk dense buffers with one flat index.
#pragma once

#include <ATen/MemoryOverlap.h>
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

// Writes an elementwise function of `x` into `out` (same shape; `out` may be `x` itself: the in-place ops), where
// `compute(dst, src)` writes fn(src) into the dense tensor `dst` whose layout `src` shares. A dense `out` is written
// directly (an `x` of another layout is copied into out's first); a strided or sliced one gets the values through
// a dense temporary, computed in place there and copied back. An `out` whose elements overlap each other (an
// expanded tensor), or one that overlaps `x` other than exactly, is refused with ATen's own error, as ATen's
// in-place and out= ops do: which of several results would land in a shared element is unspecified.
// compute(t, t) must be safe: each element is read, by the thread that writes it, before it is written.
template <typename Compute>
at::Tensor& elementwise_into(at::Tensor& out, const at::Tensor& x, const Compute& compute) {
  at::assert_no_internal_overlap(out);
  at::assert_no_partial_overlap(out, x);
  if (out.is_non_overlapping_and_dense()) {
    compute(out, with_layout_of(x, out));
  } else {
    at::Tensor dense = elementwise_output_like(out).copy_(x);
    compute(dense, dense);
    out.copy_(dense);
  }
  return out;
}

}  // namespace opforge
