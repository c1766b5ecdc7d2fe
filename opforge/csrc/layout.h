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

// Broadcasting without copies. An input that a broadcast repeats over the output's leading dimensions only (a
// target of shape [N] against a prediction of [M, N]) can be read in place: flat output index i reads it at
// i % span, where span is the number of trailing output elements it covers. Other inputs are copied to the output's
// layout first (span: the whole output).
template <typename scalar_t>
struct Spanned {
  at::Tensor keep;  // owns `data` (the input itself, or its copy in the output's layout)
  const scalar_t* data;
  int64_t span;
};

// Whether sizes `t`, past any leading 1s, are the trailing sizes of `out`: a broadcast repeats t over out's leading
// dimensions only.
inline bool repeats_over_rows(at::IntArrayRef t, at::IntArrayRef out) {
  while (!t.empty() && t.front() == 1) {
    t = t.slice(1);
  }
  return t.size() <= out.size() && t == out.slice(out.size() - t.size());
}

// The trailing elements of `out` (contiguous) that `t` spans when it is contiguous and broadcast over out's leading
// dimensions only; 0 otherwise.
inline int64_t trailing_span(const at::Tensor& t, const at::Tensor& out) {
  const bool spans = t.is_contiguous() && out.is_contiguous() && repeats_over_rows(t.sizes(), out.sizes());
  return spans ? t.numel() : 0;
}

// `t` as a kernel writing `out` reads it: in place when it has out's layout, or when it is repeated over out's
// leading dimensions and the kernel takes that span (`reads_span(span)`); else copied to out's layout.
template <typename scalar_t, typename ReadsSpan>
Spanned<scalar_t> spanned_if(const at::Tensor& t, const at::Tensor& out, const ReadsSpan& reads_span) {
  const int64_t span = trailing_span(t, out);
  if (span == out.numel() || (span > 0 && reads_span(span))) {
    return {t, t.const_data_ptr<scalar_t>(), span};
  }
  at::Tensor full = with_layout_of(t, out);
  return {full, full.const_data_ptr<scalar_t>(), out.numel()};
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
