// CUDA kernels of opforge::rms_norm and its backward ops (schemas and the math are in ../rms_norm.cpp):
//   y = x * r * weight, r = 1 / sqrt(mean(x^2) + eps) per row; grad_x per row, grad_weight = sum over rows.
// Memory traffic: every value crosses DRAM once: the forward reads x and weight and writes y; the backward reads
// grad, x and weight and writes grad_x, recomputing each row's r from the x it holds, plus grad_weight's partial
// rows (grid x hidden sums, a few MiB), written once and read once. Rows too long to hold in registers are read
// twice, the second time mostly from L2.
//
// A row is split into units: 16-byte vectors of kVec elements (one element in the scalar fallback, taken when a
// pointer is not 16-byte aligned or the hidden size is no multiple of kVec). A group of threads owns one row at a
// time and keeps it in registers: thread t of the group owns units t, t + group size, ... (kN of them), so each of a
// warp's loads is contiguous. The row's sums are reduced by warp shuffles, then across the group's warps through
// shared memory. The weight, which every row reads, comes from L1/L2 (forward) or from a copy in shared memory
// (backward).
//
// The weight gradient sums grad * x * r over all rows, without atomics: the backward runs a capped grid of blocks
// that loop over the rows (block b takes row steps b, b + grid, ...); each thread adds its columns' terms in
// registers, the block's row groups are added in a fixed order, and each block writes one row of partial sums.
// The partial rows of each column are then added in a fixed order, in double: by the same kernel after a grid-wide
// barrier (a cooperative launch; the grid is resident anyway), or by a second kernel where a cooperative launch is
// refused. Same inputs, same grid, same bits. The grid is what fits on the GPU at once (a few blocks per SM), so
// the partial rows cost grid x hidden floats (doubles for float32: column_sums.cuh's sum_t, which the row sums and
// 1 / rms use too): 4 MiB for hidden 4096 on 132 SMs x 2 blocks, against the 96 MiB a 4096 x 4096 bfloat16 backward
// moves. sum_partial_columns and sum_partials (column_sums.cuh) add the partial rows.
//
// Rows longer than the register-resident shapes hold (bfloat16: 65536 forward, 16384 backward) go through loop
// kernels that read the row twice (the second read mostly from L2) and keep the weight gradient's partial sums in
// their global row; a few such rows (at most kSplitMaxRows) are each split across many blocks instead ("wide rows").
//
// A row whose squares overflow float (a value past ~1.8e19) is summed again in double, by its group alone, after the
// float sum came out not finite (kResumOverflow).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include "column_sums.cuh"
#include "elementwise.cuh"
#include "rms_norm.h"

namespace opforge::cuda {
namespace {

using rms_norm::check_backward_args;
using rms_norm::check_input;
using rms_norm::contiguous_like;
using rms_norm::Rows;
using rms_norm::rows_of;

constexpr int kWarp = 32;
// Columns per thread in the weight gradient's fused column sum: one, with scalar loads of the partial sums (see
// backward_kernel's end).
constexpr int kScalarSums = 1;

// How a block covers rows: kGroups groups of kGroupWarps warps, each group one row at a time, each thread kN units
// of kVec elements of it. kUnits is the longest row (in units) the shape holds. kMinBlocks is __launch_bounds__'s
// resident blocks per SM, which caps the registers per thread.
template <int kVec_, int kN_, int kGroupWarps_, int kGroups_, int kMinBlocks_ = 1>
struct RowShape {
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kVec = kVec_;
  static constexpr int kN = kN_;
  static constexpr int kGroupWarps = kGroupWarps_;
  static constexpr int kGroupThreads = kWarp * kGroupWarps_;
  static constexpr int kGroups = kGroups_;
  static constexpr int kThreads = kGroupThreads * kGroups_;
  static constexpr int kUnits = kGroupThreads * kN_;
};

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Waits for the threads of the caller's row group alone, so that a path one group takes and the others do not can
// still sum across the group's warps: named barrier 1 + group (__syncthreads is barrier 0), the block's own barrier
// where the group is the block. Each id is an immediate, reached by a branch per group: with the id in a register,
// ptxas reserves all 16 of a block's barriers, and the SM then holds fewer blocks than their registers allow (the
// float32 and bfloat16 forward at 4096 x 4096: 50% theoretical occupancy against float16's 75%, ncu on an H200).
template <class S, int kGroup = 0>
__device__ __forceinline__ void group_barrier(int group) {
  if constexpr (S::kGroups == 1) {
    __syncthreads();
  } else if constexpr (kGroup < S::kGroups) {
    if (group == kGroup) {
      asm volatile("bar.sync %0, %1;" ::"n"(1 + kGroup), "n"(S::kGroupThreads) : "memory");
    } else {
      group_barrier<S, kGroup + 1>(group);
    }
  }
}

// Sums each of v[] over the row group; every thread of the group gets the sums, with the same bits (the xor
// butterfly adds the same two values on both lanes of a pair, and zeros for absent warps change nothing). With more
// than one warp per group this waits at a barrier and uses `scratch` (kGroups * kGroupWarps * kValues values): the
// whole block's (kWholeBlock, every group calls it), where callers in a loop alternate between two buffers, so a fast
// group cannot overwrite what a slow one still reads; or the group's own (a path only some groups take, with a
// scratch of its own that a later block-wide barrier separates from its next use).
template <class S, bool kWholeBlock = true, int kValues, typename acc_t>
__device__ __forceinline__ void group_sum(acc_t (&v)[kValues], acc_t* scratch) {
#pragma unroll
  for (int k = 0; k < kValues; ++k) {
    v[k] = warp_sum(v[k]);
  }
  if constexpr (S::kGroupWarps > 1) {
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int first_warp = (threadIdx.x / S::kGroupThreads) * S::kGroupWarps;
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < kValues; ++k) {
        scratch[warp * kValues + k] = v[k];
      }
    }
    if constexpr (kWholeBlock) {
      __syncthreads();
    } else {
      group_barrier<S>(threadIdx.x / S::kGroupThreads);
    }
#pragma unroll
    for (int k = 0; k < kValues; ++k) {
      v[k] = warp_sum(lane < S::kGroupWarps ? scratch[(first_warp + lane) * kValues + k] : acc_t(0));
    }
  }
}

__device__ __forceinline__ float inverse_rms(float sum_xx, int64_t n, float eps) {
  return 1.0f / sqrtf(sum_xx / static_cast<float>(n) + eps);
}

__device__ __forceinline__ double inverse_rms(double sum_xx, int64_t n, double eps) {
  return 1.0 / sqrt(sum_xx / static_cast<double>(n) + eps);
}

