// opforge::affine_leaky_swish(x, scale, shift, alpha) = leaky_swish(x * scale[c] + shift[c]) on (N, C, H, W) x: an
// inference-time batch norm folded into scale and shift, fused with the activation (leaky_swish(v) =
// v * (sigmoid(v) + alpha), opforge/ops/leaky_swish.py). Two walks of x: NCHW planes (one channel per plane) and
// NHWC rows (the channel is the position in the row). The backward op returns the gradients of x, scale and shift;
// the latter two are per-channel sums, added in an order fixed by the shape alone so that every run, on any number
// of threads, gives the same bits.
//
// Memory traffic: the forward reads x and writes y once; the backward reads grad and x and writes grad_x once, its
// per-channel sums kept in per-plane partials (NCHW) or one row of 2C double partials per chunk of rows (NHWC).
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <vector>

#include "affine_leaky_swish.h"
#include "elementwise.h"

namespace opforge::cpu {
namespace {

using affine_leaky_swish::check_backward_args;
using affine_leaky_swish::check_inputs;
using affine_leaky_swish::Plan;
using affine_leaky_swish::plan_for;

// An NHWC tile is as many whole rows as fit in this many elements (one row when C is larger), and the channel
// parameters are laid out once over a whole tile: the inner loop then walks plain arrays, which vectorizes, also
// for C = 3 where a row alone would be too short to.
constexpr int64_t kTileElements = kWidenBlock;

// The parameter of every element of an NCHW plane.
template <typename acc_t>
struct Uniform {
  acc_t value;
  acc_t operator[](int64_t) const {
    return value;
  }
};

// scale and shift in the compute type; for the NHWC walk repeated over a tile of rows.
template <typename acc_t>
struct ChannelParams {
  std::vector<acc_t> scale, shift;
};

int64_t tile_rows(const Plan& plan) {
  return plan.channels_inner ? std::max<int64_t>(1, kTileElements / plan.c) : 1;
}

template <typename scalar_t>
ChannelParams<opmath_t<scalar_t>> channel_params(const at::Tensor& scale, const at::Tensor& shift, const Plan& plan) {
  const at::Tensor s = scale.contiguous(), b = shift.contiguous();
  const int64_t c = plan.c, len = c * tile_rows(plan);
  ChannelParams<opmath_t<scalar_t>> p{std::vector<opmath_t<scalar_t>>(len), std::vector<opmath_t<scalar_t>>(len)};
  for (int64_t i = 0; i < len; ++i) {
    p.scale[i] = static_cast<opmath_t<scalar_t>>(s.const_data_ptr<scalar_t>()[i % c]);
    p.shift[i] = static_cast<opmath_t<scalar_t>>(b.const_data_ptr<scalar_t>()[i % c]);
  }
  return p;
}

// y[j] = f(x[j] * scale[j] + shift[j]) for j < len. Reduced-precision elements are widened to float in blocks,
// computed, and rounded once.
template <typename scalar_t, typename Params>
void forward_span(const scalar_t* x, scalar_t* y, int64_t len, const Params& scale, const Params& shift,
                  opmath_t<scalar_t> alpha) {
  using acc_t = opmath_t<scalar_t>;
  const auto f = [alpha](acc_t x_j, acc_t s, acc_t b) {
    const acc_t v = x_j * s + b;
    return v * (sigmoid(v) + alpha);
  };
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    for (int64_t j = 0; j < len; ++j) {
      y[j] = f(x[j], scale[j], shift[j]);
    }
  } else {
    acc_t wide[kWidenBlock];
    for (int64_t block = 0; block < len; block += kWidenBlock) {
      const int64_t n = std::min(kWidenBlock, len - block);
      at::vec::convert(x + block, wide, n);
      for (int64_t j = 0; j < n; ++j) {
        wide[j] = f(wide[j], scale[block + j], shift[block + j]);
      }
      at::vec::convert(wide, y + block, n);
    }
  }
}

// Per-channel sums of the backward. Slots are added to by one element at a time, so the loop over a block has no
// dependency from one element to the next and vectorizes; they are added up in a fixed order afterwards.
struct Sums {
  double* d;   // d(loss)/dv = grad * f'(v): the shift's gradient terms
  double* dx;  // d * x: the scale's
};

// grad_x[j] = d_j * scale[j] with d_j = grad[j] * f'(v_j), v_j = x[j] * scale[j] + shift[j]; d_j and d_j * x[j] are
// added to the slots of element j: slot j (kSlotPerElement, the NHWC tile: slot = the element's channel copy) or
// slot j % kWidenBlock (an NCHW plane, all one channel: kWidenBlock running sums instead of one).
template <bool kSlotPerElement, typename scalar_t, typename Params>
void backward_span(const scalar_t* grad, const scalar_t* x, scalar_t* grad_x, int64_t len, const Params& scale,
                   const Params& shift, opmath_t<scalar_t> alpha, Sums sums) {
  using acc_t = opmath_t<scalar_t>;
  // float and double are computed in place; float16 and bfloat16 through float buffers.
  constexpr bool kNative = std::is_same_v<acc_t, scalar_t>;
  constexpr int64_t kBuffer = kNative ? 1 : kWidenBlock;
  acc_t grad_buf[kBuffer], x_buf[kBuffer], out_buf[kBuffer];
  for (int64_t block = 0; block < len; block += kWidenBlock) {
    const int64_t n = std::min(kWidenBlock, len - block);
    const acc_t* g = widened(grad + block, n, grad_buf);
    const acc_t* xv = widened(x + block, n, x_buf);
    acc_t* out = out_buf;
    if constexpr (kNative) {
      out = grad_x + block;
    }
    double* sum_d = sums.d + (kSlotPerElement ? block : 0);
    double* sum_dx = sums.dx + (kSlotPerElement ? block : 0);
    for (int64_t j = 0; j < n; ++j) {
      const acc_t s = scale[block + j];
      const acc_t v = xv[j] * s + shift[block + j];
      const acc_t sg = sigmoid(v);
      const acc_t d = g[j] * (sg + v * sg * (acc_t(1) - sg) + alpha);
      out[j] = d * s;
      sum_d[j] += static_cast<double>(d);
      sum_dx[j] += static_cast<double>(d) * static_cast<double>(xv[j]);
    }
    if constexpr (!kNative) {
      at::vec::convert(out_buf, grad_x + block, n);
    }
  }
}

// ------------------------------------------------------------------------------------------------- forward

template <typename scalar_t>
void forward_planes(const Plan& plan, const scalar_t* x, scalar_t* y, const ChannelParams<opmath_t<scalar_t>>& p,
                    opmath_t<scalar_t> alpha) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t hw = plan.hw;
  at::parallel_for(0, plan.n * plan.c, std::max<int64_t>(1, kGrainSize / hw), [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % plan.c;
      forward_span(x + plane * hw, y + plane * hw, hw, Uniform<acc_t>{p.scale[c]}, Uniform<acc_t>{p.shift[c]},
                   alpha);
    }
  });
}

