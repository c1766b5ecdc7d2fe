// opforge::rms_norm(x, weight, eps) = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dimension, and its
// backward as ops of their own, so that autograd and torch.compile (registered in opforge/ops/rms_norm.py) see real
// ops. The backward recomputes each row's 1 / rms from x, which it reads anyway: the forward writes nothing but y,
// and autograd keeps nothing but x and weight alive.
//
//   rms_norm_backward(grad, x, weight, eps) -> (grad_x, grad_weight)
//   rms_norm_backward_input(grad, x, weight, eps) -> grad_x      (a frozen weight: no cross-row reduction at all)
//
// With r = 1 / sqrt(mean(x^2) + eps) per row and n = x.size(-1):
//   grad_x      = r * (grad * weight - x * r^2 * sum(grad * weight * x) / n)
//   grad_weight = sum over rows of grad * x * r
//
// Rows are split across threads; each row is summed, then normalized while it is still in cache. Memory traffic:
// the forward reads x and writes y once (the weight, read by every row, from cache); the backward reads grad and x
// and writes grad_x once, adding grad_weight's terms into one row of double partial sums per chunk of rows.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "elementwise.h"
#include "rms_norm.h"

namespace opforge::cpu {
namespace {

using rms_norm::check_backward_args;
using rms_norm::check_input;
using rms_norm::contiguous_like;
using rms_norm::Rows;
using rms_norm::rows_of;

// Row sums are accumulated in this many independent lanes, element i into lane i % kLanes, and the lanes are added
// in a fixed tree at the end. GCC does not vectorize a plain `sum += v[i] * v[i]` without -ffast-math (it may not
// reorder the additions); written over lanes the loop becomes four 8-float FMA chains with AVX2. The order depends on
// the row length alone, never on alignment or threads, so results are reproducible bit for bit.
constexpr int64_t kLanes = 32;

// The backward's arithmetic: float for float16/bfloat16, double for float32 and float64. The weight gradient of a
// float32 x sums a term per row over every row; computed in float, 4096 x 4096 inputs came out up to 9e-5 off the
// float64 result (76 of 4096 elements outside float32's tolerance, F.rms_norm 35, torch.compile 1239) and
// 32768 x 4096 up to 1.7e-4, from the rounding of the running sums and of each row's 1 / rms. In double only the
// final rounding to float32 remains (0 of 4096 outside the tolerance at either size), at no cost in bandwidth.
template <typename scalar_t>
using backward_acc_t = std::conditional_t<std::is_same_v<scalar_t, float>, double, opmath_t<scalar_t>>;

template <typename acc_t>
acc_t add_lanes(acc_t (&lanes)[kLanes]) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t l = 0; l < width; ++l) {
      lanes[l] += lanes[l + width];
    }
  }
  return lanes[0];
}

// A row is summed in blocks of this many elements: lanes of sum_t within a block, the blocks' sums added in double.
// A lane thus adds at most kSumBlock / kLanes terms in a row, whatever the width: summed in one float run, a lane of
// a 1 x 2^22 float32 row added 131,072 squares and the row came out 8.6e-6 off (982,233 of 4,194,304 elements
// outside float32's tolerance; `opforge bench rms_norm --sizes 2**22`, 2026-12-07). At hidden <= 4096 a row is one
// block, as before.
constexpr int64_t kSumBlock = 4096;

template <typename sum_t, typename acc_t>
sum_t block_sum_of_squares(const acc_t* x, int64_t n) {
  sum_t lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const auto v = static_cast<sum_t>(x[i + l]);
      lanes[l] += v * v;
    }
  }
  for (int64_t l = 0; i + l < n; ++l) {
    const auto v = static_cast<sum_t>(x[i + l]);
    lanes[l] += v * v;
  }
  return add_lanes(lanes);
}

template <typename sum_t, typename acc_t>
double sum_of_squares(const acc_t* x, int64_t n) {
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += kSumBlock) {
    total += block_sum_of_squares<sum_t>(x + begin, std::min(kSumBlock, n - begin));
  }
  return total;
}