// A row whose squares overflow float (a float32 or bfloat16 value past ~1.8e19 squares to inf) would come out as
// zeros, its gradient NaN, though its norm is finite. Such a row alone (its float sum of squares is not finite) is
// summed again in double by its group, its units read again from memory rather than from the registers that hold
// them, which would keep those live across the path and make the backward spill (docs/measurements/kernel-notes.md,
// "rms_norm overflow re-sum"). As in the CPU kernels (../rms_norm.cpp, row_inverse_rms). Sums already in double
// (float32's backward, float64) need no second sum, nor does float16, whose largest value squares to 4.3e9.
template <typename T, typename sum_t>
constexpr bool kResumOverflow = std::is_same_v<sum_t, float> && !std::is_same_v<T, c10::Half>;

// ------------------------------------------------------------------------------------------------------ units

// A unit of kVec elements as the kernels hold it: a 16-byte vector as four 32-bit words (uint4), or one element in
// the scalar fallback. Held as words, not as an array of 2-byte elements, which the compiler splits into one register
// per element (twice the registers; docs/measurements/kernel-notes.md, "rms_norm units as words"); from words each
// element is a shift or a mask away when it is used.
template <typename T, int kVec_>
struct Unit {
  static constexpr int kVec = kVec_;
  static constexpr bool kVector = kVec * sizeof(T) == kVectorBytes;
  static_assert(kVector || kVec == 1, "a 16-byte vector or a single element");
  using Raw = std::conditional_t<kVector, uint4, T>;
  using acc_t = opmath_t<T>;

  // Plain loads, x and grad too although each is read once: streaming ones made the backward slower
  // (docs/measurements/tuned-constants.md, "rms_norm streaming loads").
  static __device__ __forceinline__ Raw load(const T* p) {
    if constexpr (kVector) {
      return *reinterpret_cast<const uint4*>(p);
    } else {
      return *p;
    }
  }

  static __device__ __forceinline__ Raw zero() {
    if constexpr (kVector) {
      return make_uint4(0, 0, 0, 0);
    } else {
      return T(0);
    }
  }

  static __device__ __forceinline__ uint32_t word(const uint4& r, int k) {
    return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
  }

  // Element j (a constant once the caller's loop is unrolled) in the accumulation type.
  static __device__ __forceinline__ acc_t get(const Raw& r, int j) {
    if constexpr (!kVector) {
      return static_cast<acc_t>(r);
    } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
      const uint32_t w = word(r, j / 2);
      return __uint_as_float(j % 2 == 0 ? w << 16 : w & 0xffff0000u);
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      const uint32_t w = word(r, j / 2);
      return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 == 0 ? w & 0xffffu : w >> 16)));
    } else if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(word(r, j));
    } else {
      return __hiloint2double(static_cast<int>(word(r, 2 * j + 1)), static_cast<int>(word(r, 2 * j)));
    }
  }

  // Stores v[0..kVec) rounded to T (round to nearest even, NaN stays NaN).
  static __device__ __forceinline__ void store(T* p, const acc_t (&v)[kVec]) {
    if constexpr (!kVector) {
      *p = static_cast<T>(v[0]);
    } else {
      uint32_t w[4];
      if constexpr (sizeof(T) == 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w[k] = bits(v[2 * k]) | (bits(v[2 * k + 1]) << 16);
        }
      } else if constexpr (std::is_same_v<T, float>) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w[k] = __float_as_uint(v[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          w[2 * k] = static_cast<uint32_t>(__double2loint(v[k]));
          w[2 * k + 1] = static_cast<uint32_t>(__double2hiint(v[k]));
        }
      }
      // Streaming (evict-first), as elementwise.cuh's stores: every output byte is written once.
      __stcs(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
    }
  }

  // A float rounded to a 16-bit T, as its bits.
  static __device__ __forceinline__ uint32_t bits(float v) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    } else {
      return __half_as_ushort(__float2half_rn(v));
    }
  }

  // Makes the compiler forget what it knows about the bits of `r` (an empty asm that "may modify" each word), so
  // that it keeps the 16-byte unit across a block reduction instead of the widened elements it already computed
  // before it.
  static __device__ __forceinline__ void forget(Raw& r) {
    if constexpr (kVector) {
      asm volatile("" : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w));
    }
  }
};

// Adds the squares of unit xv's elements to sum, in sum_t.
template <typename U, typename sum_t>
__device__ __forceinline__ void add_squares(const typename U::Raw& xv, sum_t& sum) {
#pragma unroll
  for (int j = 0; j < U::kVec; ++j) {
    const sum_t v = U::get(xv, j);
    sum += v * v;
  }
}

// Adds a unit's terms of the backward's row sums, sum(x^2) and sum(grad * weight * x), in sum_t.
template <typename U, typename sum_t>
__device__ __forceinline__ void add_backward_terms(const typename U::Raw& gv, const typename U::Raw& xv,
                                                   const typename U::Raw& wv, sum_t (&sums)[2]) {
#pragma unroll
  for (int j = 0; j < U::kVec; ++j) {
    const sum_t xe = U::get(xv, j);
    sums[0] += xe * xe;
    sums[1] += static_cast<sum_t>(U::get(gv, j)) * static_cast<sum_t>(U::get(wv, j)) * xe;
  }
}

// -------------------------------------------------------------------------------------------------- forward

// y = (x * r) * weight for one unit.
template <typename U, typename T, typename acc_t>
__device__ __forceinline__ void forward_unit(T* yu, const typename U::Raw& xv, const typename U::Raw& wv, acc_t r) {
  acc_t out[U::kVec];
#pragma unroll
  for (int j = 0; j < U::kVec; ++j) {
    out[j] = (U::get(xv, j) * r) * U::get(wv, j);
  }
  U::store(yu, out);
}

// A row whose float sum of squares is not finite (kResumOverflow), normalized by its group (thread t of it) from
// memory: summed again in double, then y written, every unit read again. (Not inlined, with its double arithmetic
// out of the kernel, the call cost more registers and spills than inlined: ptxas, sm_90.)
template <class S, typename T>
__device__ __forceinline__ void forward_resummed_row(const T* __restrict__ xr, const T* __restrict__ w,
                                                  T* __restrict__ yr, int t, int64_t units, int64_t hidden,
                                                  double eps, double* scratch) {
  using U = Unit<T, S::kVec>;
  double sums[1] = {0.0};
#pragma unroll 1
  for (int64_t u = t; u < units; u += S::kGroupThreads) {
    add_squares<U>(U::load(xr + u * S::kVec), sums[0]);
  }
  group_sum<S, false>(sums, scratch);
  const auto r = static_cast<opmath_t<T>>(inverse_rms(sums[0], hidden, eps));
#pragma unroll 1
  for (int64_t u = t; u < units; u += S::kGroupThreads) {
    forward_unit<U>(yr + u * S::kVec, U::load(xr + u * S::kVec), U::load(w + u * S::kVec), r);
  }
}