template <typename scalar_t>
void forward_rows(const Plan& plan, const scalar_t* x, scalar_t* y, const ChannelParams<opmath_t<scalar_t>>& p,
                  opmath_t<scalar_t> alpha) {
  const int64_t tile = tile_rows(plan) * plan.c, numel = plan.numel();
  const int64_t tiles = (numel + tile - 1) / tile;
  at::parallel_for(0, tiles, std::max<int64_t>(1, kGrainSize / tile), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * tile;
      forward_span(x + start, y + start, std::min(tile, numel - start), p.scale.data(), p.shift.data(), alpha);
    }
  });
}

at::Tensor affine_leaky_swish(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double alpha) {
  check_inputs(x, scale, shift, "opforge::affine_leaky_swish");
  const Plan plan = plan_for(x);
  at::Tensor out = plan.empty_like_x(x);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor xd = plan.dense(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::affine_leaky_swish", [&] {
    using acc_t = opmath_t<scalar_t>;
    const ChannelParams<acc_t> params = channel_params<scalar_t>(scale, shift, plan);
    const auto a = static_cast<acc_t>(alpha);
    if (plan.channels_inner) {
      forward_rows(plan, xd.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), params, a);
    } else {
      forward_planes(plan, xd.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), params, a);
    }
  });
  return out;
}

// ------------------------------------------------------------------------------------------------ backward

// Each plane's sums into partial[plane]; then, per channel, the planes of that channel in batch order.
template <typename scalar_t>
void backward_planes(const Plan& plan, const scalar_t* grad, const scalar_t* x, scalar_t* grad_x,
                     const ChannelParams<opmath_t<scalar_t>>& p, opmath_t<scalar_t> alpha, double* sum_d,
                     double* sum_dx) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t hw = plan.hw, planes = plan.n * plan.c;
  std::vector<double> plane_d(planes), plane_dx(planes);
  at::parallel_for(0, planes, std::max<int64_t>(1, kGrainSize / hw), [&](int64_t begin, int64_t end) {
    double slots_d[kWidenBlock], slots_dx[kWidenBlock];
    const int64_t used = std::min(hw, kWidenBlock);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % plan.c, offset = plane * hw;
      std::fill_n(slots_d, used, 0.0);
      std::fill_n(slots_dx, used, 0.0);
      backward_span<false>(grad + offset, x + offset, grad_x + offset, hw, Uniform<acc_t>{p.scale[c]},
                           Uniform<acc_t>{p.shift[c]}, alpha, Sums{slots_d, slots_dx});
      plane_d[plane] = std::accumulate(slots_d, slots_d + used, 0.0);
      plane_dx[plane] = std::accumulate(slots_dx, slots_dx + used, 0.0);
    }
  });
  for (int64_t n = 0; n < plan.n; ++n) {
    for (int64_t c = 0; c < plan.c; ++c) {
      sum_d[c] += plane_d[n * plan.c + c];
      sum_dx[c] += plane_dx[n * plan.c + c];
    }
  }
}

