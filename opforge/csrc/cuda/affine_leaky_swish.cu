// CUDA kernels of opforge::affine_leaky_swish and its backward (schemas are defined in ../affine_leaky_swish.cpp).
//
// Forward: one flat loop over x's dense buffer, 16-byte vectors where a vector stays within one channel (NCHW:
// H * W a multiple of the vector width) or covers consecutive channels whose parameters load as a vector too
// (NHWC: C a multiple of it); element by element otherwise. Backward: grad_x elementwise, and the scale/shift
// gradients as per-channel sums without atomics: each block adds its elements in a fixed order into one partial sum
// per channel it covers, and a second kernel adds the partial sums of each channel in a fixed order. The blocks
// depend on the shape (and, for NHWC, on how many fit on the device) alone, so the sums come out bitwise the same on
// every run.
#include <ATen/Dispatch.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "affine_leaky_swish.h"
#include "elementwise.cuh"

namespace opforge::cuda {
namespace {

using affine_leaky_swish::check_backward_args;
using affine_leaky_swish::check_inputs;
using affine_leaky_swish::Plan;
using affine_leaky_swish::plan_for;
using at::cuda::detail::IntDivider;

// Threads per block of every kernel here (the block reductions assume it). The elementwise kernels' measured
// default (elementwise.cuh, OPFORGE_CUDA_THREADS).
constexpr int kThreads = 256;
// NCHW backward: each thread visits at most this many batch entries and this many vectors along a plane. Untuned:
// enough loads per thread to amortize the block's reduction and its partial-sum writes (1/16 of grad_x's bytes at
// most, in float), few enough that a 56 x 56 x 256 x 32 tensor still makes hundreds of blocks; measured at 62-91%
// of the copy on an H200 (docs/performance.md).
constexpr int64_t kRowsPerThread = 16;
constexpr int64_t kVectorsPerThread = 8;
// NHWC backward: row steps whose loads a thread issues together (two 16-byte loads each). Untuned: 4 steps hold 8
// loads in flight per thread, as many as the elementwise kernels' fastest shape keeps per SM.
constexpr int kRowSteps = 4;
// Channels per block of the partial sums' last addition: 8 floats, one 32-byte sector per warp row.
constexpr int kFinishCols = 8;
// gridDim.y's hardware limit.
constexpr int64_t kMaxGridY = 65535;

// float (and float16/bfloat16, computed in float): the hardware exp and a fast reciprocal, as in leaky_swish.cu.
__device__ __forceinline__ float sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

// double is computed exactly as the float64 reference is: gradcheck must not see float32 rounding.
__device__ __forceinline__ double sigmoid(double x) {
  return 1.0 / (1.0 + exp(-x));
}

template <typename acc_t>
__device__ __forceinline__ acc_t forward_value(acc_t x, acc_t scale, acc_t shift, acc_t alpha) {
  const acc_t v = x * scale + shift;
  return v * (sigmoid(v) + alpha);
}

// d(loss)/dv = grad * f'(v), f'(v) = s + v * s * (1 - s) + alpha with s = sigmoid(v).
template <typename acc_t>
__device__ __forceinline__ acc_t grad_v(acc_t grad, acc_t x, acc_t scale, acc_t shift, acc_t alpha) {
  const acc_t v = x * scale + shift;
  const acc_t s = sigmoid(v);
  return grad * (s + v * s * (acc_t(1) - s) + alpha);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The smallest power of two >= n, capped at kThreads: the threads of a block along its inner dimension.
int inner_threads(int64_t n) {
  int t = 1;
  while (t < kThreads && t < n) {
    t *= 2;
  }
  return t;
}

// ------------------------------------------------------------------------------------------------- forward

// The channel of flat element i: NCHW (i / hw) % c, NHWC i % c. index_t is uint32 (IntDivider's multiply-shift
// division) when the tensor has at most INT32_MAX elements, else int64 (plain division).
template <typename index_t, bool kChannelsInner>
struct ChannelOf {
  IntDivider<index_t> hw, c;

  __device__ __forceinline__ index_t operator()(index_t i) const {
    if constexpr (kChannelsInner) {
      return c.mod(i);
    } else {
      return c.mod(hw.div(i));
    }
  }
};

// One vector of kVec elements per thread (grid-stride, for grids past the hardware limit); the n % kVec elements
// after the last full vector go to the first threads of block 0. A vector is one channel (NCHW, hw % kVec == 0)
// or kVec consecutive channels (NHWC, c % kVec == 0: their parameters load as vectors too).
template <typename scalar_t, int kVec, typename index_t, bool kChannelsInner>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(index_t n, ChannelOf<index_t, kChannelsInner> channel_of, opmath_t<scalar_t> alpha,
                   const scalar_t* __restrict__ x, const scalar_t* __restrict__ scale,
                   const scalar_t* __restrict__ shift, scalar_t* __restrict__ out) {
  using acc_t = opmath_t<scalar_t>;
  using P = Pack<scalar_t, kVec>;
  const index_t vectors = n / kVec;
  const index_t step = static_cast<index_t>(gridDim.x) * kThreads;
  for (index_t v = static_cast<index_t>(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += step) {
    const index_t i = v * kVec;
    const index_t c = channel_of(i);
    const P xv = load_pack<P, false>(x + i);
    P result;
    if constexpr (kChannelsInner) {
      const P s = load_pack<P, false>(scale + c);
      const P b = load_pack<P, false>(shift + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result.v[j] = static_cast<scalar_t>(forward_value<acc_t>(xv.v[j], s.v[j], b.v[j], alpha));
      }
    } else {
      const auto s = static_cast<acc_t>(scale[c]);
      const auto b = static_cast<acc_t>(shift[c]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result.v[j] = static_cast<scalar_t>(forward_value<acc_t>(xv.v[j], s, b, alpha));
      }
    }
    store_pack(out + i, result);
  }
  if (kVec > 1 && blockIdx.x == 0 && threadIdx.x < n - vectors * kVec) {
    const index_t i = vectors * kVec + threadIdx.x;
    const index_t c = channel_of(i);
    out[i] = static_cast<scalar_t>(forward_value<acc_t>(x[i], scale[c], shift[c], alpha));
  }
}

template <typename scalar_t, typename index_t, bool kChannelsInner>
void launch_forward(const Plan& plan, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                    at::Tensor& out, double alpha, cudaStream_t stream) {
  using acc_t = opmath_t<scalar_t>;
  constexpr int kVec = kVectorBytes / sizeof(scalar_t);
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* sp = scale.const_data_ptr<scalar_t>();
  const scalar_t* bp = shift.const_data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const bool vectors = aligned(xp) && aligned(op) &&
                       (kChannelsInner ? plan.c % kVec == 0 && aligned(sp) && aligned(bp) : plan.hw % kVec == 0);
  const ChannelOf<index_t, kChannelsInner> channel_of{IntDivider<index_t>(static_cast<index_t>(plan.hw)),
                                                      IntDivider<index_t>(static_cast<index_t>(plan.c))};
  const auto n = static_cast<index_t>(plan.numel());
  const auto a = static_cast<acc_t>(alpha);
  const auto grid = [&](int vec) {
    return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(plan.numel() / vec, kThreads), 1, INT32_MAX));
  };
  if (vectors) {
    forward_kernel<scalar_t, kVec, index_t, kChannelsInner>
        <<<grid(kVec), kThreads, 0, stream>>>(n, channel_of, a, xp, sp, bp, op);
  } else {
    forward_kernel<scalar_t, 1, index_t, kChannelsInner>
        <<<grid(1), kThreads, 0, stream>>>(n, channel_of, a, xp, sp, bp, op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void forward(const Plan& plan, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
             at::Tensor& out, double alpha, cudaStream_t stream) {
  // IntDivider<uint32_t> is exact below 2^31.
  const bool small = plan.numel() <= INT32_MAX;
  if (plan.channels_inner) {
    small ? launch_forward<scalar_t, uint32_t, true>(plan, x, scale, shift, out, alpha, stream)
          : launch_forward<scalar_t, int64_t, true>(plan, x, scale, shift, out, alpha, stream);
  } else {
    small ? launch_forward<scalar_t, uint32_t, false>(plan, x, scale, shift, out, alpha, stream)
          : launch_forward<scalar_t, int64_t, false>(plan, x, scale, shift, out, alpha, stream);
  }
}

at::Tensor affine_leaky_swish(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double alpha) {
  check_inputs(x, scale, shift, "opforge::affine_leaky_swish");
  const c10::cuda::CUDAGuard guard(x.device());
  const Plan plan = plan_for(x);
  at::Tensor out = plan.empty_like_x(x);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor xd = plan.dense(x), sd = scale.contiguous(), bd = shift.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::affine_leaky_swish", [&] {
    forward<scalar_t>(plan, xd, sd, bd, out, alpha, stream);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------ backward

// Sums `a` and `b` over the block's kThreads threads in a fixed tree; thread 0 gets the totals.
template <typename acc_t>
__device__ __forceinline__ void block_sum(acc_t& a, acc_t& b) {
  __shared__ acc_t shared[2][kThreads];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  shared[0][tid] = a;
  shared[1][tid] = b;
  __syncthreads();
#pragma unroll
  for (int offset = kThreads / 2; offset > 0; offset /= 2) {
    if (tid < offset) {
      shared[0][tid] += shared[0][tid + offset];
      shared[1][tid] += shared[1][tid + offset];
    }
    __syncthreads();
  }
  a = shared[0][0];
  b = shared[1][0];
}

// Per-channel partial sums: partial_d[k * C + c] (the shift's gradient) and partial_dx[k * C + c] (the scale's)
// for k < blocks.
template <typename acc_t>
struct Partials {
  acc_t* d;
  acc_t* dx;
};

// NHWC: a (tx, ty) block covers tx * kVec consecutive channels (threadIdx.x, kVec each) and loops over row steps
// of ty consecutive rows (threadIdx.y): steps blockIdx.y, blockIdx.y + gridDim.y, ..., kRowSteps of them at a time
// (all their loads issued before any is used); partial sum k = blockIdx.y. The grid is what fits on the GPU at
// once, so the partial sums are a few hundred per channel however many rows there are. kVec > 1 needs
// C % kVec == 0 and 16-byte aligned pointers.
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreads)
    backward_rows_kernel(int64_t rows, int64_t channels, opmath_t<scalar_t> alpha, const scalar_t* __restrict__ grad,
                         const scalar_t* __restrict__ x, const scalar_t* __restrict__ scale,
                         const scalar_t* __restrict__ shift, scalar_t* __restrict__ grad_x,
                         Partials<opmath_t<scalar_t>> partials) {
  using acc_t = opmath_t<scalar_t>;
  using P = Pack<scalar_t, kVec>;
  __shared__ acc_t shared[2][kThreads * kVec];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  const bool active = c0 < channels;
  acc_t sum_d[kVec] = {}, sum_dx[kVec] = {};
  if (active) {
    const P s = load_pack<P, false>(scale + c0);
    const P b = load_pack<P, false>(shift + c0);
    const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
    for (int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; first < rows;
         first += stride * kRowSteps) {
      P g[kRowSteps], xv[kRowSteps];
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        const int64_t r = first + k * stride;
        if (r < rows) {
          g[k] = load_pack<P, false>(grad + r * channels + c0);
          xv[k] = load_pack<P, false>(x + r * channels + c0);
        }
      }
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        const int64_t r = first + k * stride;
        if (r < rows) {
          P result;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const acc_t xj = xv[k].v[j], sj = s.v[j];
            const acc_t d = grad_v<acc_t>(g[k].v[j], xj, sj, b.v[j], alpha);
            result.v[j] = static_cast<scalar_t>(d * sj);
            sum_d[j] += d;
            sum_dx[j] += d * xj;
          }
          store_pack(grad_x + r * channels + c0, result);
        }
      }
    }
  }
  // The block's ty rows of sums, added in row order by the threads of the first row.
  const int slot = (threadIdx.y * blockDim.x + threadIdx.x) * kVec;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    shared[0][slot + j] = sum_d[j];
    shared[1][slot + j] = sum_dx[j];
  }
  __syncthreads();
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      acc_t d = 0, dx = 0;
      for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
        d += shared[0][(y * blockDim.x + threadIdx.x) * kVec + j];
        dx += shared[1][(y * blockDim.x + threadIdx.x) * kVec + j];
      }
      partials.d[blockIdx.y * channels + c0 + j] = d;
      partials.dx[blockIdx.y * channels + c0 + j] = dx;
    }
  }
}

