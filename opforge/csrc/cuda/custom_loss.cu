// CUDA kernels of opforge::custom_loss and its backward ops (schemas are defined in ../custom_loss.cpp).
//
//   loss = where(d < 0, d^2, |d|),  d = pred - target;  dL/dd = 2d where d < 0, sign(d) elsewhere
//
// The forward and the backward ops are elementwise.cuh's kernels, the two gradients written from one read of the
// inputs; custom_loss_grads_repeated writes pred's gradient and sums target's over the rows on column_sums.cuh.
// Memory traffic: each input read once and each output written once (a target repeated over pred's rows is read in
// place, from L2); the repeated-target backward adds one row of partial sums per block, written once and read once.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <tuple>

#include "column_sums.cuh"
#include "custom_loss.h"
#include "elementwise.cuh"
#include "layout.h"

namespace opforge::cuda {
namespace {

using custom_loss::backward_output;
using custom_loss::broadcast_output;
using custom_loss::check_pair;
using custom_loss::grads_operands;
using custom_loss::repeated_operands;

template <typename acc_t>
struct Forward {
  __device__ __forceinline__ acc_t operator()(acc_t p, acc_t t) const {
    const acc_t d = p - t;
    return d < acc_t(0) ? d * d : ::fabs(d);
  }
};

// dL/dd = 2d where d < 0, sign(d) elsewhere (0 at the kink, as autograd's abs does).
template <typename acc_t>
struct Backward {
  __device__ __forceinline__ acc_t operator()(acc_t g, acc_t p, acc_t t) const {
    const acc_t d = p - t;
    const acc_t slope = d < acc_t(0) ? d + d : (d > acc_t(0) ? acc_t(1) : acc_t(0));
    return g * slope;
  }
};

// (dL/dpred, dL/dtarget) = (g * slope, -g * slope), from one read of the inputs.
template <typename acc_t>
struct Grads {
  __device__ __forceinline__ Two<acc_t> operator()(acc_t g, acc_t p, acc_t t) const {
    const acc_t grad_d = Backward<acc_t>{}(g, p, t);
    return {grad_d, -grad_d};
  }
};

at::Tensor custom_loss(const at::Tensor& pred, const at::Tensor& target) {
  check_pair(pred, target, "opforge::custom_loss");
  at::Tensor out = broadcast_output(pred, target);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), "opforge::custom_loss", [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise_spanned<scalar_t>(pred.device(), out.data_ptr<scalar_t>(), out.numel(), Forward<acc_t>{},
                                         spanned<scalar_t>(pred, out), spanned<scalar_t>(target, out));
  });
  return out;
}

at::Tensor custom_loss_backward(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target) {
  at::Tensor out = backward_output(grad, pred, target, "opforge::custom_loss_backward");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), "opforge::custom_loss_backward", [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise_spanned<scalar_t>(pred.device(), out.data_ptr<scalar_t>(), out.numel(), Backward<acc_t>{},
                                         spanned<scalar_t>(grad, out), spanned<scalar_t>(pred, out),
                                         spanned<scalar_t>(target, out));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> custom_loss_grads(const at::Tensor& grad, const at::Tensor& pred,
                                                     const at::Tensor& target) {
  constexpr const char* op = "opforge::custom_loss_grads";
  const custom_loss::GradOperands operands = grads_operands(grad, pred, target, op);
  const at::Tensor &grad_pred = operands.grad_pred, &grad_target = operands.grad_target;
  const at::Tensor &g = operands.grad, &p = operands.pred, &t = operands.target;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), op, [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise2<scalar_t>(pred.device(), grad_pred.data_ptr<scalar_t>(), grad_target.data_ptr<scalar_t>(),
                                  grad_pred.numel(), Grads<acc_t>{}, g.const_data_ptr<scalar_t>(),
                                  p.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>());
  });
  return {grad_pred, grad_target};
}