// The float32 and bfloat16 forward's resident blocks per SM, for __launch_bounds__: the register budget the shapes
// had before the overflowing rows' path (kResumOverflow), which would otherwise cost occupancy; they fit it without
// spills but for one 8-byte value in the float32 shapes of 2 and 4 row groups (docs/measurements/kernel-notes.md,
// "rms_norm forward register budget"). No minimum for the other dtypes, which have no such path.
constexpr int kForwardRegistersFewUnits = 32;
constexpr int kForwardRegisters = 40;
template <typename T, class S>
constexpr int kForwardBlocksPerSm =
    kResumOverflow<T, opmath_t<T>>
        ? std::max(1, 65536 / ((S::kVec == 1 || S::kN <= 2 ? kForwardRegistersFewUnits : kForwardRegisters) *
                               S::kThreads))
        : 0;

// y = (x * r) * weight, one row per group. The grid covers every row step unless rows exceed the grid limit; the
// loop over steps is uniform across the block, so the group reductions' __syncthreads are too.
template <typename T, class S>
__global__ void __launch_bounds__(S::kThreads, kForwardBlocksPerSm<T, S>)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t rows, int hidden,
                   opmath_t<T> eps) {
  using acc_t = opmath_t<T>;
  using U = Unit<T, S::kVec>;
  __shared__ acc_t scratch[2][S::kGroups * S::kGroupWarps];
  __shared__ double resum_scratch[S::kGroups * S::kGroupWarps];
  const int group = threadIdx.x / S::kGroupThreads;
  const int t = threadIdx.x % S::kGroupThreads;
  const int units = hidden / S::kVec;
  int parity = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * S::kGroups; base < rows;
       base += static_cast<int64_t>(gridDim.x) * S::kGroups, parity ^= 1) {
    const int64_t row = base + group;
    const bool live = row < rows;
    const T* xr = x + row * hidden;
    typename U::Raw xv[S::kN];
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      const int u = t + i * S::kGroupThreads;
      xv[i] = live && u < units ? U::load(xr + u * S::kVec) : U::zero();
    }
    acc_t sums[1] = {acc_t(0)};
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      add_squares<U>(xv[i], sums[0]);
    }
    group_sum<S>(sums, scratch[parity]);
    if (!live) {
      continue;
    }
    T* yr = y + row * hidden;
    if constexpr (kResumOverflow<T, acc_t>) {
      if (!isfinite(sums[0])) {  // the same bits in every thread of the group: the group takes this path or not
        forward_resummed_row<S>(xr, w, yr, t, units, hidden, static_cast<double>(eps), resum_scratch);
        continue;
      }
    }
    const acc_t r = inverse_rms(sums[0], hidden, eps);
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      const int u = t + i * S::kGroupThreads;
      if (u < units) {
        U::forget(xv[i]);
        // The weight is read here, after the reduction, so that only x is held across it (the weight comes from
        // L1/L2: every row reads it).
        forward_unit<U>(yr + u * S::kVec, xv[i], U::load(w + u * S::kVec), r);
      }
    }
  }
}

// Rows longer than any register-resident shape: the block reads the row once for its sum of squares and again
// (from L2, mostly) for the output; a row whose squares overflow float once more, in between, for its sum in double.
template <typename T, class S>
__global__ void __launch_bounds__(S::kThreads)
    forward_loop_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t rows,
                        int64_t hidden, opmath_t<T> eps) {
  static_assert(S::kGroups == 1, "one row per block");
  using acc_t = opmath_t<T>;
  using U = Unit<T, S::kVec>;
  __shared__ acc_t scratch[2][S::kGroupWarps];
  __shared__ double resum_scratch[S::kGroupWarps];
  const int64_t units = hidden / S::kVec;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    const T* xr = x + row * hidden;
    acc_t sums[1] = {acc_t(0)};
    for (int64_t u = threadIdx.x; u < units; u += S::kThreads) {
      add_squares<U>(U::load(xr + u * S::kVec), sums[0]);
    }
    group_sum<S>(sums, scratch[parity]);
    T* yr = y + row * hidden;
    if constexpr (kResumOverflow<T, acc_t>) {
      if (!isfinite(sums[0])) {  // the same bits in every thread: the block takes this path or not
        forward_resummed_row<S>(xr, w, yr, threadIdx.x, units, hidden, static_cast<double>(eps), resum_scratch);
        continue;
      }
    }
    const acc_t r = inverse_rms(sums[0], hidden, eps);
    for (int64_t u = threadIdx.x; u < units; u += S::kThreads) {
      forward_unit<U>(yr + u * S::kVec, U::load(xr + u * S::kVec), U::load(w + u * S::kVec), r);
    }
  }
}

// ------------------------------------------------------------------------------------------------- backward

// Loads the units of `row` that thread t of its group owns (zeros past the row or past `rows`).
template <typename T, class S>
__device__ __forceinline__ void load_row(const T* __restrict__ g, const T* __restrict__ x, int64_t row, int64_t rows,
                                         int hidden, int t, typename Unit<T, S::kVec>::Raw (&gv)[S::kN],
                                         typename Unit<T, S::kVec>::Raw (&xv)[S::kN]) {
  using U = Unit<T, S::kVec>;
  const bool live = row < rows;
  const int units = hidden / S::kVec;
  const T* gr = g + row * hidden;
  const T* xr = x + row * hidden;
#pragma unroll
  for (int i = 0; i < S::kN; ++i) {
    const int u = t + i * S::kGroupThreads;
    const bool in = live && u < units;
    gv[i] = in ? U::load(gr + u * S::kVec) : U::zero();
    xv[i] = in ? U::load(xr + u * S::kVec) : U::zero();
  }
}

// A backward row's factors from its sums in double, sum(x^2) and sum(grad * weight * x): r = 1 / rms as the weight
// gradient's type and as the math type, and c = r^2 * sum(grad * weight * x) / n.
template <typename wide_t, typename acc_t>
__device__ __forceinline__ void factors_of_double_sums(const double (&sums)[2], int64_t hidden, double eps, wide_t& r,
                                                       acc_t& r_x, acc_t& c) {
  const double wide_r = inverse_rms(sums[0], hidden, eps);
  r = static_cast<wide_t>(wide_r);
  r_x = static_cast<acc_t>(wide_r);
  c = static_cast<acc_t>(wide_r * wide_r * sums[1] / static_cast<double>(hidden));
}