// sum(x^2) and sum(g * w * x) of one block in one pass, in sum_t, added to xx and gwx.
template <typename sum_t, typename acc_t>
void add_block_backward_sums(const acc_t* g, const acc_t* x, const acc_t* w, int64_t n, double& xx, double& gwx) {
  sum_t lanes_xx[kLanes] = {};
  sum_t lanes_gwx[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const auto xv = static_cast<sum_t>(x[i + l]);
      lanes_xx[l] += xv * xv;
      lanes_gwx[l] += static_cast<sum_t>(g[i + l]) * static_cast<sum_t>(w[i + l]) * xv;
    }
  }
  for (int64_t l = 0; i + l < n; ++l) {
    const auto xv = static_cast<sum_t>(x[i + l]);
    lanes_xx[l] += xv * xv;
    lanes_gwx[l] += static_cast<sum_t>(g[i + l]) * static_cast<sum_t>(w[i + l]) * xv;
  }
  xx += add_lanes(lanes_xx);
  gwx += add_lanes(lanes_gwx);
}

// sum(x^2) and sum(g * w * x) of a row, block by block (kSumBlock).
template <typename sum_t, typename acc_t>
void backward_sums(const acc_t* g, const acc_t* x, const acc_t* w, int64_t n, double& xx, double& gwx) {
  xx = 0;
  gwx = 0;
  for (int64_t begin = 0; begin < n; begin += kSumBlock) {
    add_block_backward_sums<sum_t>(g + begin, x + begin, w + begin, std::min(kSumBlock, n - begin), xx, gwx);
  }
}

inline double inverse_rms(double sum_xx, int64_t n, double eps) {
  return 1.0 / std::sqrt(sum_xx / static_cast<double>(n) + eps);
}

// A row's 1 / rms. Its squares are summed in acc_t and, only when a block's sum overflows, again in double: a float32
// or bfloat16 row holding a value past ~1.8e19 squares to inf in float, and the row came out as zeros (as
// F.rms_norm's and the spec's reference run in float32 still do), where its norm is finite: rows 3e30 and +-3.4e38
// of width 1, weight 1, gave 0 and now +-1 (tests/ops/test_rms_norm.py). An ordinary row pays one isfinite per row.
template <typename acc_t>
acc_t row_inverse_rms(const acc_t* x, int64_t n, acc_t eps) {
  const double sum = sum_of_squares<acc_t>(x, n);
  const double sum_in_range = std::isfinite(sum) ? sum : sum_of_squares<double>(x, n);
  return static_cast<acc_t>(inverse_rms(sum_in_range, n, static_cast<double>(eps)));
}

// A few wide rows (at most kMinChunkRows rows of more than kSumBlock) are split by columns. One task per row left
// threads idle and widened each row whole into scratch of its width, mapped fresh on every call: one 1 x 2^22
// float32 row took 1.6x (forward) and 6x (backward) the time of F.rms_norm on 2 threads. Split, a row's blocks are
// summed in parallel and added in block order, then its columns computed block by block in parallel, with the
// arithmetic, and its order, of one task per row; at most kMinChunkRows rows keeps the weight gradient's additions
// those of the one chunk chunk_column_sums would make of them.
inline bool split_by_columns(const Rows& shape) {
  return shape.hidden > kSumBlock && shape.rows <= kMinChunkRows;
}

inline int64_t block_count(int64_t n) {
  return (n + kSumBlock - 1) / kSumBlock;
}

// The weight as acc_t, widened once per call rather than once per row.
template <typename scalar_t, typename acc_t>
const acc_t* widened_weight(const at::Tensor& weight, std::vector<acc_t>& storage) {
  const scalar_t* w = weight.const_data_ptr<scalar_t>();
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    return w;
  } else {
    storage.resize(weight.numel());
    at::vec::convert(w, storage.data(), weight.numel());
    return storage.data();
  }
}

