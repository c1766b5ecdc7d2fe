// Per-column sums over the rows of a matrix, without atomics and bitwise the same on every run: a backward that
// writes one gradient elementwise and reduces another over the rows (a weight, a per-channel scale, a per-feature
// target). Blocks add their rows' terms in registers and write one row of partial sums each; the partial rows of a
// column are then added in a fixed order, in double. The blocks depend on the shape (and on how many fit on the
// device) alone, so the order never changes.
//
// sum_partial_columns is the second step, inside a kernel of the caller's (rms_norm's cooperative backward) or as
// sum_partials' kernel; rows_with_column_sums runs both steps for a row-wise function given as an Op (below).
// load_sums and store_sums read and write partial sums 16 bytes at a time.
//
// Memory traffic: the rows' inputs read once and their elementwise outputs written once; the partial rows (one per
// block, cols sums each) written once and read once, a few MiB where the rows move tens.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "elementwise.cuh"

namespace opforge::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The sums of a reduction over rows: float for float16/bfloat16, double for float32 and float64. A float32 sum of one
// term per row over all rows, in float, grows each term's rounding (of the product, about 1e-7 relative) with the
// square root of the rows: 1.8e-5 absolute at 32768 rows, outside float32's tolerance. In double the cost is
// registers, not arithmetic (docs/measurements/kernel-notes.md, "sum_t in double").
template <typename T>
using sum_t = std::conditional_t<std::is_same_v<T, float>, double, opmath_t<T>>;

// Where the column sums go: kSums outputs of `cols` elements each.
template <typename T, int kSums>
struct SumOutputs {
  T* out[kSums];
};

// The partial rows' columns are added by tiles of columns, the blocks taking turns at the tiles; a tile is as
// narrow as covers the row in one pass of the blocks (so that all of a thread's loads go out together), but at
// least kMinSumCols wide (64-byte runs of float partials): fixed 16-column tiles made rms_norm's fused sum at hidden
// 8192 twice as slow as a kernel of its own (docs/measurements/kernel-notes.md, "kMinSumCols").
constexpr int kMinSumCols = 16;

// A column's sum, added in double, as the output's type, through the math type (float for float16/bfloat16):
// sum_partials and rows_kernel's one-block case write it the same way.
template <typename T>
__device__ __forceinline__ T column_sum_as(double total) {
  return static_cast<T>(static_cast<opmath_t<T>>(total));
}

// Columns a thread adds from one 16-byte load of partial sums (4 floats, 2 doubles), or 1 where the columns or the
// pointer do not allow 16-byte loads.
template <typename part_t>
constexpr int kSumPack = kVectorBytes / static_cast<int>(sizeof(part_t));

// Partial-row loads a thread issues at once per column sum, all before the first is added: as many as fit 32
// registers. 16 loads cost a 17-row slice two L2 round trips; 64 registers' worth halved the scalar fallback's blocks
// per SM (docs/measurements/kernel-notes.md, "sum_loads").
template <int kSums, int kPack, typename part_t>
constexpr int sum_loads() {
  return 32 * 4 / (kSums * kPack * static_cast<int>(sizeof(part_t)));
}

template <int kPack, typename part_t>
__device__ __forceinline__ void load_sums(const part_t* p, part_t (&v)[kPack]) {
  if constexpr (kPack == 1) {
    v[0] = *p;
  } else if constexpr (std::is_same_v<part_t, float>) {
    const float4 r = *reinterpret_cast<const float4*>(p);
    v[0] = r.x, v[1] = r.y, v[2] = r.z, v[3] = r.w;
  } else {
    static_assert(std::is_same_v<part_t, double> && kPack == 2, "16 bytes of floats or doubles");
    const double2 r = *reinterpret_cast<const double2*>(p);
    v[0] = r.x, v[1] = r.y;
  }
}