// The factors of a backward row whose float sum of squares is not finite (kResumOverflow), from its sums in double
// over the group (thread t of it), grad, x and the weight read again from memory.
template <class S, typename T, typename wide_t, typename acc_t>
__device__ __forceinline__ void resummed_backward_factors(const T* __restrict__ gr, const T* __restrict__ xr,
                                                       const T* __restrict__ w, int t, int64_t units, int64_t hidden,
                                                       double eps, double* scratch, wide_t& r, acc_t& r_x, acc_t& c) {
  using U = Unit<T, S::kVec>;
  double sums[2] = {0.0, 0.0};
#pragma unroll 1
  for (int64_t u = t; u < units; u += S::kGroupThreads) {
    add_backward_terms<U>(U::load(gr + u * S::kVec), U::load(xr + u * S::kVec), U::load(w + u * S::kVec), sums);
  }
  group_sum<S, false>(sums, scratch);
  factors_of_double_sums(sums, hidden, eps, r, r_x, c);
}

// backward_kernel's row whose float sum of squares is not finite, done by its group from memory: its factors from
// resummed_backward_factors, then grad_x written and the weight gradient's terms added to dw, grad and x read again.
// The row the group holds in registers is not read here: reading it kept it, or its widened elements, live across
// this path, and the ordinary path's bfloat16 kernels at 128 registers spilled (ptxas, sm_90).
template <class S, typename T, typename wide_t>
__device__ __forceinline__ void backward_resummed_row(const T* __restrict__ gr, const T* __restrict__ xr,
                                                      const T* __restrict__ w,
                                                      const typename Unit<T, S::kVec>::Raw* weight,
                                                      T* __restrict__ gxr, int t, int units, int hidden, double eps,
                                                      double* scratch, wide_t (&dw)[S::kN][S::kVec]) {
  using U = Unit<T, S::kVec>;
  using acc_t = opmath_t<T>;
  wide_t r;
  acc_t r_x, c;
  resummed_backward_factors<S>(gr, xr, w, t, units, hidden, eps, scratch, r, r_x, c);
#pragma unroll
  for (int i = 0; i < S::kN; ++i) {
    const int u = t + i * S::kGroupThreads;
    if (u < units) {
      const typename U::Raw gv = U::load(gr + u * S::kVec);
      const typename U::Raw xv = U::load(xr + u * S::kVec);
      const typename U::Raw wv = weight[u];
      acc_t out[S::kVec];
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) {
        const acc_t ge = U::get(gv, j);
        const acc_t xe = U::get(xv, j);
        out[j] = r_x * (ge * U::get(wv, j) - xe * c);
        dw[i][j] += static_cast<wide_t>(ge) * (static_cast<wide_t>(xe) * r);
      }
      U::store(gxr + u * S::kVec, out);
    }
  }
}