// NCHW: a (tx, ty) block covers one channel (blockIdx.x % C), a range of its planes' elements (threadIdx.x, kVec
// each; chunk blockIdx.x / C of `hw_per_block`) and a range of the batch ([blockIdx.y * n_per_block, ...),
// threadIdx.y, every ty-th); partial sum k = blockIdx.y * chunks + chunk. kVec > 1 needs hw % kVec == 0 and
// 16-byte aligned pointers.
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreads)
    backward_planes_kernel(int64_t batch, int64_t channels, int64_t hw, int64_t hw_per_block, int64_t n_per_block,
                           opmath_t<scalar_t> alpha, const scalar_t* __restrict__ grad,
                           const scalar_t* __restrict__ x, const scalar_t* __restrict__ scale,
                           const scalar_t* __restrict__ shift, scalar_t* __restrict__ grad_x,
                           Partials<opmath_t<scalar_t>> partials) {
  using acc_t = opmath_t<scalar_t>;
  using P = Pack<scalar_t, kVec>;
  const int64_t c = blockIdx.x % channels, chunk = blockIdx.x / channels;
  const int64_t chunks = gridDim.x / channels;
  const auto s = static_cast<acc_t>(scale[c]);
  const auto b = static_cast<acc_t>(shift[c]);
  const int64_t h_first = chunk * hw_per_block, h_last = std::min(hw, h_first + hw_per_block);
  const int64_t n_first = static_cast<int64_t>(blockIdx.y) * n_per_block;
  const int64_t n_last = std::min(batch, n_first + n_per_block);
  acc_t sum_d = 0, sum_dx = 0;
  for (int64_t n = n_first + threadIdx.y; n < n_last; n += blockDim.y) {
    const int64_t plane = (n * channels + c) * hw;
    for (int64_t h = h_first + threadIdx.x * kVec; h < h_last; h += static_cast<int64_t>(blockDim.x) * kVec) {
      const P g = load_pack<P, false>(grad + plane + h);
      const P xv = load_pack<P, false>(x + plane + h);
      P result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const acc_t xj = xv.v[j];
        const acc_t d = grad_v<acc_t>(g.v[j], xj, s, b, alpha);
        result.v[j] = static_cast<scalar_t>(d * s);
        sum_d += d;
        sum_dx += d * xj;
      }
      store_pack(grad_x + plane + h, result);
    }
  }
  block_sum(sum_d, sum_dx);
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const int64_t k = static_cast<int64_t>(blockIdx.y) * chunks + chunk;
    partials.d[k * channels + c] = sum_d;
    partials.dx[k * channels + c] = sum_dx;
  }
}