// The column blocks of a row split by columns: fn(first, length, scratch) for each block of at most kSumBlock
// columns, in parallel, with `scratch_blocks` blocks of acc_t scratch per task. Widening block by block keeps a
// task's scratch at one block, below malloc's mmap threshold: tasks of 32,768 columns each mapped and page-faulted
// fresh scratch, and a 1 x 2^22 bfloat16 forward took 4x the time of 1024 x 4096 rows.
template <typename acc_t, typename Fn>
void for_column_blocks(int64_t rows, int64_t n, int64_t scratch_blocks, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (rows * kSumBlock));
  at::parallel_for(0, block_count(n), grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scratch(scratch_blocks * kSumBlock);
    for (int64_t b = begin; b < end; ++b) {
      fn(b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock), scratch.data());
    }
  });
}

// A row's sums of a row split by columns: sum_block(sum_t{}, first, length, scratch, xx, gwx) adds each block's, in
// sum_t, to its own pair; the pairs are added in block order, as sum_of_squares and backward_sums add them. The blocks
// are summed in acc_t and, when a block's squares overflow it, again in double, as row_inverse_rms does.
template <typename acc_t, typename SumBlock>
void parallel_block_sums(int64_t n, int64_t scratch_blocks, const SumBlock& sum_block, double& xx, double& gwx) {
  std::vector<double> block_xx(block_count(n)), block_gwx(block_count(n));
  const auto sums_in = [&](auto sum_type) {
    std::fill(block_xx.begin(), block_xx.end(), 0.0);
    std::fill(block_gwx.begin(), block_gwx.end(), 0.0);
    for_column_blocks<acc_t>(1, n, scratch_blocks, [&](int64_t first, int64_t length, acc_t* scratch) {
      sum_block(sum_type, first, length, scratch, block_xx[first / kSumBlock], block_gwx[first / kSumBlock]);
    });
    xx = 0;
    gwx = 0;
    for (size_t b = 0; b < block_xx.size(); ++b) {
      xx += block_xx[b];
      gwx += block_gwx[b];
    }
  };
  sums_in(acc_t{});
  if (!std::isfinite(xx)) {
    sums_in(double{});
  }
}

template <typename scalar_t, typename acc_t>
void forward_split_rows(const scalar_t* x, const scalar_t* w, scalar_t* y, Rows shape, acc_t eps) {
  constexpr bool kWide = std::is_same_v<scalar_t, acc_t>;
  const int64_t n = shape.hidden;
  for (int64_t row = 0; row < shape.rows; ++row) {
    const scalar_t* xr = x + row * n;
    scalar_t* yr = y + row * n;
    double sum, unused;
    parallel_block_sums<acc_t>(
        n, kWide ? 0 : 1,
        [&](auto sum_type, int64_t first, int64_t length, acc_t* scratch, double& block, double&) {
          block += block_sum_of_squares<decltype(sum_type)>(widened(xr + first, length, scratch), length);
        },
        sum, unused);
    const auto r = static_cast<acc_t>(inverse_rms(sum, n, static_cast<double>(eps)));
    for_column_blocks<acc_t>(1, n, kWide ? 0 : 2, [&](int64_t first, int64_t length, acc_t* scratch) {
      const acc_t* wb = widened(w + first, length, scratch);
      if constexpr (kWide) {
        for (int64_t i = 0; i < length; ++i) {
          yr[first + i] = (xr[first + i] * r) * wb[i];
        }
      } else {
        acc_t* out = scratch + kSumBlock;
        at::vec::convert(xr + first, out, length);
        for (int64_t i = 0; i < length; ++i) {
          out[i] = (out[i] * r) * wb[i];
        }
        at::vec::convert(out, yr + first, length);
      }
    });
  }
}