// grad_x for every row, and (when `partial` is given) one row of partial weight-gradient sums per block:
// partial[blockIdx.x][c] = sum over the block's rows, in row order per group and group order after, of
// grad * x * r. When `grad_weight` is given too (a cooperative launch only), the blocks then wait for each other
// and add the partial rows into it.
// The loop over row steps is software-pipelined: a thread issues its loads of the next step's row before it reduces
// and writes the current one, so a block always has a row of grad and x in flight. Without it each step waited a
// full DRAM round trip (docs/measurements/kernel-notes.md, "rms_norm pipelined backward").
template <typename T, class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ gx,
                    sum_t<T>* __restrict__ partial, T* __restrict__ grad_weight, int64_t rows, int hidden,
                    sum_t<T> eps) {
  using acc_t = opmath_t<T>;
  using wide_t = sum_t<T>;
  using U = Unit<T, S::kVec>;
  using Raw = typename U::Raw;
  __shared__ wide_t scratch[2][S::kGroups * S::kGroupWarps * 2];
  __shared__ double resum_scratch[S::kGroups * S::kGroupWarps * 2];
  // The weight, read from global memory once per block and from shared memory twice per row (before and after the
  // reduction), rather than held in registers across it: registers go to grad and x, the bytes in flight.
  // After the last row step the same shared memory holds the row groups' weight-gradient sums (`combined`), and
  // after the grid-wide barrier sum_partial_columns' scratch.
  constexpr size_t kWeightBytes = sizeof(Raw) * S::kUnits;
  constexpr size_t kCombinedBytes = S::kGroups > 1 ? sizeof(wide_t) * S::kVec * S::kUnits : 0;
  constexpr size_t kSumBytes = sizeof(double) * kSumScratch<S::kThreads, 1, kScalarSums>;
  __shared__ alignas(16) unsigned char shared[std::max({kWeightBytes, kCombinedBytes, kSumBytes})];
  Raw* weight = reinterpret_cast<Raw*>(shared);
  const int group = threadIdx.x / S::kGroupThreads;
  const int t = threadIdx.x % S::kGroupThreads;
  const int units = hidden / S::kVec;
  const int64_t step = static_cast<int64_t>(gridDim.x) * S::kGroups;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * S::kGroups;
  // The weight's loads go out first, then the first row's, and only then is the weight stored to shared memory: the
  // barrier below waits for the weight alone, so the loop's first prefetch of the next row goes out sooner. Row loads
  // first, the weight came back behind them (docs/measurements/kernel-notes.md, "rms_norm weight loads first").
  Raw gv[S::kN], xv[S::kN];
  constexpr int kWeightUnits = (S::kUnits + S::kThreads - 1) / S::kThreads;
  Raw weight_units[kWeightUnits];
#pragma unroll
  for (int k = 0; k < kWeightUnits; ++k) {
    const int u = threadIdx.x + k * S::kThreads;
    weight_units[k] = u < units ? U::load(w + u * S::kVec) : U::zero();
  }
  load_row<T, S>(g, x, first + group, rows, hidden, t, gv, xv);
#pragma unroll
  for (int k = 0; k < kWeightUnits; ++k) {
    const int u = threadIdx.x + k * S::kThreads;
    if (u < units) {
      weight[u] = weight_units[k];
    }
  }
  __syncthreads();
  wide_t dw[S::kN][S::kVec];
#pragma unroll
  for (int i = 0; i < S::kN; ++i) {
#pragma unroll
    for (int j = 0; j < S::kVec; ++j) {
      dw[i][j] = wide_t(0);
    }
  }
  int parity = 0;
  // Uniform across the block (every group's row is base + group), so the group reductions' __syncthreads are too.
  for (int64_t base = first; base < rows; base += step, parity ^= 1) {
    const int64_t row = base + group;
    Raw gn[S::kN], xn[S::kN];
    load_row<T, S>(g, x, row + step, rows, hidden, t, gn, xn);
    wide_t sums[2] = {wide_t(0), wide_t(0)};  // sum(x^2), sum(grad * weight * x)
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      const int u = t + i * S::kGroupThreads;
      add_backward_terms<U>(gv[i], xv[i], u < units ? weight[u] : U::zero(), sums);
    }
    group_sum<S>(sums, scratch[parity]);
    // The same bits in every thread of the group: the group takes the second sum or not.
    const bool resum = kResumOverflow<T, wide_t> && !isfinite(sums[0]);
    if (row < rows && resum) {
      backward_resummed_row<S>(g + row * hidden, x + row * hidden, w, weight, gx + row * hidden, t, units, hidden,
                               static_cast<double>(eps), resum_scratch, dw);
    } else if (row < rows) {
      const wide_t r = inverse_rms(sums[0], hidden, eps);
      const auto r_x = static_cast<acc_t>(r);
      const auto c = static_cast<acc_t>(r * r * sums[1] / static_cast<wide_t>(hidden));
      T* gxr = gx + row * hidden;
#pragma unroll
      for (int i = 0; i < S::kN; ++i) {
        const int u = t + i * S::kGroupThreads;
        if (u < units) {
          U::forget(gv[i]);
          U::forget(xv[i]);
          const Raw wv = weight[u];
          acc_t out[S::kVec];
#pragma unroll
          for (int j = 0; j < S::kVec; ++j) {
            const acc_t ge = U::get(gv[i], j);
            const acc_t xe = U::get(xv[i], j);
            out[j] = r_x * (ge * U::get(wv, j) - xe * c);
            dw[i][j] += static_cast<wide_t>(ge) * (static_cast<wide_t>(xe) * r);
          }
          U::store(gxr + u * S::kVec, out);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      gv[i] = gn[i];
      xv[i] = xn[i];
    }
  }
  if (partial == nullptr) {
    return;
  }
  // The groups' sums are added in group order: group k adds its own to those of groups 0..k-1 in shared memory, and
  // the last group writes the block's partial row from registers, 16 bytes at a time. Shared memory is element-major
  // (element j of unit u at j * kUnits + u), so a warp's accesses fall in distinct banks: unit-major, a bfloat16
  // block's 8 sums per unit conflicted 8 ways (docs/measurements/kernel-notes.md, "rms_norm element-major sums").
  wide_t* combined = reinterpret_cast<wide_t*>(shared);
  if constexpr (S::kGroups > 1) {
    __syncthreads();  // every group is done with the weight
  }
  for (int k = 0; k + 1 < S::kGroups; ++k) {
    if (group == k) {
#pragma unroll
      for (int i = 0; i < S::kN; ++i) {
        const int u = t + i * S::kGroupThreads;
        if (u < units) {
#pragma unroll
          for (int j = 0; j < S::kVec; ++j) {
            wide_t& slot = combined[j * S::kUnits + u];
            slot = k == 0 ? dw[i][j] : slot + dw[i][j];
          }
        }
      }
    }
    __syncthreads();
  }
  if (group == S::kGroups - 1) {
    wide_t* out = partial + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
    for (int i = 0; i < S::kN; ++i) {
      const int u = t + i * S::kGroupThreads;
      if (u < units) {
        wide_t row[S::kVec];
#pragma unroll
        for (int j = 0; j < S::kVec; ++j) {
          row[j] = S::kGroups == 1 ? dw[i][j] : combined[j * S::kUnits + u] + dw[i][j];
        }
        store_sums(out + u * S::kVec, row);
      }
    }
  }
  if (grad_weight != nullptr) {
    // The barrier also makes every block's partial row visible to every other block. The sum takes scalar loads
    // (kScalarSums): 16-byte ones (sum_partials' kernel's choice) made this backward slower
    // (docs/measurements/kernel-notes.md, "rms_norm scalar sum loads").
    cooperative_groups::this_grid().sync();
    sum_partial_columns<S::kThreads, kScalarSums>(partial, gridDim.x, hidden, SumOutputs<T, 1>{{grad_weight}},
                                                  blockIdx.x, gridDim.x, reinterpret_cast<double*>(shared));
  }
}

// Rows longer than any register-resident backward shape: two reads of the row (three for a row whose squares
// overflow float), and the block's partial sums kept in its own row of `partial` (read, added to, written back by the
// thread that owns the column).
template <typename T, class S>
__global__ void __launch_bounds__(S::kThreads)
    backward_loop_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                         T* __restrict__ gx, sum_t<T>* __restrict__ partial, int64_t rows, int64_t hidden,
                         sum_t<T> eps) {
  static_assert(S::kGroups == 1, "one row per block");
  using acc_t = opmath_t<T>;
  using wide_t = sum_t<T>;
  using U = Unit<T, S::kVec>;
  __shared__ wide_t scratch[2][S::kGroupWarps * 2];
  __shared__ double resum_scratch[S::kGroupWarps * 2];
  const int64_t units = hidden / S::kVec;
  wide_t* mine = partial == nullptr ? nullptr : partial + static_cast<int64_t>(blockIdx.x) * hidden;
  if (mine != nullptr) {
    // Each thread zeroes the columns it will add to: no other thread touches them.
    for (int64_t u = threadIdx.x; u < units; u += S::kThreads) {
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) {
        mine[u * S::kVec + j] = wide_t(0);
      }
    }
  }
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    const T* gr = g + row * hidden;
    const T* xr = x + row * hidden;
    wide_t sums[2] = {wide_t(0), wide_t(0)};
    for (int64_t u = threadIdx.x; u < units; u += S::kThreads) {
      add_backward_terms<U>(U::load(gr + u * S::kVec), U::load(xr + u * S::kVec), U::load(w + u * S::kVec), sums);
    }
    group_sum<S>(sums, scratch[parity]);
    wide_t r = inverse_rms(sums[0], hidden, eps);
    auto r_x = static_cast<acc_t>(r);
    auto c = static_cast<acc_t>(r * r * sums[1] / static_cast<wide_t>(hidden));
    if constexpr (kResumOverflow<T, wide_t>) {
      if (!isfinite(sums[0])) {  // the same bits in every thread: the block takes this path or not
        resummed_backward_factors<S>(gr, xr, w, threadIdx.x, units, hidden, static_cast<double>(eps), resum_scratch,
                                     r, r_x, c);
      }
    }
    T* gxr = gx + row * hidden;
    for (int64_t u = threadIdx.x; u < units; u += S::kThreads) {
      const typename U::Raw gv = U::load(gr + u * S::kVec);
      const typename U::Raw xv = U::load(xr + u * S::kVec);
      const typename U::Raw wv = U::load(w + u * S::kVec);
      acc_t out[S::kVec];
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) {
        const acc_t ge = U::get(gv, j);
        const acc_t xe = U::get(xv, j);
        out[j] = r_x * (ge * U::get(wv, j) - xe * c);
        if (mine != nullptr) {
          mine[u * S::kVec + j] += static_cast<wide_t>(ge) * (static_cast<wide_t>(xe) * r);
        }
      }
      U::store(gxr + u * S::kVec, out);
    }
  }
}