// grad_shift[c] = sum of partials.d[k * C + c] over k, grad_scale[c] likewise from partials.dx. A block takes
// kFinishCols consecutive channels (threadIdx.x % kFinishCols), so that a warp's loads of one k are contiguous, and
// splits the k among its slices of threads (slice y adds k = y, y + slices, ...); the slices' sums are added in slice
// order. One thread per channel striding over k read one float per 32-byte sector.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    finish_sums_kernel(int64_t blocks, int64_t channels, Partials<opmath_t<scalar_t>> partials,
                       scalar_t* __restrict__ grad_scale, scalar_t* __restrict__ grad_shift) {
  using acc_t = opmath_t<scalar_t>;
  constexpr int kSlices = kThreads / kFinishCols;
  __shared__ acc_t shared[2][kThreads];
  const int lane = threadIdx.x % kFinishCols, slice = threadIdx.x / kFinishCols;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * kFinishCols; c0 < channels;
       c0 += static_cast<int64_t>(gridDim.x) * kFinishCols) {
    const int64_t c = c0 + lane;
    acc_t d = 0, dx = 0;
    if (c < channels) {
      // Unrolled so that a thread's loads are in flight together rather than one L2 round trip each.
#pragma unroll 8
      for (int64_t k = slice; k < blocks; k += kSlices) {
        d += partials.d[k * channels + c];
        dx += partials.dx[k * channels + c];
      }
    }
    shared[0][threadIdx.x] = d;
    shared[1][threadIdx.x] = dx;
    __syncthreads();
    if (slice == 0 && c < channels) {
      for (int y = 1; y < kSlices; ++y) {
        d += shared[0][y * kFinishCols + lane];
        dx += shared[1][y * kFinishCols + lane];
      }
      grad_shift[c] = static_cast<scalar_t>(d);
      grad_scale[c] = static_cast<scalar_t>(dx);
    }
    __syncthreads();  // the shared sums are reused by the next channels
  }
}

