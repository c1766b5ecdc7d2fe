// Shared CUDA machinery for opforge's elementwise kernels: out[i] = fn(in...[i]), each thread one 16-byte vector of
// every input (a scalar fallback when a pointer is not 16-byte aligned, element by element in the tensor's last,
// partial tile), low-precision dtypes computed in float, int64 indexing throughout, launches on the current stream
// of the input's device.
//
// Memory traffic: each input element read once and each output element written once, in coalesced 16-byte accesses;
// the aim is a device copy's rate for those bytes. An input repeated over the output's leading dimensions (a
// per-feature operand) is read in place, from L2, instead of copied full-size first.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "layout.h"

namespace opforge::cuda {

// The launch shape, chosen by a sweep of threads, vectors per thread and cache hints over 2^20..2^28 elements
// (docs/measurements/tuned-constants.md has each constant's measurement).
// 256 threads, one 16-byte vector each, one tile per block: the sweep's best shape, for one input or several.
constexpr int kElementwiseThreads = 256;
constexpr int kElementwiseUnroll = 1;
// Resident blocks per SM: a tensor with fewer tiles than the GPU holds at once is "small" (its loads stream).
constexpr int kBlocksPerSm = 8;
// Plain loads for large tensors (streaming ones lost to them), streaming loads for small ones (they won there).
constexpr bool kStreamingLoads = false;
constexpr bool kStreamingLoadsSmall = true;
constexpr int kVectorBytes = 16;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename scalar_t>
using opmath_t = at::opmath_type<scalar_t>;

template <typename P, bool kStreaming>
__device__ __forceinline__ P load_pack(const void* p) {
  if constexpr (sizeof(P) == 16) {
    const uint4 raw = kStreaming ? __ldcs(reinterpret_cast<const uint4*>(p)) : *reinterpret_cast<const uint4*>(p);
    P out;
    memcpy(&out, &raw, sizeof out);
    return out;
  } else {
    return *reinterpret_cast<const P*>(p);
  }
}

template <typename P>
__device__ __forceinline__ void store_pack(void* p, const P& value) {
  if constexpr (sizeof(P) == 16) {
    uint4 raw;
    memcpy(&raw, &value, sizeof raw);
    // Streaming (evict-first): every output byte is written once, so keep it from crowding L2.
    __stcs(reinterpret_cast<uint4*>(p), raw);
  } else {
    *reinterpret_cast<P*>(p) = value;
  }
}

// Two results of one elementwise function, e.g. the gradients of both inputs of a backward.
template <typename T>
struct Two {
  T first;
  T second;
};

// The outputs an elementwise kernel writes: one, or two for a function that returns a Two.
template <typename scalar_t, int N>
struct Outputs {
  scalar_t* ptr[N];
};

// Result `k` of one call of the function: the value itself, or a Two's first or second.
template <int k, typename T>
__device__ __forceinline__ T result(const T& value) {
  return value;
}
template <int k, typename T>
__device__ __forceinline__ T result(const Two<T>& value) {
  return k == 0 ? value.first : value.second;
}

template <typename scalar_t, int kVec, int kOutputs, typename Fn, size_t... I, size_t... O>
__device__ __forceinline__ void apply_pack(Pack<scalar_t, kVec> (&out)[kOutputs], const Fn& fn,
                                           const Pack<scalar_t, kVec> (&in)[sizeof...(I)], std::index_sequence<I...>,
                                           std::index_sequence<O...>) {
  using acc_t = opmath_t<scalar_t>;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const auto r = fn(static_cast<acc_t>(in[I].v[j])...);
    ((out[O].v[j] = static_cast<scalar_t>(result<O>(r))), ...);
  }
}

// Where the inputs of a kernel are read: input k at flat output index i reads its element i, or, where it is
// repeated over the output's leading dimensions (layout.h's Spanned, read in place rather than copied full-size),
// its element i % span[k], by 32-bit multiply-shift division: outputs of at most INT32_MAX elements.
template <int N>
struct Repeats {
  bool repeated[N] = {};
  at::cuda::detail::IntDivider<uint32_t> span[N];
};

template <bool kRepeats, int N>
__device__ __forceinline__ int64_t source_index(const Repeats<N>& repeats, int k, int64_t i) {
  if constexpr (kRepeats) {
    return repeats.repeated[k] ? repeats.span[k].mod(static_cast<uint32_t>(i)) : i;
  } else {
    return i;
  }
}

