// Shared CPU machinery for opforge's elementwise kernels: layout handling, a vectorized parallel loop that computes
// low-precision dtypes in float, and a fast float sigmoid.
//
// Only the ATen headers that are needed are included: <torch/extension.h> costs ~20 s of compile time per file.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/zeros.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "layout.h"

namespace opforge::cpu {

using opforge::elementwise_output_like;
using opforge::Spanned;
using opforge::spanned_if;
using opforge::with_layout_of;

// Work per task below which at::parallel_for stays on one thread: ATen's own elementwise grain
// (at::internal::GRAIN_SIZE). Small tensors are not worth waking a thread for; large ones split per thread anyway.
constexpr int64_t kGrainSize = 32768;

// Reduced-precision dtypes are computed in float; float and double in themselves.
template <typename scalar_t>
using opmath_t = at::opmath_type<scalar_t>;

// Low-precision elements are widened to float in blocks of this many, computed, and rounded back once.
// 256 floats (1 KiB per input) stay in L1 with three inputs and the output.
constexpr int64_t kWidenBlock = 256;

template <typename acc_t, typename Fn, size_t N, size_t... I>
inline void widened_step(acc_t* result, int64_t len, const Fn& fn, acc_t (&wide)[N][kWidenBlock],
                         std::index_sequence<I...>) {
  for (int64_t j = 0; j < len; ++j) {
    result[j] = fn(wide[I][j]...);
  }
}

// out[i] = fn(in0[i], in1[i], ...) over `n` elements of dense buffers that share one layout, in parallel.
//
// `fn` is a branch-free scalar function of opmath_t values. Written that way GCC vectorizes the float loop for
// whatever ISA -march=native finds. The same math through at::vec::Vectorized was slower: an extension gets no
// CPU_CAPABILITY define, so Vectorized falls back to its generic array code, whose shifts and blends do not
// vectorize (docs/measurements/kernel-notes.md, "CPU elementwise loop").
// at::vec::convert widens and narrows Half/BFloat16. Every element goes through the same formula, so results do
// not depend on how the range is split across threads.
template <typename scalar_t, typename Fn, typename... In>
void elementwise_kernel(scalar_t* out, int64_t n, const Fn& fn, const In*... in) {
  static_assert((std::is_same_v<In, scalar_t> && ...), "all inputs share the output's dtype");
  using acc_t = opmath_t<scalar_t>;
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      for (int64_t i = begin; i < end; ++i) {
        out[i] = fn(in[i]...);
      }
    } else {
      acc_t wide[sizeof...(In)][kWidenBlock];
      acc_t result[kWidenBlock];
      for (int64_t block = begin; block < end; block += kWidenBlock) {
        const int64_t len = std::min(kWidenBlock, end - block);
        int k = 0;
        ((at::vec::convert(in + block, wide[k++], len)), ...);
        widened_step(result, len, fn, wide, std::index_sequence_for<In...>{});
        at::vec::convert(result, out + block, len);
      }
    }
  });
}

// An input repeated over the output's leading dimensions is read in place (layout.h's Spanned), one call of
// elementwise_kernel per output row. Rows of fewer than kMinBroadcastRow elements are not worth a call each: such
// inputs are copied.
constexpr int64_t kMinBroadcastRow = 16;

template <typename scalar_t>
Spanned<scalar_t> spanned(const at::Tensor& t, const at::Tensor& out) {
  return spanned_if<scalar_t>(t, out, [](int64_t span) { return span >= kMinBroadcastRow; });
}

// out[i] = fn(in0[i], in1[i], ...) over a contiguous output of `n` elements, each input read in place through its
// span (see Spanned): elementwise_kernel over each run of `inner` output elements, in parallel over the runs.
template <typename scalar_t, typename Fn, typename... S>
void spanned_kernel(scalar_t* out, int64_t n, const Fn& fn, const S&... in) {
  const int64_t inner = std::min({in.span...});
  if (inner == n) {
    elementwise_kernel<scalar_t>(out, n, fn, in.data...);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainSize / inner);
  at::parallel_for(0, n / inner, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      elementwise_kernel<scalar_t>(out + r * inner, inner, fn, (in.data + (r * inner) % in.span)...);
    }
  });
}

// `n` elements as acc_t: the elements themselves when scalar_t is acc_t, else widened into `scratch`.
template <typename scalar_t, typename acc_t>
const acc_t* widened(const scalar_t* in, int64_t n, acc_t* scratch) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    return in;
  } else {
    at::vec::convert(in, scratch, n);
    return scratch;
  }
}

// Rows per task of a row-wise loop over rows of `row_len` elements: at least kGrainSize elements per task.
inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(1, row_len));
}

// Column sums over many rows that come out the same on 1 thread as on 64: the rows go into at most kMaxChunks fixed
// chunks (each at least kGrainSize elements and kMinChunkRows rows), each chunk adds its rows, in row order, into a
// zeroed row of double partial sums, and sum_chunks adds the chunks in chunk order. The chunks, not the threads, fix
// the order of the additions. 128 chunks keep 2-64 threads busy.
constexpr int64_t kMaxChunks = 128;
// A chunk's partial row (8 bytes per column) is zeroed, read and written for each of its rows, and read once more at
// the end: over few rows it costs more than the rows themselves. 16 rows: far faster than 1, within a few percent of
// 32 with twice the chunks (docs/measurements/kernel-notes.md, "kMinChunkRows").
constexpr int64_t kMinChunkRows = 16;