struct BackwardOperands {
  const at::Tensor& grad;
  const at::Tensor& x;
  const at::Tensor& scale;
  const at::Tensor& shift;
  at::Tensor& grad_x;
};

// Launches the NHWC kernel; returns the number of partial sums per channel it writes.
template <typename scalar_t, int kVec>
int64_t launch_backward_rows(const Plan& plan, const BackwardOperands& t, opmath_t<scalar_t> alpha,
                             at::Tensor& partial, cudaStream_t stream) {
  constexpr auto kKernel = backward_rows_kernel<scalar_t, kVec>;
  const int64_t rows = plan.n * plan.hw;
  const int tx = inner_threads(ceil_div(plan.c, kVec)), ty = kThreads / tx;
  const int64_t blocks_x = ceil_div(plan.c, static_cast<int64_t>(tx) * kVec);
  const int64_t resident = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) *
                           blocks_per_sm<kKernel>(kThreads, c10::cuda::current_device());
  const int64_t blocks_y =
      std::clamp<int64_t>(std::min(ceil_div(rows, ty), ceil_div(resident, blocks_x)), 1, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  partial = at::empty({2, blocks_y, plan.c}, t.x.options().dtype(c10::CppTypeToScalarType<opmath_t<scalar_t>>::value));
  auto* p = partial.data_ptr<opmath_t<scalar_t>>();
  kKernel<<<grid, dim3(tx, ty), 0, stream>>>(rows, plan.c, alpha, t.grad.const_data_ptr<scalar_t>(),
                                             t.x.const_data_ptr<scalar_t>(), t.scale.const_data_ptr<scalar_t>(),
                                             t.shift.const_data_ptr<scalar_t>(), t.grad_x.data_ptr<scalar_t>(),
                                             Partials<opmath_t<scalar_t>>{p, p + blocks_y * plan.c});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return blocks_y;
}