// Output element i of every output: fn of the inputs' elements for it.
template <bool kRepeats, typename scalar_t, int kOutputs, typename Fn, size_t... I, size_t... O, typename... In>
__device__ __forceinline__ void write_element(const Outputs<scalar_t, kOutputs>& out, const Fn& fn,
                                              const Repeats<sizeof...(In)>& repeats, int64_t i,
                                              std::index_sequence<I...>, std::index_sequence<O...>, const In*... in) {
  const auto r = fn(static_cast<opmath_t<scalar_t>>(in[source_index<kRepeats>(repeats, I, i)])...);
  ((out.ptr[O][i] = static_cast<scalar_t>(result<O>(r))), ...);
}

// out[i] = fn(in...[i]) for i < n (each input indexed through `repeats` when kRepeats), into each of kOutputs outputs
// (a function returning a Two writes both from one load of the inputs). Each thread handles kU packs of kVec
// elements per grid-stride step; the last, partial tile of the tensor goes element by element. kVec == 1 is the
// unaligned fallback.
template <typename scalar_t, int kVec, int kU, int kThreads, bool kStreamLoads, bool kRepeats, int kOutputs,
          typename Fn, typename... In>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(int64_t n, Fn fn, Repeats<sizeof...(In)> repeats, Outputs<scalar_t, kOutputs> out,
                       const In* __restrict__... in) {
  using P = Pack<scalar_t, kVec>;
  constexpr int kInputs = sizeof...(In);
  const int64_t per_block = static_cast<int64_t>(kThreads) * kVec * kU;
  const int64_t step = per_block * gridDim.x;
  for (int64_t block_start = static_cast<int64_t>(blockIdx.x) * per_block; block_start < n; block_start += step) {
    if (block_start + per_block <= n) {
      P loaded[kU][kInputs];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = block_start + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * kVec;
        int k = 0;
        ((loaded[u][k] = load_pack<P, kStreamLoads>(in + source_index<kRepeats>(repeats, k, i)), ++k), ...);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = block_start + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * kVec;
        P results[kOutputs];
        apply_pack<scalar_t, kVec>(results, fn, loaded[u], std::index_sequence_for<In...>{},
                                   std::make_index_sequence<kOutputs>{});
#pragma unroll
        for (int o = 0; o < kOutputs; ++o) {
          store_pack(out.ptr[o] + i, results[o]);
        }
      }
    } else {
      // The tensor's last, partial block: element by element, still coalesced across the block.
      for (int64_t i = block_start + threadIdx.x; i < n; i += kThreads) {
        write_element<kRepeats>(out, fn, repeats, i, std::index_sequence_for<In...>{},
                                std::make_index_sequence<kOutputs>{}, in...);
      }
    }
  }
}

inline bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0;
}

template <int N>
using IntC = std::integral_constant<int, N>;