template <typename scalar_t>
void forward_rows(const scalar_t* x, const at::Tensor& weight, scalar_t* y, Rows shape, double eps) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t n = shape.hidden;
  const auto e = static_cast<acc_t>(eps);
  if (split_by_columns(shape)) {
    forward_split_rows(x, weight.const_data_ptr<scalar_t>(), y, shape, e);
    return;
  }
  std::vector<acc_t> weight_storage;
  const acc_t* w = widened_weight<scalar_t, acc_t>(weight, weight_storage);
  at::parallel_for(0, shape.rows, row_grain(n), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scratch(std::is_same_v<scalar_t, acc_t> ? 0 : n);
    for (int64_t row = begin; row < end; ++row) {
      const acc_t* xr = widened(x + row * n, n, scratch.data());
      const acc_t r = row_inverse_rms(xr, n, e);
      if constexpr (std::is_same_v<scalar_t, acc_t>) {
        scalar_t* yr = y + row * n;
        for (int64_t i = 0; i < n; ++i) {
          yr[i] = (xr[i] * r) * w[i];
        }
      } else {
        // In place in the widened row (the same element is read, then written), narrowed once at the end.
        acc_t* out = scratch.data();
        for (int64_t i = 0; i < n; ++i) {
          out[i] = (out[i] * r) * w[i];
        }
        at::vec::convert(out, y + row * n, n);
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_input(x, weight, "opforge::rms_norm");
  at::Tensor y = contiguous_like(x);
  const Rows shape = rows_of(x);
  if (shape.empty()) {
    return y;
  }
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::rms_norm", [&] {
    forward_rows<scalar_t>(xc.const_data_ptr<scalar_t>(), wc, y.data_ptr<scalar_t>(), shape, eps);
  });
  return y;
}

// A backward row's factors from its sums in double, sum(x^2) and sum(g * w * x): r = 1 / rms and
// c = r^2 * sum(g * w * x) / n, in acc_t.
template <typename acc_t>
void factors_of_sums(double xx, double gwx, int64_t n, acc_t eps, acc_t& r, acc_t& c) {
  const double wide_r = inverse_rms(xx, n, static_cast<double>(eps));
  r = static_cast<acc_t>(wide_r);
  c = static_cast<acc_t>(wide_r * wide_r * gwx / static_cast<double>(n));
}

// A row's r = 1 / rms and c = r^2 * sum(g * w * x) / n, from sums in acc_t or, when the squares overflow it (a
// bfloat16 row past ~1.8e19; float32's backward sums in double already), from sums in double, as the forward does
// (row_inverse_rms): such a row's gradient came out NaN.
template <typename acc_t>
void row_backward_factors(const acc_t* g, const acc_t* x, const acc_t* w, int64_t n, acc_t eps, acc_t& r, acc_t& c) {
  double xx, gwx;
  backward_sums<acc_t>(g, x, w, n, xx, gwx);
  if (!std::isfinite(xx)) {
    backward_sums<double>(g, x, w, n, xx, gwx);
  }
  factors_of_sums(xx, gwx, n, eps, r, c);
}

// grad_x for the rows [begin, end) and, when `partial` is given, their sum of grad * x * r added to it (in row
// order, one value per column).
template <typename scalar_t, typename acc_t>
void backward_rows(const scalar_t* g, const scalar_t* x, const acc_t* w, scalar_t* gx, double* partial,
                   int64_t begin, int64_t end, int64_t n, acc_t eps) {
  constexpr bool kWide = std::is_same_v<scalar_t, acc_t>;
  std::vector<acc_t> scratch(kWide ? 0 : 3 * n);
  acc_t* g_scratch = scratch.data();
  acc_t* x_scratch = kWide ? nullptr : g_scratch + n;
  acc_t* out_scratch = kWide ? nullptr : g_scratch + 2 * n;
  for (int64_t row = begin; row < end; ++row) {
    const acc_t* gr = widened(g + row * n, n, g_scratch);
    const acc_t* xr = widened(x + row * n, n, x_scratch);
    acc_t r, c;
    row_backward_factors(gr, xr, w, n, eps, r, c);
    acc_t* out = out_scratch;
    if constexpr (kWide) {
      out = gx + row * n;
    }
    for (int64_t i = 0; i < n; ++i) {
      out[i] = r * (gr[i] * w[i] - xr[i] * c);
    }
    if constexpr (!kWide) {
      at::vec::convert(out, gx + row * n, n);
    }
    if (partial != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        partial[i] += gr[i] * (xr[i] * r);
      }
    }
  }
}