// Launches the NCHW kernel; returns the number of partial sums per channel it writes.
template <typename scalar_t, int kVec>
int64_t launch_backward_planes(const Plan& plan, const BackwardOperands& t, opmath_t<scalar_t> alpha,
                               at::Tensor& partial, cudaStream_t stream) {
  const int tx = inner_threads(ceil_div(plan.hw, kVec)), ty = kThreads / tx;
  const int64_t hw_per_block = static_cast<int64_t>(tx) * kVec * kVectorsPerThread;
  const int64_t chunks = ceil_div(plan.hw, hw_per_block);
  const int64_t n_per_block = std::max<int64_t>(ty * kRowsPerThread, ceil_div(plan.n, kMaxGridY));
  const int64_t blocks_y = ceil_div(plan.n, n_per_block);
  TORCH_CHECK(plan.c * chunks <= INT32_MAX, "opforge::affine_leaky_swish_backward: ", plan.c, " channels of ",
              plan.hw, " elements per plane need more blocks than a CUDA grid has. Use channels_last, or split x.");
  const dim3 grid(static_cast<unsigned>(plan.c * chunks), static_cast<unsigned>(blocks_y));
  partial = at::empty({2, blocks_y * chunks, plan.c},
                      t.x.options().dtype(c10::CppTypeToScalarType<opmath_t<scalar_t>>::value));
  auto* p = partial.data_ptr<opmath_t<scalar_t>>();
  backward_planes_kernel<scalar_t, kVec><<<grid, dim3(tx, ty), 0, stream>>>(
      plan.n, plan.c, plan.hw, hw_per_block, n_per_block, alpha, t.grad.const_data_ptr<scalar_t>(),
      t.x.const_data_ptr<scalar_t>(), t.scale.const_data_ptr<scalar_t>(), t.shift.const_data_ptr<scalar_t>(),
      t.grad_x.data_ptr<scalar_t>(), Partials<opmath_t<scalar_t>>{p, p + blocks_y * chunks * plan.c});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return blocks_y * chunks;
}