// Stores n sums at p: 16 bytes at a time where they fill whole 16-byte vectors (p must then be 16-byte aligned), one
// at a time otherwise.
template <typename Sum, int n>
__device__ __forceinline__ void store_sums(Sum* p, const Sum (&v)[n]) {
  if constexpr (std::is_same_v<Sum, float> && n % 4 == 0) {
#pragma unroll
    for (int k = 0; k < n; k += 4) {
      *reinterpret_cast<float4*>(p + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
    }
  } else if constexpr (std::is_same_v<Sum, double> && n % 2 == 0) {
#pragma unroll
    for (int k = 0; k < n; k += 2) {
      *reinterpret_cast<double2*>(p + k) = make_double2(v[k], v[k + 1]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < n; ++k) {
      p[k] = v[k];
    }
  }
}

// A tile's narrowest width in threads: kMinSumCols columns.
template <int kPack>
constexpr int kMinSumWidth = std::max(1, kMinSumCols / kPack);

// Not std::countr_zero: that is C++20, and torch 2.11 builds extensions as C++17.
constexpr int log2_of_power_of_two(unsigned value) { return value <= 1 ? 0 : 1 + log2_of_power_of_two(value >> 1); }

// The shared memory sum_partial_columns needs, in doubles.
template <int kThreads, int kSums, int kPack>
constexpr int kSumScratch = kSums * kThreads * kPack;

// outputs.out[k][c] = the sum over p of partial[(k * parts + p) * cols + c], in a fixed order, by `blocks` blocks of
// kThreads threads (this one is block `block`), kPack adjacent columns per thread: kSumPack<part_t> (16-byte loads)
// needs cols % kPack == 0 and `partial` 16-byte aligned. A tile is `width` threads across (width * kPack columns) and
// kThreads / width slices down; slice y adds partial rows y, y + slices, ... of its columns. The slices are then
// added in a fixed tree: by xor shuffles among the slices that share a warp, then in warp (or slice) order through
// `groups_sums`, kSumScratch doubles of shared memory (a kernel that is done with its own shared memory lends it).
template <int kThreads, int kPack, int kSums, typename T, typename part_t>
__device__ __forceinline__ void sum_partial_columns(const part_t* __restrict__ partial, int64_t parts, int64_t cols,
                                                    SumOutputs<T, kSums> outputs, int64_t block, int64_t blocks,
                                                    double* groups_sums) {
  constexpr int kWarpThreads = 32;
  constexpr int kWarpBits = log2_of_power_of_two(kWarpThreads);
  constexpr int kThreadBits = log2_of_power_of_two(kThreads);
  constexpr int kMinWidthBits = log2_of_power_of_two(kMinSumWidth<kPack>);
  static_assert(kThreads % kWarpThreads == 0 && (kThreads & (kThreads - 1)) == 0, "power-of-two tiles");
  static_assert((kMinSumWidth<kPack> & (kMinSumWidth<kPack> - 1)) == 0, "power-of-two tile widths");
  const int64_t packs = cols / kPack;
  // Widths, slices and spans are powers of two: the thread's place in the tile takes shifts and masks, not divisions
  // by a width known only at run time.
  int width_bits = kMinWidthBits;
  while (width_bits < kThreadBits && (int64_t{1} << width_bits) * blocks < packs) {
    ++width_bits;
  }
  const int width = 1 << width_bits;
  const int slice_bits = kThreadBits - width_bits;
  const int slices = 1 << slice_bits;
  const int lane = static_cast<int>(threadIdx.x) & (width - 1);
  const int slice = static_cast<int>(threadIdx.x) >> width_bits;
  // Threads [g * span, (g + 1) * span) hold one value per column after the shuffles: a warp's, or a slice's where a
  // slice spans warps. The first `width` threads of each span write it.
  const int span_bits = std::max(width_bits, kWarpBits);
  const int groups = kThreads >> span_bits;
  const int group = static_cast<int>(threadIdx.x) >> span_bits;
  // The slice's partial rows (slice, slice + slices, ...; parts is a grid's size, so it fits an int), reached by
  // stepping a pointer rather than by 64-bit index arithmetic per load. Every thread of every resident block runs
  // this at once after rms_norm's grid barrier, so its instructions may set the time more than its bytes do
  // (docs/measurements/kernel-notes.md, "sum_partial_columns instructions").
  const int slice_rows = parts > slice ? static_cast<int>(((parts - 1 - slice) >> slice_bits) + 1) : 0;
  const int64_t row_step = slices * cols;
  const int64_t sum_step = parts * cols;
  constexpr int kLoads = sum_loads<kSums, kPack, part_t>();
  for (int64_t t = block; t * width < packs; t += blocks) {
    const int64_t pack = t * width + lane;
    const int64_t col = pack * kPack;
    double s[kSums][kPack] = {};
    if (pack < packs) {
      // Steps to each row just before loading it, so that it never points past the slice's last row; a batch
      // stops at the slice's last row rather than loading zeros past it.
      const part_t* row = partial + slice * cols + col;
      for (int left = slice_rows; left > 0; left -= kLoads) {
        part_t v[kSums][kLoads][kPack];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          if (i == left) {
            break;
          }
          if (i > 0 || left != slice_rows) {
            row += row_step;
          }
#pragma unroll
          for (int k = 0; k < kSums; ++k) {
            load_sums<kPack>(row + k * sum_step, v[k][i]);
          }
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          if (i == left) {
            break;
          }
#pragma unroll
          for (int k = 0; k < kSums; ++k) {
#pragma unroll
            for (int j = 0; j < kPack; ++j) {
              s[k][j] += static_cast<double>(v[k][i][j]);
            }
          }
        }
      }
    }
    // xor partners hold the same columns; a + b and b + a round alike, so every lane gets the same bits.
    for (int offset = width; offset < kWarpThreads; offset *= 2) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) {
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
          s[k][j] += __shfl_xor_sync(0xffffffffu, s[k][j], offset);
        }
      }
    }
    if ((static_cast<int>(threadIdx.x) & ((1 << span_bits) - 1)) < width) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) {
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
          groups_sums[(k * kThreads + group * width + lane) * kPack + j] = s[k][j];
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < width && pack < packs) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) {
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
          double total = 0.0;
          for (int g = 0; g < groups; ++g) {
            total += groups_sums[(k * kThreads + g * width + lane) * kPack + j];
          }
          outputs.out[k][col + j] = column_sum_as<T>(total);
        }
      }
    }
    __syncthreads();  // groups_sums is reused by the next columns
  }
}