// ------------------------------------------------------------------------------------------------- launching

// The register-resident shapes, by row length in units. Up to 128 units a warp takes a row and a block 8 rows;
// longer rows get more warps, 4 units per thread (4 16-byte loads of each row tensor in flight per thread), and 8 at
// the longest. Registers per thread (ptxas for sm_90, bfloat16): the forward holds x alone across the reduction, 39
// at 4 units and 58 at 8 (1024 threads allow 64), so it goes to 8192 units (65536 bfloat16 elements). The scalar
// fallback (kVec 1) gets fewer shapes: it is for odd hidden sizes and unaligned pointers, not for speed.
template <int kVec, typename Fn>
bool with_forward_shape(int64_t units, Fn&& fn) {
  if constexpr (kVec == 1) {
    if (units <= 32) return fn(RowShape<1, 1, 1, 8>{}), true;
    if (units <= 128) return fn(RowShape<1, 4, 1, 8>{}), true;
    if (units <= 1024) return fn(RowShape<1, 4, 8, 1>{}), true;
    if (units <= 4096) return fn(RowShape<1, 4, 32, 1>{}), true;
  } else {
    if (units <= 32) return fn(RowShape<kVec, 1, 1, 8>{}), true;
    if (units <= 64) return fn(RowShape<kVec, 2, 1, 8>{}), true;
    if (units <= 128) return fn(RowShape<kVec, 4, 1, 8>{}), true;
    if (units <= 256) return fn(RowShape<kVec, 4, 2, 4>{}), true;
    if (units <= 512) return fn(RowShape<kVec, 4, 4, 2>{}), true;
    if (units <= 1024) return fn(RowShape<kVec, 4, 8, 1>{}), true;
    if (units <= 2048) return fn(RowShape<kVec, 4, 16, 1>{}), true;
    if (units <= 4096) return fn(RowShape<kVec, 4, 32, 1>{}), true;
    if (units <= 8192) return fn(RowShape<kVec, 8, 32, 1>{}), true;
  }
  return false;
}

// The backward holds two rows of grad and x (the current and the prefetched one) and a partial weight gradient per
// element: at 4 units per thread 126-128 registers (ptxas, sm_90, bfloat16 and float32's doubles), so a block of
// 256 threads asks for 2 per SM and one of 512 for 1 (more would spill), and past 2048 units (16384 bfloat16) it
// takes the loop kernel.
// Chosen by a sweep of the backward (docs/measurements/kernel-notes.md, "rms_norm backward shapes").
template <typename T, int kVec, typename Fn>
bool with_backward_shape(int64_t units, Fn&& fn) {
  constexpr bool kDoubleSums = !std::is_same_v<sum_t<T>, opmath_t<T>>;
  if constexpr (kVec == 1) {
    if (units <= 32) return fn(RowShape<1, 1, 1, 8>{}), true;
    if (units <= 128) return fn(RowShape<1, 4, 1, 8>{}), true;
    if (units <= 1024) return fn(RowShape<1, 4, 8, 1>{}), true;
    if (units <= 2048) return fn(RowShape<1, 4, 16, 1>{}), true;
  } else {
    if (units <= 32) return fn(RowShape<kVec, 1, 1, 8, 2>{}), true;
    if (units <= 64) return fn(RowShape<kVec, 2, 1, 8, 2>{}), true;
    if (units <= 128) return fn(RowShape<kVec, 4, 1, 8, 2>{}), true;
    if (units <= 256) return fn(RowShape<kVec, 4, 2, 4, 2>{}), true;
    if (units <= 512) return fn(RowShape<kVec, 4, 4, 2, 2>{}), true;
    if (units <= 1024) {
      if constexpr (kDoubleSums) {
        return fn(RowShape<kVec, 4, 8, 2, 1>{}), true;
      } else {
        return fn(RowShape<kVec, 2, 16, 1>{}), true;
      }
    }
    if (units <= 2048) return fn(RowShape<kVec, 4, 16, 1>{}), true;
  }
  return false;
}

// The loop kernels' shape: 512 threads per row.
template <int kVec>
using LoopShape = RowShape<kVec, 1, 16, 1>;

// The backward's grid: enough blocks to fill the GPU once, never more than there are row steps.
template <auto kKernel>
int64_t resident_grid(int threads, int64_t steps) {
  const int device = c10::cuda::current_device();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int per_sm = blocks_per_sm<kKernel>(threads, device);
  return std::max<int64_t>(1, std::min<int64_t>(steps, static_cast<int64_t>(sms) * per_sm));
}

// A grid of at most INT32_MAX blocks: the kernels loop over the row steps beyond it.
unsigned grid_of(int64_t blocks) {
  return static_cast<unsigned>(std::min<int64_t>(blocks, INT32_MAX));
}

// The scalar fallback unless every pointer is 16-byte aligned and rows are whole vectors.
template <typename T, typename... Ptr>
bool vectorizable(int64_t hidden, const Ptr*... p) {
  return hidden % (kVectorBytes / sizeof(T)) == 0 && (aligned(p) && ...);
}

// ------------------------------------------------------------------------------------------------ wide rows

// A few rows too wide for a block each (one row of 2^20 elements, as `opforge bench --sizes` makes) would leave all
// but a few SMs idle in the loop kernels' one block per row. Up to kSplitMaxRows rows of at least kSplitMinUnits
// units are split across blocks of kSplitUnits units: split_sums_kernel sums each block's share of each row into
// `partial`, and the second kernel adds a row's partials in block order, the same bits in every block, then writes
// its share of the row. The sums run in double, which needs no overflow path (the square of float's largest value
// is 1.2e77) and costs a memory-bound kernel nothing. Why these sizes: docs/measurements/tuned-constants.md.
constexpr int kSplitThreads = 256;
constexpr int kSplitWarps = kSplitThreads / kWarp;
constexpr int64_t kSplitUnits = kSplitThreads * 8;
constexpr int64_t kSplitMaxRows = 8;
constexpr int64_t kSplitMinUnits = 4 * kSplitUnits;

bool split_rows(const Rows& shape, int64_t units) {
  return shape.rows <= kSplitMaxRows && units >= kSplitMinUnits;
}

// Sums v[0] and v[1] over the block; every thread gets the same bits: warp butterflies, then the warps' sums added
// in warp order by every thread. `scratch` holds 2 * kSplitWarps values and is free again on return.
__device__ __forceinline__ void split_block_sum(double (&v)[2], double* scratch) {
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    v[k] = warp_sum(v[k]);
    if (threadIdx.x % kWarp == 0) {
      scratch[k * kSplitWarps + warp] = v[k];
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    double sum = 0;
    for (int i = 0; i < kSplitWarps; ++i) {
      sum += scratch[k * kSplitWarps + i];
    }
    v[k] = sum;
  }
  __syncthreads();
}

