// Shared CPU machinery for opforge's elementwise kernels: layout handling, a vectorized parallel loop that computes
// low-precision dtypes in float, and a fast float sigmoid.
//
// Only the ATen headers that are needed are included: <torch/extension.h> costs ~20 s of compile time per file.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty_like.h>

#include <cstdint>
#include <tuple>

namespace opforge::cpu {

using at::vec::Vectorized;

// Work per task below which at::parallel_for stays on one thread. ATen's own elementwise loops use 32768
// (at::internal::GRAIN_SIZE); leaky_swish at 2^24 float32 on 2 threads ran within noise of it at 16384 and 65536.
constexpr int64_t kGrainSize = 32768;

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

// Reduced-precision dtypes are computed in float; float and double in themselves.
template <typename scalar_t>
using opmath_t = at::opmath_type<scalar_t>;

namespace detail {

template <typename scalar_t, typename VecFn, size_t... I, typename... In>
inline void vector_step(scalar_t* out, int64_t i, int64_t count, const VecFn& fn, std::index_sequence<I...>,
                        const In*... in) {
  using Vec = Vectorized<scalar_t>;
  if constexpr (std::is_same_v<opmath_t<scalar_t>, scalar_t>) {
    fn(Vec::loadu(in + i, count)...).store(out + i, count);
  } else {
    // One Vectorized<Half/BFloat16> holds two Vectorized<float>: compute each half in float, round once at the end.
    auto halves = std::make_tuple(at::vec::convert_to_float<scalar_t>(Vec::loadu(in + i, count))...);
    auto lo = fn(std::get<0>(std::get<I>(halves))...);
    auto hi = fn(std::get<1>(std::get<I>(halves))...);
    at::vec::convert_from_float<scalar_t>(lo, hi).store(out + i, count);
  }
}

}  // namespace detail

// out[i] = fn(in0[i], in1[i], ...) over `n` elements of dense buffers that share one layout.
// `fn` takes and returns Vectorized<opmath_t<scalar_t>>. The tail goes through the same vector code with a partial
// load, so every element is computed by one formula and the result does not depend on how the range was split
// across threads (bitwise-identical results for any thread count).
template <typename scalar_t, typename VecFn, typename... In>
void elementwise_kernel(scalar_t* out, int64_t n, const VecFn& fn, const In*... in) {
  static_assert((std::is_same_v<In, scalar_t> && ...), "all inputs share the output's dtype");
  constexpr int64_t step = Vectorized<scalar_t>::size();
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + step <= end; i += step) {
      detail::vector_step(out, i, step, fn, std::index_sequence_for<In...>{}, in...);
    }
    if (i < end) {
      detail::vector_step(out, i, end - i, fn, std::index_sequence_for<In...>{}, in...);
    }
  });
}

// 1 / (1 + exp(-x)) for float, with exp computed by Cody-Waite range reduction and the Cephes degree-6
// polynomial: about 2 ulp over the clamped range, and branch-free so it vectorizes on any ISA (std::exp does not
// vectorize here, and this CPU has no AVX2 for ATen's own vector exp).
inline Vectorized<float> sigmoid(const Vectorized<float>& x) {
  using V = Vectorized<float>;
  // exp(t) for t in [kMinArg, kMaxArg] keeps 2^n a normal float; beyond them sigmoid is 0 or 1 to within a float.
  constexpr float kMaxArg = 88.3f, kMinArg = -87.3f;
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds to the nearest integer in the float's low mantissa bits.
  constexpr float kRoundMagic = 12582912.0f;
  const V t = at::vec::clamp(V(0.0f) - x, V(kMinArg), V(kMaxArg));
  const V n = at::vec::fmadd(t, V(kLog2e), V(kRoundMagic)) - V(kRoundMagic);
  V r = at::vec::fmadd(n, V(-kLn2Hi), t);
  r = at::vec::fmadd(n, V(-kLn2Lo), r);
  V p = V(1.9875691500e-4f);
  p = at::vec::fmadd(p, r, V(1.3981999507e-3f));
  p = at::vec::fmadd(p, r, V(8.3334519073e-3f));
  p = at::vec::fmadd(p, r, V(4.1665795894e-2f));
  p = at::vec::fmadd(p, r, V(1.6666665459e-1f));
  p = at::vec::fmadd(p, r, V(5.0000001201e-1f));
  const V expr = at::vec::fmadd(p, r * r, r + V(1.0f));
  const auto bits = (at::vec::convert_to_int_of_same_size(n) + Vectorized<int32_t>(127)) << Vectorized<int32_t>(23);
  const V scale = at::vec::cast<float>(bits);
  const V e = expr * scale;
  // clamp() dropped a NaN input's payload into t; re-inject it so NaN propagates like the reference.
  return V::blendv(V(1.0f) / (V(1.0f) + e), x, x != x);
}

// Double is computed exactly as the float64 reference does (std::exp), so gradcheck sees no float32 rounding.
inline Vectorized<double> sigmoid(const Vectorized<double>& x) {
  using V = Vectorized<double>;
  return V(1.0) / (V(1.0) + (V(0.0) - x).exp());
}

}  // namespace opforge::cpu