// The partial rows' sum as a kernel of its own.
constexpr int kSumThreads = 512;

template <int kPack, int kSums, typename T, typename part_t>
__global__ void __launch_bounds__(kSumThreads)
    sum_partials_kernel(const part_t* __restrict__ partial, int64_t parts, int64_t cols, SumOutputs<T, kSums> outputs) {
  __shared__ double groups_sums[kSumScratch<kSumThreads, kSums, kPack>];
  sum_partial_columns<kSumThreads, kPack>(partial, parts, cols, outputs, blockIdx.x, gridDim.x, groups_sums);
}

// The standalone sum's grid: tiles as wide as leave each thread one batch of loads (slices >= parts / kLoads), then
// narrower while the grid would not give every SM two blocks (a floor not tuned on its own, measured only as part
// of the change that brought it; docs/measurements/kernel-notes.md, "sum_partials grid").
template <int kPack, int kSums, typename part_t>
int64_t sum_partials_grid(int64_t parts, int64_t cols) {
  constexpr int kLoads = sum_loads<kSums, kPack, part_t>();
  constexpr int kMinWidth = kMinSumWidth<kPack>;
  int slices = 1;
  while (slices * kMinWidth < kSumThreads && static_cast<int64_t>(slices) * kLoads < parts) {
    slices *= 2;
  }
  const int64_t packs = cols / kPack;
  const int64_t min_grid = 2 * static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  int width = kSumThreads / slices;
  while (width > kMinWidth && ceil_div(packs, width) < min_grid) {
    width /= 2;
  }
  return std::min<int64_t>(ceil_div(packs, width), INT32_MAX);
}