// Picks the kernel shape for `n` elements, as tuned above, and calls
// `launch(kVec, kUnroll, kThreads, kStreamLoads, grid, stream)` (the first four as std::integral_constant) with
// `device` current; `aligned_all` says whether every buffer is 16-byte aligned.
template <typename scalar_t, typename Launch>
void launch_shaped(const c10::Device& device, int64_t n, bool aligned_all, const Launch& launch) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device.index());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  constexpr int kVec = kVectorBytes / sizeof(scalar_t);
  constexpr int kThreads = kElementwiseThreads;
  constexpr int kPerBlock = kThreads * kVec * kElementwiseUnroll;
  const int64_t resident = static_cast<int64_t>(sms) * kBlocksPerSm;
  // One tile per block, as many blocks as tiles (up to INT32_MAX: the kernel loops over the tiles beyond).
  const auto grid = [&](int64_t per_block) {
    return static_cast<int>(std::min<int64_t>((n + per_block - 1) / per_block, INT32_MAX));
  };
  if (!aligned_all) {
    launch(IntC<1>{}, IntC<1>{}, IntC<kThreads>{}, std::false_type{}, grid(kThreads), stream);
  } else if ((n + kPerBlock - 1) / kPerBlock >= resident) {
    launch(IntC<kVec>{}, IntC<kElementwiseUnroll>{}, IntC<kThreads>{}, std::bool_constant<kStreamingLoads>{},
           grid(kPerBlock), stream);
  } else {
    // Too small to fill the GPU: one vector per thread (more blocks), streaming loads.
    launch(IntC<kVec>{}, IntC<1>{}, IntC<kThreads>{}, std::bool_constant<kStreamingLoadsSmall>{},
           grid(int64_t{kThreads} * kVec), stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool kRepeats, typename scalar_t, int kOutputs, typename Fn, typename... In>
void launch_elementwise_kernel(const c10::Device& device, const Outputs<scalar_t, kOutputs>& out, int64_t n,
                               const Fn& fn, const Repeats<sizeof...(In)>& repeats, bool aligned_all,
                               const In*... in) {
  static_assert((std::is_same_v<In, scalar_t> && ...), "all inputs share the outputs' dtype");
  if (n == 0) {
    return;
  }
  launch_shaped<scalar_t>(
      device, n, aligned_all,
      [&](auto vec, auto unroll, auto threads, auto stream_loads, int grid, cudaStream_t stream) {
        elementwise_kernel<scalar_t, decltype(vec)::value, decltype(unroll)::value, decltype(threads)::value,
                           decltype(stream_loads)::value, kRepeats>
            <<<grid, decltype(threads)::value, 0, stream>>>(n, fn, repeats, out, in...);
      });
}

// Launch `fn` over `n` elements of dense buffers that share one layout, on the current stream of `device`.
template <typename scalar_t, typename Fn, typename... In>
void launch_elementwise(const c10::Device& device, scalar_t* out, int64_t n, const Fn& fn, const In*... in) {
  launch_elementwise_kernel<false>(device, Outputs<scalar_t, 1>{{out}}, n, fn, Repeats<sizeof...(In)>{},
                                   aligned(out) && (aligned(in) && ...), in...);
}

// `t` as launch_elementwise_spanned reads it: in place when repeated over the leading dimensions of `out`
// (contiguous, at most INT32_MAX elements) by whole 16-byte vectors from an aligned start, else in out's layout
// (copied if need be).
template <typename scalar_t>
Spanned<scalar_t> spanned(const at::Tensor& t, const at::Tensor& out) {
  constexpr int64_t kVec = kVectorBytes / sizeof(scalar_t);
  return spanned_if<scalar_t>(t, out, [&](int64_t span) {
    return out.numel() <= INT32_MAX && span % kVec == 0 && aligned(t.const_data_ptr());
  });
}

// launch_elementwise over the inputs as `spanned` gives them: each one repeated over the output's leading
// dimensions is read in place.
template <typename scalar_t, typename Fn, typename... S>
void launch_elementwise_spanned(const c10::Device& device, scalar_t* out, int64_t n, const Fn& fn, const S&... in) {
  Repeats<sizeof...(S)> repeats;
  int k = 0;
  ((repeats.repeated[k] = in.span != n,
    repeats.span[k] = at::cuda::detail::IntDivider<uint32_t>(static_cast<uint32_t>(in.span != n ? in.span : 1)), ++k),
   ...);
  const bool aligned_all = aligned(out) && (aligned(in.data) && ...);
  if ((... || (in.span != n))) {
    launch_elementwise_kernel<true>(device, Outputs<scalar_t, 1>{{out}}, n, fn, repeats, aligned_all, in.data...);
  } else {
    launch_elementwise_kernel<false>(device, Outputs<scalar_t, 1>{{out}}, n, fn, repeats, aligned_all, in.data...);
  }
}

// launch_elementwise for a function with two results (a Two), written to `out0` and `out1` from one load of the
// inputs, in the one-output kernels' shape (not measured separately with two outputs).
template <typename scalar_t, typename Fn, typename... In>
void launch_elementwise2(const c10::Device& device, scalar_t* out0, scalar_t* out1, int64_t n, const Fn& fn,
                         const In*... in) {
  launch_elementwise_kernel<false>(device, Outputs<scalar_t, 2>{{out0, out1}}, n, fn, Repeats<sizeof...(In)>{},
                                   aligned(out0) && aligned(out1) && (aligned(in) && ...), in...);
}

constexpr int kMaxDevices = 64;

// Resident blocks per SM of kKernel at `threads` threads, asked once per kernel and device: the grid of kernels
// that loop over their work with as many blocks as fit at once.
template <auto kKernel>
int blocks_per_sm(int threads, int device) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int blocks = cacheable ? cache[device].load(std::memory_order_relaxed) : 0;
  if (blocks == 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, threads, 0));
    blocks = std::max(blocks, 1);
    if (cacheable) {
      cache[device].store(blocks, std::memory_order_relaxed);
    }
  }
  return blocks;
}

}  // namespace opforge::cuda