// Runs add_rows(first, last, partial) for each chunk [first, last) of `rows` rows of `n` columns, in parallel;
// returns the chunks' partial sums, [chunks, n] doubles.
template <typename AddRows>
at::Tensor chunk_column_sums(int64_t rows, int64_t n, const AddRows& add_rows) {
  const int64_t per_chunk = std::max({row_grain(n), (rows + kMaxChunks - 1) / kMaxChunks, kMinChunkRows});
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  at::Tensor partials = at::zeros({chunks, n}, at::TensorOptions().dtype(at::kDouble));
  double* p = partials.data_ptr<double>();
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      add_rows(c * per_chunk, std::min(rows, (c + 1) * per_chunk), p + c * n);
    }
  });
  return partials;
}

// out[j] = sum over chunks c, in order, of partials[c][j], rounded once to scalar_t.
template <typename scalar_t>
void sum_chunks(const at::Tensor& partials, scalar_t* out) {
  const int64_t chunks = partials.size(0), n = partials.size(1);
  const double* partial = partials.const_data_ptr<double>();
  at::parallel_for(0, n, kGrainSize / std::max<int64_t>(1, chunks), [&](int64_t begin, int64_t end) {
    std::vector<double> sum(partial + begin, partial + end);
    for (int64_t c = 1; c < chunks; ++c) {
      const double* p = partial + c * n;
      for (int64_t j = begin; j < end; ++j) {
        sum[j - begin] += p[j];
      }
    }
    for (int64_t j = begin; j < end; ++j) {
      out[j] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(sum[j - begin]));
    }
  });
}

// Two results of one elementwise function, e.g. the gradients of both inputs of a backward.
template <typename T>
struct Two {
  T first;
  T second;
};

template <typename acc_t, typename Fn, size_t N, size_t... I>
inline void widened_step2(acc_t* result0, acc_t* result1, int64_t len, const Fn& fn,
                          acc_t (&wide)[N][kWidenBlock], std::index_sequence<I...>) {
  for (int64_t j = 0; j < len; ++j) {
    const Two<acc_t> r = fn(wide[I][j]...);
    result0[j] = r.first;
    result1[j] = r.second;
  }
}

// (out0[i], out1[i]) = fn(in0[i], in1[i], ...): elementwise_kernel for a function with two results (a Two), both
// written in the same pass over the inputs. Same loop structure, so the float loop vectorizes the same way.
template <typename scalar_t, typename Fn, typename... In>
void elementwise_kernel2(scalar_t* out0, scalar_t* out1, int64_t n, const Fn& fn, const In*... in) {
  static_assert((std::is_same_v<In, scalar_t> && ...), "all inputs share the outputs' dtype");
  using acc_t = opmath_t<scalar_t>;
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<acc_t, scalar_t>) {
      for (int64_t i = begin; i < end; ++i) {
        const Two<acc_t> r = fn(in[i]...);
        out0[i] = r.first;
        out1[i] = r.second;
      }
    } else {
      acc_t wide[sizeof...(In)][kWidenBlock];
      acc_t result0[kWidenBlock];
      acc_t result1[kWidenBlock];
      for (int64_t block = begin; block < end; block += kWidenBlock) {
        const int64_t len = std::min(kWidenBlock, end - block);
        int k = 0;
        ((at::vec::convert(in + block, wide[k++], len)), ...);
        widened_step2(result0, result1, len, fn, wide, std::index_sequence_for<In...>{});
        at::vec::convert(result0, out0 + block, len);
        at::vec::convert(result1, out1 + block, len);
      }
    }
  });
}

// sigmoid(x) = 1 / (1 + exp(-x)) for float, with exp by Cody-Waite range reduction and the Cephes degree-6
// polynomial (about 2 ulp). Branch-free (ternaries become blends), so the loop around it vectorizes; std::exp
// would be a libm call per element. Always inlined: a call in the loop stops it vectorizing, and GCC's heuristics
// stopped inlining it once leaky_swish's forward served three ops (docs/measurements/kernel-notes.md, "CPU sigmoid").
C10_ALWAYS_INLINE float sigmoid(float x) {
  // exp(t) for t in [kMinArg, kMaxArg] keeps 2^n a normal float; beyond them sigmoid is 0 or 1 to within a float.
  constexpr float kMaxArg = 88.3f, kMinArg = -87.3f;
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 leaves round(t * log2(e)) in the low mantissa bits, readable without a float-to-int
  // conversion (undefined for NaN).
  constexpr float kRoundMagic = 12582912.0f;
  constexpr uint32_t kRoundMagicBits = 0x4B400000u;
  float t = -x;
  t = t > kMaxArg ? kMaxArg : t;
  t = t < kMinArg ? kMinArg : t;  // NaN fails both tests and stays NaN
  const float shifted = t * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  float r = n * -kLn2Hi + t;
  r = n * -kLn2Lo + r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * (r * r) + (r + 1.0f);
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  // Unsigned, so the garbage exponent of a NaN wraps instead of overflowing.
  const uint32_t scale_bits = (bits - kRoundMagicBits + 127u) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  // Past kMaxArg the true value is below float's normal range: return 0, so that -inf * sigmoid(-inf) is NaN
  // exactly as in the float64 reference (and in the CUDA kernel), not -inf * tiny.
  return -x > kMaxArg ? 0.0f : 1.0f / (1.0f + exp_r * scale);
}

// Double is computed exactly as the float64 reference does (std::exp), so gradcheck sees no float32 rounding.
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace opforge::cpu