// custom_loss_grads_repeated as rows_with_column_sums' Op: target is the column operand, each row of grad and pred
// gives a row of dL/dpred, and target's gradient is the column sum of -dL/dd (negation is exact, so the sum of the
// negated terms is the negated sum).
template <typename scalar_t>
struct RepeatedTargetRows {
  using acc_t = opmath_t<scalar_t>;
  using sum_t = cuda::sum_t<scalar_t>;
  static constexpr int kSums = 1;
  template <int kVec>
  using P = Pack<scalar_t, kVec>;
  template <int kVec>
  using Column = P<kVec>;
  template <int kVec>
  struct Row {
    P<kVec> grad, pred;
  };

  const scalar_t* __restrict__ grad;
  const scalar_t* __restrict__ pred;
  const scalar_t* __restrict__ target;
  scalar_t* __restrict__ grad_pred;

  template <int kVec>
  __device__ __forceinline__ Column<kVec> column(int64_t c) const {
    return load_pack<P<kVec>, false>(target + c);
  }

  template <int kVec>
  __device__ __forceinline__ Row<kVec> load(int64_t i) const {
    return {load_pack<P<kVec>, false>(grad + i), load_pack<P<kVec>, false>(pred + i)};
  }

  template <int kVec>
  __device__ __forceinline__ void apply(const Column<kVec>& t, const Row<kVec>& row, int64_t i,
                                        sum_t (&sums)[kSums][kVec]) const {
    P<kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const acc_t d = Backward<acc_t>{}(row.grad.v[j], row.pred.v[j], t.v[j]);
      result.v[j] = static_cast<scalar_t>(d);
      sums[0][j] -= static_cast<sum_t>(d);
    }
    store_pack(grad_pred + i, result);
  }
};

// Both gradients of a target repeated over pred's rows in one pass: dL/dpred written, dL/dtarget summed over the rows
// (float for float16/bfloat16, double for float32/float64) and rounded once. The CPU kernel (../custom_loss.cpp) has
// the same contract.
std::tuple<at::Tensor, at::Tensor> custom_loss_grads_repeated(const at::Tensor& grad, const at::Tensor& pred,
                                                              const at::Tensor& target) {
  constexpr const char* op = "opforge::custom_loss_grads_repeated";
  const custom_loss::GradOperands operands = repeated_operands(grad, pred, target, op);
  const at::Tensor &grad_pred = operands.grad_pred, &grad_target = operands.grad_target;
  const at::Tensor &g = operands.grad, &p = operands.pred, &t = operands.target;
  if (pred.numel() == 0) {
    return {grad_pred, grad_target.zero_()};  // a sum over no rows
  }
  const c10::cuda::CUDAGuard guard(pred.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(pred.device().index());
  const int64_t span = target.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), op, [&] {
    constexpr int kVec = kVectorBytes / sizeof(scalar_t);
    const RepeatedTargetRows<scalar_t> rows_op{g.const_data_ptr<scalar_t>(), p.const_data_ptr<scalar_t>(),
                                               t.const_data_ptr<scalar_t>(), grad_pred.data_ptr<scalar_t>()};
    const SumOutputs<scalar_t, 1> sums{{grad_target.data_ptr<scalar_t>()}};
    const int64_t rows = pred.numel() / span;
    const bool vectors = span % kVec == 0 && aligned(rows_op.grad) && aligned(rows_op.pred) &&
                         aligned(rows_op.target) && aligned(rows_op.grad_pred);
    vectors ? rows_with_column_sums<kVec>(rows_op, rows, span, sums, pred.options(), stream)
            : rows_with_column_sums<1>(rows_op, rows, span, sums, pred.options(), stream);
  });
  return {grad_pred, grad_target};
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("custom_loss", &custom_loss);
  m.impl("custom_loss_backward", &custom_loss_backward);
  m.impl("custom_loss_grads", &custom_loss_grads);
  m.impl("custom_loss_grads_repeated", &custom_loss_grads_repeated);
}

}  // namespace opforge::cuda