// The backward of rows split by columns (split_by_columns): each row's r and c from its blocks' sums, then grad_x and
// grad_weight block of columns by block, the rows in order, as backward_rows and chunk_column_sums's one chunk.
template <typename scalar_t, typename acc_t>
void backward_split_rows(const scalar_t* g, const scalar_t* x, const scalar_t* w, scalar_t* gx, scalar_t* gw,
                         Rows shape, acc_t eps) {
  constexpr bool kWide = std::is_same_v<scalar_t, acc_t>;
  const int64_t n = shape.hidden;
  std::vector<acc_t> r(shape.rows), c(shape.rows);
  for (int64_t row = 0; row < shape.rows; ++row) {
    double xx, gwx;
    parallel_block_sums<acc_t>(
        n, kWide ? 0 : 3,
        [&](auto sum_type, int64_t first, int64_t length, acc_t* scratch, double& block_xx, double& block_gwx) {
          // Scratch only where the elements are widened (kWide: none, and no offsets into it).
          const acc_t* gb = widened(g + row * n + first, length, scratch);
          const acc_t* xb = widened(x + row * n + first, length, kWide ? scratch : scratch + kSumBlock);
          const acc_t* wb = widened(w + first, length, kWide ? scratch : scratch + 2 * kSumBlock);
          add_block_backward_sums<decltype(sum_type)>(gb, xb, wb, length, block_xx, block_gwx);
        },
        xx, gwx);
    factors_of_sums(xx, gwx, n, eps, r[row], c[row]);
  }
  for_column_blocks<acc_t>(shape.rows, n, kWide ? 0 : 4, [&](int64_t first, int64_t length, acc_t* scratch) {
    double partial[kSumBlock];
    std::fill_n(partial, length, 0.0);
    const acc_t* wb = widened(w + first, length, scratch);
    for (int64_t row = 0; row < shape.rows; ++row) {
      const int64_t at = row * n + first;
      const acc_t* gr = widened(g + at, length, kWide ? scratch : scratch + kSumBlock);
      const acc_t* xr = widened(x + at, length, kWide ? scratch : scratch + 2 * kSumBlock);
      acc_t* out = kWide ? nullptr : scratch + 3 * kSumBlock;
      if constexpr (kWide) {
        out = gx + at;
      }
      for (int64_t i = 0; i < length; ++i) {
        out[i] = r[row] * (gr[i] * wb[i] - xr[i] * c[row]);
        partial[i] += gr[i] * (xr[i] * r[row]);
      }
      if constexpr (!kWide) {
        at::vec::convert(out, gx + at, length);
      }
    }
    if (gw != nullptr) {
      for (int64_t i = 0; i < length; ++i) {
        gw[first + i] = static_cast<scalar_t>(static_cast<opmath_t<scalar_t>>(partial[i]));
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> backward_impl(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                                 double eps, bool weight_grad, const char* op) {
  check_backward_args(grad, x, weight, op);
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::rms_norm_backward", [&] {
    using acc_t = backward_acc_t<scalar_t>;
    const int64_t n = shape.hidden;
    const auto e = static_cast<acc_t>(eps);
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    const scalar_t* xd = xc.const_data_ptr<scalar_t>();
    scalar_t* gx = grad_x.data_ptr<scalar_t>();
    if (split_by_columns(shape)) {
      backward_split_rows(g, xd, wc.const_data_ptr<scalar_t>(), gx,
                          weight_grad ? grad_weight.data_ptr<scalar_t>() : nullptr, shape, e);
      return;
    }
    std::vector<acc_t> weight_storage;
    const acc_t* w = widened_weight<scalar_t, acc_t>(wc, weight_storage);
    if (!weight_grad) {
      at::parallel_for(0, shape.rows, row_grain(n), [&](int64_t begin, int64_t end) {
        backward_rows<scalar_t, acc_t>(g, xd, w, gx, nullptr, begin, end, n, e);
      });
      return;
    }
    const at::Tensor partials = chunk_column_sums(shape.rows, n, [&](int64_t first, int64_t last, double* partial) {
      backward_rows<scalar_t, acc_t>(g, xd, w, gx, partial, first, last, n, e);
    });
    sum_chunks(partials, grad_weight.data_ptr<scalar_t>());
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

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.rms_norm");
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor grad_x, Tensor grad_weight)");
  m.def("rms_norm_backward_input(Tensor grad, Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("rms_norm_backward_input", &rms_norm_backward_input);
}

}  // namespace opforge::cpu