template <int kPack, int kSums, typename T, typename part_t>
void launch_sum_partials(const part_t* partial, int64_t parts, int64_t cols, SumOutputs<T, kSums> outputs,
                         cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(sum_partials_grid<kPack, kSums, part_t>(parts, cols));
  sum_partials_kernel<kPack, kSums, T, part_t><<<grid, kSumThreads, 0, stream>>>(partial, parts, cols, outputs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The partial rows' column sums on `stream`: 16 bytes of partial sums per load where the columns come in whole
// 16-byte vectors and `partial` is 16-byte aligned (as allocated), one sum at a time otherwise.
template <int kSums, typename T, typename part_t>
void sum_partials(const part_t* partial, int64_t parts, int64_t cols, SumOutputs<T, kSums> outputs,
                  cudaStream_t stream) {
  constexpr int kPack = kSumPack<part_t>;
  if (cols % kPack == 0 && aligned(partial)) {
    launch_sum_partials<kPack>(partial, parts, cols, outputs, stream);
  } else {
    launch_sum_partials<1>(partial, parts, cols, outputs, stream);
  }
}

// ------------------------------------------------------------------------------------ rows_with_column_sums

// Threads per block of rows_kernel.
constexpr int kRowThreads = 256;
// Row steps whose loads a thread issues together. 4 steps of two 16-byte loads hold 8 loads in flight per thread,
// as many as the elementwise kernels' fastest shape keeps per SM: affine_leaky_swish's NHWC backward needed them
// (docs/measurements/kernel-notes.md, "kRowSteps").
constexpr int kRowSteps = 4;
// Each block's rows are at least this many row steps, so that a partial row (cols sums, written once and read once
// more) is spread over at least this many rows of the inputs: 32 beat 8 and 2 (docs/measurements/kernel-notes.md,
// "min row steps").
constexpr int kMinRowStepsPerPartial = 32;
// gridDim.y's hardware limit.
constexpr int64_t kMaxGridY = 65535;

// The smallest power of two >= n, capped at kRowThreads: a block's threads along its inner dimension.
inline int inner_threads(int64_t n) {
  int t = 1;
  while (t < kRowThreads && t < n) {
    t *= 2;
  }
  return t;
}

// An Op of rows_with_column_sums, for a row-major matrix of `cols` columns, kVec consecutive columns at a time:
//   sum_t                    the sums' type
//   kSums                    how many sums per column it adds up
//   Column<kVec>             what it reads once per column (a weight), from column(c0)
//   Row<kVec>                what it reads per row, from load(i) (i = row * cols + c0, the first column's index)
//   apply(column, row, i, sums)  computes the row's values, stores its elementwise outputs at i and adds each
//                            column's terms to sums[k][j]
//
// A (tx, ty) block covers tx * kVec consecutive columns (threadIdx.x, kVec each) and loops over row steps of ty
// consecutive rows (threadIdx.y): steps blockIdx.y, blockIdx.y + gridDim.y, ..., kRowSteps of them at a time (all
// their loads issued before any is used); it writes partial row blockIdx.y of each sum, or, where `partial` is null
// (gridDim.y == 1), the sums themselves to `outputs`, as sum_partials would from that one partial row. kVec > 1 needs
// cols % kVec == 0 and 16-byte aligned pointers.
template <int kVec, typename Op, typename T>
__global__ void __launch_bounds__(kRowThreads)
    rows_kernel(int64_t rows, int64_t cols, Op op, typename Op::sum_t* __restrict__ partial,
                SumOutputs<T, Op::kSums> outputs) {
  using part_t = typename Op::sum_t;
  constexpr int kSums = Op::kSums;
  __shared__ part_t shared[kSums][kRowThreads * kVec];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  const bool active = c0 < cols;
  part_t sums[kSums][kVec] = {};
  if (active) {
    const auto column = op.template column<kVec>(c0);
    const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
    for (int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; first < rows;
         first += stride * kRowSteps) {
      typename Op::template Row<kVec> loaded[kRowSteps];
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        const int64_t r = first + k * stride;
        if (r < rows) {
          loaded[k] = op.template load<kVec>(r * cols + c0);
        }
      }
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        const int64_t r = first + k * stride;
        if (r < rows) {
          op.apply(column, loaded[k], r * cols + c0, sums);
        }
      }
    }
  }
  // The block's ty rows of sums, added in row order by the threads of the first row.
  const int slot = (threadIdx.y * blockDim.x + threadIdx.x) * kVec;
#pragma unroll
  for (int s = 0; s < kSums; ++s) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      shared[s][slot + j] = sums[s][j];
    }
  }
  __syncthreads();
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int s = 0; s < kSums; ++s) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        part_t total = 0;
        for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
          total += shared[s][(y * blockDim.x + threadIdx.x) * kVec + j];
        }
        if (partial != nullptr) {
          partial[(s * gridDim.y + blockIdx.y) * cols + c0 + j] = total;
        } else {
          outputs.out[s][c0 + j] = column_sum_as<T>(static_cast<double>(total));
        }
      }
    }
  }
}

// Runs `op` over `rows` rows of `cols` columns on `stream` and writes its column sums to `outputs`: rows_kernel on
// as many blocks as fit on the device at once (fewer where rows are few: see kMinRowStepsPerPartial), then
// sum_partials (where there is more than one block of rows: with one, rows_kernel writes the sums). `options` gives
// the partial sums' device.
template <int kVec, typename Op, typename T, int kSums>
void rows_with_column_sums(const Op& op, int64_t rows, int64_t cols, SumOutputs<T, kSums> outputs,
                           const at::TensorOptions& options, cudaStream_t stream) {
  static_assert(kSums == Op::kSums, "one output per sum");
  using part_t = typename Op::sum_t;
  constexpr auto kKernel = rows_kernel<kVec, Op, T>;
  const int tx = inner_threads(ceil_div(cols, kVec)), ty = kRowThreads / tx;
  const int64_t blocks_x = ceil_div(cols, static_cast<int64_t>(tx) * kVec);
  TORCH_CHECK(blocks_x <= INT32_MAX, "opforge: ", cols, " columns need more blocks than a CUDA grid has.");
  const int64_t resident = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) *
                           blocks_per_sm<kKernel>(kRowThreads, c10::cuda::current_device());
  const int64_t blocks_y = std::clamp<int64_t>(
      std::min(ceil_div(rows, int64_t{ty} * kMinRowStepsPerPartial), ceil_div(resident, blocks_x)), 1, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  if (blocks_y == 1) {
    kKernel<<<grid, dim3(tx, ty), 0, stream>>>(rows, cols, op, nullptr, outputs);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  at::Tensor partial = at::empty({Op::kSums, blocks_y, cols}, options.dtype(c10::CppTypeToScalarType<part_t>::value));
  // The caching allocator orders partial's reuse after the kernels queued here on `stream`.
  kKernel<<<grid, dim3(tx, ty), 0, stream>>>(rows, cols, op, partial.data_ptr<part_t>(), outputs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  sum_partials(partial.const_data_ptr<part_t>(), blocks_y, cols, outputs, stream);
}

}  // namespace opforge::cuda