template <typename scalar_t>
void backward(const Plan& plan, const BackwardOperands& t, at::Tensor& grad_scale, at::Tensor& grad_shift,
              double alpha, cudaStream_t stream) {
  using acc_t = opmath_t<scalar_t>;
  constexpr int kVec = kVectorBytes / sizeof(scalar_t);
  const auto a = static_cast<acc_t>(alpha);
  const bool dense_aligned = aligned(t.grad.const_data_ptr()) && aligned(t.x.const_data_ptr()) &&
                             aligned(t.grad_x.const_data_ptr());
  at::Tensor partial;
  int64_t blocks;
  if (plan.channels_inner) {
    const bool vectors = dense_aligned && plan.c % kVec == 0 && aligned(t.scale.const_data_ptr()) &&
                         aligned(t.shift.const_data_ptr());
    blocks = vectors ? launch_backward_rows<scalar_t, kVec>(plan, t, a, partial, stream)
                     : launch_backward_rows<scalar_t, 1>(plan, t, a, partial, stream);
  } else {
    const bool vectors = dense_aligned && plan.hw % kVec == 0;
    blocks = vectors ? launch_backward_planes<scalar_t, kVec>(plan, t, a, partial, stream)
                     : launch_backward_planes<scalar_t, 1>(plan, t, a, partial, stream);
  }
  auto* p = partial.data_ptr<acc_t>();
  const auto grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(plan.c, kFinishCols), INT32_MAX));
  finish_sums_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(blocks, plan.c, Partials<acc_t>{p, p + blocks * plan.c},
                                                              grad_scale.data_ptr<scalar_t>(),
                                                              grad_shift.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> affine_leaky_swish_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                           const at::Tensor& scale,
                                                                           const at::Tensor& shift, double alpha) {
  check_backward_args(grad, x, scale, shift);
  const c10::cuda::CUDAGuard guard(x.device());
  const Plan plan = plan_for(x);
  at::Tensor grad_x = plan.empty_like_x(x);
  if (grad_x.numel() == 0) {
    // Sums over no elements (at::zeros launches nothing when C is 0 too).
    return {grad_x, at::zeros({plan.c}, scale.options()), at::zeros({plan.c}, shift.options())};
  }
  at::Tensor grad_scale = at::empty({plan.c}, scale.options()), grad_shift = at::empty({plan.c}, shift.options());
  // Autograd hands in whatever layout the next op produced (often contiguous for a channels_last x).
  const at::Tensor gd = plan.dense(grad), xd = plan.dense(x), sd = scale.contiguous(), bd = shift.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index());
  const BackwardOperands operands{gd, xd, sd, bd, grad_x};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::affine_leaky_swish_backward",
                                  [&] { backward<scalar_t>(plan, operands, grad_scale, grad_shift, alpha, stream); });
  return {grad_x, grad_scale, grad_shift};
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("affine_leaky_swish", &affine_leaky_swish);
  m.impl("affine_leaky_swish_backward", &affine_leaky_swish_backward);
}

}  // namespace opforge::cuda