// The rows' per-channel sums by chunk_column_sums (elementwise.h), with partial rows of 2C doubles (d, then d * x):
// a chunk's rows go through in tiles, summed into slots (one per element of a tile) that are folded into the
// chunk's partial row once at its end.
template <typename scalar_t>
void backward_rows(const Plan& plan, const scalar_t* grad, const scalar_t* x, scalar_t* grad_x,
                   const ChannelParams<opmath_t<scalar_t>>& p, opmath_t<scalar_t> alpha, double* sum_d,
                   double* sum_dx) {
  const int64_t c = plan.c, rows_per_tile = tile_rows(plan), tile = rows_per_tile * c;
  const auto add_rows = [&](int64_t first, int64_t last, double* partial) {
    std::vector<double> slots_d(tile, 0.0), slots_dx(tile, 0.0);
    for (int64_t r = first; r < last; r += rows_per_tile) {
      const int64_t start = r * c;
      backward_span<true>(grad + start, x + start, grad_x + start, std::min(rows_per_tile, last - r) * c,
                          p.scale.data(), p.shift.data(), alpha, Sums{slots_d.data(), slots_dx.data()});
    }
    for (int64_t j = 0; j < tile; ++j) {
      partial[j % c] += slots_d[j];
      partial[c + j % c] += slots_dx[j];
    }
  };
  const at::Tensor partials = chunk_column_sums(plan.numel() / c, 2 * c, add_rows);
  std::vector<double> totals(2 * c);
  sum_chunks(partials, totals.data());
  std::copy_n(totals.begin(), c, sum_d);
  std::copy_n(totals.begin() + c, c, sum_dx);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> affine_leaky_swish_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                           const at::Tensor& scale,
                                                                           const at::Tensor& shift, double alpha) {
  check_backward_args(grad, x, scale, shift);
  const Plan plan = plan_for(x);
  at::Tensor grad_x = plan.empty_like_x(x);
  if (grad_x.numel() == 0) {
    // Sums over no elements.
    return {grad_x, at::zeros({plan.c}, scale.options()), at::zeros({plan.c}, shift.options())};
  }
  at::Tensor grad_scale = at::empty({plan.c}, scale.options()), grad_shift = at::empty({plan.c}, shift.options());
  // Autograd hands in whatever layout the next op produced (often contiguous for a channels_last x).
  const at::Tensor gd = plan.dense(grad), xd = plan.dense(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::affine_leaky_swish_backward",
                                  [&] {
    using acc_t = opmath_t<scalar_t>;
    const ChannelParams<acc_t> params = channel_params<scalar_t>(scale, shift, plan);
    const auto a = static_cast<acc_t>(alpha);
    std::vector<double> sum_d(plan.c, 0.0), sum_dx(plan.c, 0.0);
    const auto run = [&](auto walk) {
      walk(plan, gd.const_data_ptr<scalar_t>(), xd.const_data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), params,
           a, sum_d.data(), sum_dx.data());
    };
    if (plan.channels_inner) {
      run(backward_rows<scalar_t>);
    } else {
      run(backward_planes<scalar_t>);
    }
    scalar_t* gs = grad_scale.data_ptr<scalar_t>();
    scalar_t* gb = grad_shift.data_ptr<scalar_t>();
    for (int64_t c = 0; c < plan.c; ++c) {
      gs[c] = static_cast<scalar_t>(sum_dx[c]);
      gb[c] = static_cast<scalar_t>(sum_d[c]);
    }
  });
  return {grad_x, grad_scale, grad_shift};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.affine_leaky_swish");
  m.def("affine_leaky_swish(Tensor x, Tensor scale, Tensor shift, float alpha=0.1) -> Tensor");
  m.def(
      "affine_leaky_swish_backward(Tensor grad, Tensor x, Tensor scale, Tensor shift, float alpha) -> "
      "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("affine_leaky_swish", &affine_leaky_swish);
  m.impl("affine_leaky_swish_backward", &affine_leaky_swish_backward);
}

}  // namespace opforge::cpu