// partial[row][block][0..2): sum(x^2) and (kBackward) sum(grad * weight * x) of the block's units of the row.
template <typename T, int kVec, bool kBackward>
__global__ void __launch_bounds__(kSplitThreads)
    split_sums_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                      double* __restrict__ partial, int64_t hidden) {
  using U = Unit<T, kVec>;
  __shared__ double scratch[2 * kSplitWarps];
  const int64_t row = blockIdx.y;
  const int64_t units = hidden / kVec;
  const int64_t end = std::min<int64_t>(units, (blockIdx.x + 1) * kSplitUnits);
  double sums[2] = {0.0, 0.0};
  for (int64_t u = blockIdx.x * kSplitUnits + threadIdx.x; u < end; u += kSplitThreads) {
    const int64_t at = row * hidden + u * kVec;
    if constexpr (kBackward) {
      add_backward_terms<U>(U::load(g + at), U::load(x + at), U::load(w + u * kVec), sums);
    } else {
      add_squares<U>(U::load(x + at), sums[0]);
    }
  }
  split_block_sum(sums, scratch);
  if (threadIdx.x == 0) {
    double* out = partial + (row * gridDim.x + blockIdx.x) * 2;
    out[0] = sums[0];
    out[1] = sums[1];
  }
}

// A row's sums: its blocks' partials added in block order (thread t adds partials t, t + kSplitThreads, ... in
// order, then the block sum), so every block that reads them gets the same bits.
__device__ __forceinline__ void split_row_sums(const double* __restrict__ partial, int64_t row, int64_t blocks,
                                               double (&sums)[2], double* scratch) {
  sums[0] = 0;
  sums[1] = 0;
  for (int64_t b = threadIdx.x; b < blocks; b += kSplitThreads) {
    sums[0] += partial[(row * blocks + b) * 2];
    sums[1] += partial[(row * blocks + b) * 2 + 1];
  }
  split_block_sum(sums, scratch);
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kSplitThreads)
    split_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                         const double* __restrict__ partial, int64_t hidden, double eps) {
  using U = Unit<T, kVec>;
  using acc_t = opmath_t<T>;
  __shared__ double scratch[2 * kSplitWarps];
  const int64_t row = blockIdx.y;
  double sums[2];
  split_row_sums(partial, row, gridDim.x, sums, scratch);
  const auto r = static_cast<acc_t>(inverse_rms(sums[0], hidden, eps));
  const int64_t end = std::min<int64_t>(hidden / kVec, (blockIdx.x + 1) * kSplitUnits);
  for (int64_t u = blockIdx.x * kSplitUnits + threadIdx.x; u < end; u += kSplitThreads) {
    const int64_t at = row * hidden + u * kVec;
    forward_unit<U>(y + at, U::load(x + at), U::load(w + u * kVec), r);
  }
}

// grad_x of every row for the block's units, and their weight gradient (when grad_weight is given), the rows added in
// row order in sum_t, as backward_kernel adds a group's rows.
template <typename T, int kVec>
__global__ void __launch_bounds__(kSplitThreads)
    split_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                          T* __restrict__ gx, T* __restrict__ grad_weight, const double* __restrict__ partial,
                          int64_t rows, int64_t hidden, double eps) {
  using U = Unit<T, kVec>;
  using acc_t = opmath_t<T>;
  using wide_t = sum_t<T>;
  __shared__ double scratch[2 * kSplitWarps];
  __shared__ wide_t r_wide[kSplitMaxRows];
  __shared__ acc_t r_x[kSplitMaxRows], c_x[kSplitMaxRows];
  for (int64_t row = 0; row < rows; ++row) {
    double sums[2];
    split_row_sums(partial, row, gridDim.x, sums, scratch);
    if (threadIdx.x == 0) {
      factors_of_double_sums(sums, hidden, eps, r_wide[row], r_x[row], c_x[row]);
    }
  }
  __syncthreads();
  const int64_t end = std::min<int64_t>(hidden / kVec, (blockIdx.x + 1) * kSplitUnits);
  for (int64_t u = blockIdx.x * kSplitUnits + threadIdx.x; u < end; u += kSplitThreads) {
    const typename U::Raw wv = U::load(w + u * kVec);
    wide_t dw[kVec] = {};
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t at = row * hidden + u * kVec;
      const typename U::Raw gv = U::load(g + at), xv = U::load(x + at);
      acc_t out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const acc_t ge = U::get(gv, j);
        const acc_t xe = U::get(xv, j);
        out[j] = r_x[row] * (ge * U::get(wv, j) - xe * c_x[row]);
        dw[j] += static_cast<wide_t>(ge) * (static_cast<wide_t>(xe) * r_wide[row]);
      }
      U::store(gx + at, out);
    }
    if (grad_weight != nullptr) {
      acc_t rounded[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        rounded[j] = static_cast<acc_t>(dw[j]);
      }
      U::store(grad_weight + u * kVec, rounded);
    }
  }
}

