// CUDA kernels of opforge::affine_leaky_swish and its backward (schemas are defined in ../affine_leaky_swish.cpp).
//
// Forward: one flat loop over x's dense buffer, 16-byte vectors where a vector stays within one channel (NCHW:
// H * W a multiple of the vector width) or covers consecutive channels whose parameters load as a vector too
// (NHWC: C a multiple of it); element by element otherwise. Backward: grad_x elementwise, and the scale/shift
// gradients as per-channel sums without atomics: each block adds its elements in a fixed order into one partial sum
// per channel it covers, and a second kernel adds the partial sums of each channel in a fixed order (column_sums.cuh;
// NHWC is its rows_with_column_sums, channels as columns). The blocks depend on the shape (and, for NHWC, on how
// many fit on the device) alone, so the sums come out bitwise the same on every run.
//
// Memory traffic: the forward reads x and writes y once (scale and shift, one value per channel, from L1/L2); the
// backward reads grad and x and writes grad_x once, plus the partial sums (at most 1/16 of grad_x's bytes, in float)
// written once and read once.
#include <ATen/Dispatch.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "affine_leaky_swish.h"
#include "column_sums.cuh"
#include "elementwise.cuh"

namespace opforge::cuda {
namespace {

using affine_leaky_swish::check_backward_args;
using affine_leaky_swish::check_inputs;
using affine_leaky_swish::Plan;
using affine_leaky_swish::plan_for;
using at::cuda::detail::IntDivider;

// Threads per block of every kernel here (the block reductions assume it): elementwise.cuh's kElementwiseThreads.
constexpr int kThreads = 256;
static_assert(kThreads == kRowThreads, "NCHW blocks are shaped by column_sums.cuh's inner_threads");
// NCHW backward: each thread visits at most this many batch entries and this many vectors along a plane. Untuned:
// enough loads per thread to amortize the block's reduction and its partial-sum writes (1/16 of grad_x's bytes at
// most, in float), few enough that a 56 x 56 x 256 x 32 tensor still makes hundreds of blocks
// (docs/measurements/tuned-constants.md, "affine_leaky_swish NCHW backward").
constexpr int64_t kRowsPerThread = 16;
constexpr int64_t kVectorsPerThread = 8;

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

// NHWC: a row of C channels per pixel, grad_x written elementwise and the two per-channel sums (shift's gradient
// d, scale's d * x) added over the rows by rows_with_column_sums.
template <typename scalar_t>
struct ChannelRows {
  using acc_t = opmath_t<scalar_t>;
  using sum_t = acc_t;
  static constexpr int kSums = 2;  // d, then d * x: the partials' layout that finish_sums reads
  template <int kVec>
  using P = Pack<scalar_t, kVec>;
  template <int kVec>
  struct Column {
    P<kVec> scale, shift;
  };
  template <int kVec>
  struct Row {
    P<kVec> grad, x;
  };

  const scalar_t* __restrict__ grad;
  const scalar_t* __restrict__ x;
  const scalar_t* __restrict__ scale;
  const scalar_t* __restrict__ shift;
  scalar_t* __restrict__ grad_x;
  acc_t alpha;

  template <int kVec>
  __device__ __forceinline__ Column<kVec> column(int64_t c) const {
    return {load_pack<P<kVec>, false>(scale + c), load_pack<P<kVec>, false>(shift + c)};
  }

  template <int kVec>
  __device__ __forceinline__ Row<kVec> load(int64_t i) const {
    return {load_pack<P<kVec>, false>(grad + i), load_pack<P<kVec>, false>(x + i)};
  }

  template <int kVec>
  __device__ __forceinline__ void apply(const Column<kVec>& c, const Row<kVec>& row, int64_t i,
                                        acc_t (&sums)[kSums][kVec]) const {
    P<kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const acc_t xj = row.x.v[j], sj = c.scale.v[j];
      const acc_t d = grad_v<acc_t>(row.grad.v[j], xj, sj, c.shift.v[j], alpha);
      result.v[j] = static_cast<scalar_t>(d * sj);
      sums[0][j] += d;
      sums[1][j] += d * xj;
    }
    store_pack(grad_x + i, result);
  }
};

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

struct BackwardOperands {
  const at::Tensor& grad;
  const at::Tensor& x;
  const at::Tensor& scale;
  const at::Tensor& shift;
  at::Tensor& grad_x;
};

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
  const SumOutputs<scalar_t, 2> sums{{grad_shift.data_ptr<scalar_t>(), grad_scale.data_ptr<scalar_t>()}};
  const bool dense_aligned = aligned(t.grad.const_data_ptr()) && aligned(t.x.const_data_ptr()) &&
                             aligned(t.grad_x.const_data_ptr());
  if (plan.channels_inner) {
    const bool vectors = dense_aligned && plan.c % kVec == 0 && aligned(t.scale.const_data_ptr()) &&
                         aligned(t.shift.const_data_ptr());
    const ChannelRows<scalar_t> op{t.grad.const_data_ptr<scalar_t>(),  t.x.const_data_ptr<scalar_t>(),
                                   t.scale.const_data_ptr<scalar_t>(), t.shift.const_data_ptr<scalar_t>(),
                                   t.grad_x.data_ptr<scalar_t>(),      a};
    const int64_t rows = plan.n * plan.hw;
    vectors ? rows_with_column_sums<kVec>(op, rows, plan.c, sums, t.x.options(), stream)
            : rows_with_column_sums<1>(op, rows, plan.c, sums, t.x.options(), stream);
  } else {
    const bool vectors = dense_aligned && plan.hw % kVec == 0;
    at::Tensor partial;
    const int64_t parts = vectors ? launch_backward_planes<scalar_t, kVec>(plan, t, a, partial, stream)
                                  : launch_backward_planes<scalar_t, 1>(plan, t, a, partial, stream);
    sum_partials(partial.const_data_ptr<acc_t>(), parts, plan.c, sums, stream);
  }
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