// The forward of rows split across blocks (split_rows).
template <typename T, int kVec>
void launch_split_forward(const T* x, const T* w, T* y, Rows shape, double eps, const at::TensorOptions& options,
                          cudaStream_t stream) {
  const int64_t blocks = ceil_div(shape.hidden / kVec, kSplitUnits);
  const at::Tensor partial = at::empty({shape.rows, blocks, 2}, options.dtype(at::kDouble));
  const dim3 grid(grid_of(blocks), static_cast<unsigned>(shape.rows));
  split_sums_kernel<T, kVec, false>
      <<<grid, kSplitThreads, 0, stream>>>(nullptr, x, w, partial.data_ptr<double>(), shape.hidden);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  split_forward_kernel<T, kVec>
      <<<grid, kSplitThreads, 0, stream>>>(x, w, y, partial.const_data_ptr<double>(), shape.hidden, eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The backward of rows split across blocks (split_rows); grad_weight may be undefined.
template <typename T, int kVec>
void launch_split_backward(const T* g, const T* x, const T* w, T* gx, at::Tensor& grad_weight, Rows shape, double eps,
                           const at::TensorOptions& options, cudaStream_t stream) {
  const int64_t blocks = ceil_div(shape.hidden / kVec, kSplitUnits);
  const at::Tensor partial = at::empty({shape.rows, blocks, 2}, options.dtype(at::kDouble));
  split_sums_kernel<T, kVec, true><<<dim3(grid_of(blocks), static_cast<unsigned>(shape.rows)), kSplitThreads, 0,
                                     stream>>>(g, x, w, partial.data_ptr<double>(), shape.hidden);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  split_backward_kernel<T, kVec><<<grid_of(blocks), kSplitThreads, 0, stream>>>(
      g, x, w, gx, grad_weight.defined() ? grad_weight.data_ptr<T>() : nullptr, partial.const_data_ptr<double>(),
      shape.rows, shape.hidden, eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kVec>
void launch_forward(const T* x, const T* w, T* y, Rows shape, double eps, const at::TensorOptions& options,
                    cudaStream_t stream) {
  using acc_t = opmath_t<T>;
  const auto e = static_cast<acc_t>(eps);
  const int64_t units = shape.hidden / kVec;
  if (split_rows(shape, units)) {
    launch_split_forward<T, kVec>(x, w, y, shape, eps, options, stream);
    return;
  }
  const bool fits = with_forward_shape<kVec>(units, [&](auto s) {
    using S = decltype(s);
    forward_kernel<T, S><<<grid_of(ceil_div(shape.rows, S::kGroups)), S::kThreads, 0, stream>>>(
        x, w, y, shape.rows, static_cast<int>(shape.hidden), e);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (!fits) {
    using S = LoopShape<kVec>;
    forward_loop_kernel<T, S><<<grid_of(shape.rows), S::kThreads, 0, stream>>>(x, w, y, shape.rows, shape.hidden, e);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Launches kKernel with a grid-wide barrier allowed; false where the launch is refused because the grid would not be
// resident at once (another process's kernels under MPS, or a device without cooperative launches). A cooperative
// launch is captured by CUDA graphs too (docs/measurements/kernel-notes.md, "rms_norm cooperative launch").
template <auto kKernel, typename... Args>
bool launch_cooperative(int64_t grid, int threads, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid_of(grid));
  config.blockDim = dim3(threads);
  config.stream = stream;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kKernel, args...);
  if (status == cudaErrorCooperativeLaunchTooLarge || status == cudaErrorNotSupported) {
    (void)cudaGetLastError();  // a refused launch's error is not sticky; clear it for the next check
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

// grad_x, and grad_weight when it is defined.
template <typename T, int kVec>
void launch_backward(const T* g, const T* x, const T* w, T* gx, at::Tensor& grad_weight, Rows shape, double eps,
                     const at::TensorOptions& options, cudaStream_t stream) {
  using wide_t = sum_t<T>;
  const auto e = static_cast<wide_t>(eps);
  const bool weight_grad = grad_weight.defined();
  const int64_t units = shape.hidden / kVec;
  if (split_rows(shape, units)) {
    launch_split_backward<T, kVec>(g, x, w, gx, grad_weight, shape, eps, options, stream);
    return;
  }
  at::Tensor partial;
  const auto partial_rows = [&](int64_t grid) {
    if (weight_grad) {
      partial = at::empty({grid, shape.hidden}, options.dtype(c10::CppTypeToScalarType<wide_t>::value));
    }
    return weight_grad ? partial.data_ptr<wide_t>() : nullptr;
  };
  bool summed = false;
  const bool fits = with_backward_shape<T, kVec>(units, [&](auto s) {
    using S = decltype(s);
    constexpr auto kKernel = backward_kernel<T, S>;
    const int64_t grid = resident_grid<kKernel>(S::kThreads, ceil_div(shape.rows, S::kGroups));
    wide_t* p = partial_rows(grid);
    const int hidden = static_cast<int>(shape.hidden);
    if (weight_grad) {
      summed = launch_cooperative<kKernel>(grid, S::kThreads, stream, g, x, w, gx, p, grad_weight.data_ptr<T>(),
                                           shape.rows, hidden, e);
    }
    if (!summed) {
      kKernel<<<grid_of(grid), S::kThreads, 0, stream>>>(g, x, w, gx, p, nullptr, shape.rows, hidden, e);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  if (!fits) {
    using S = LoopShape<kVec>;
    const int64_t grid = resident_grid<backward_loop_kernel<T, S>>(S::kThreads, shape.rows);
    wide_t* p = partial_rows(grid);
    backward_loop_kernel<T, S><<<grid_of(grid), S::kThreads, 0, stream>>>(g, x, w, gx, p, shape.rows, shape.hidden, e);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (weight_grad && !summed) {
    sum_partials(partial.const_data_ptr<wide_t>(), partial.size(0), shape.hidden,
                 SumOutputs<T, 1>{{grad_weight.data_ptr<T>()}}, stream);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_input(x, weight, "opforge::rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = contiguous_like(x);
  const Rows shape = rows_of(x);
  if (shape.empty()) {
    return y;
  }
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::rms_norm", [&] {
    constexpr int kVec = kVectorBytes / sizeof(scalar_t);
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    if (vectorizable<scalar_t>(shape.hidden, xp, wp, yp)) {
      launch_forward<scalar_t, kVec>(xp, wp, yp, shape, eps, x.options(), stream);
    } else {
      launch_forward<scalar_t, 1>(xp, wp, yp, shape, eps, x.options(), stream);
    }
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> backward_impl(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                                 double eps, bool weight_grad, const char* op) {
  check_backward_args(grad, x, weight, op);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor grad_x = contiguous_like(x);
  at::Tensor grad_weight;
  const Rows shape = rows_of(x);
  if (weight_grad) {
    // A sum over no rows is zero; a hidden size of 0 leaves nothing to sum.
    grad_weight = shape.empty() ? at::zeros(weight.sizes(), weight.options()) : contiguous_like(weight);
  }
  if (shape.empty()) {
    return {grad_x, grad_weight};
  }
  const at::Tensor gc = grad.contiguous();
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::rms_norm_backward", [&] {
    constexpr int kVec = kVectorBytes / sizeof(scalar_t);
    const scalar_t* gp = gc.const_data_ptr<scalar_t>();
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* gxp = grad_x.data_ptr<scalar_t>();
    if (vectorizable<scalar_t>(shape.hidden, gp, xp, wp, gxp)) {
      launch_backward<scalar_t, kVec>(gp, xp, wp, gxp, grad_weight, shape, eps, x.options(), stream);
    } else {
      launch_backward<scalar_t, 1>(gp, xp, wp, gxp, grad_weight, shape, eps, x.options(), stream);
    }
  });
  return {grad_x, grad_weight};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                                     const at::Tensor& weight, double eps) {
  return backward_impl(grad, x, weight, eps, /*weight_grad=*/true, "opforge::rms_norm_backward");
}

at::Tensor rms_norm_backward_input(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                   double eps) {
  return std::get<0>(backward_impl(grad, x, weight, eps, /*weight_grad=*/false, "opforge::rms_norm_backward_input"));
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("rms_norm_backward_input", &rms_norm_backward_input);
}

}  // namespace opforge::cuda
