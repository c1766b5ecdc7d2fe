// opforge::custom_loss(pred, target) = where(d < 0, d^2, |d|) with d = pred - target, elementwise with
// broadcasting. Three backward ops: custom_loss_grads returns the gradients of pred and target from one pass, both
// in the broadcast shape; custom_loss_backward the gradient with respect to d alone (pred's gradient, when target's
// is not needed); custom_loss_grads_repeated both gradients in their inputs' shapes when target is repeated over
// pred's rows (a loss against a per-feature target), target's summed over the rows in the same pass. The Python
// autograd formula (opforge/ops/custom_loss.py) picks one and reduces what is left to each input's shape.
//
// Memory traffic: each input read once and each output written once (a target broadcast over pred's leading
// dimensions is read in place, not copied full-size, once its rows hold kMinBroadcastRow elements);
// custom_loss_grads_repeated adds one row of double partial sums per chunk of rows.
#include <torch/library.h>

#include <tuple>

#include "custom_loss.h"
#include "elementwise.h"

namespace opforge::cpu {
namespace {

using custom_loss::backward_output;
using custom_loss::broadcast_output;
using custom_loss::check_pair;
using custom_loss::grads_operands;
using custom_loss::repeated_operands;


at::Tensor custom_loss(const at::Tensor& pred, const at::Tensor& target) {
  check_pair(pred, target, "opforge::custom_loss");
  at::Tensor out = broadcast_output(pred, target);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), "opforge::custom_loss", [&] {
    using acc_t = opmath_t<scalar_t>;
    spanned_kernel<scalar_t>(
        out.data_ptr<scalar_t>(), out.numel(),
        [](acc_t pv, acc_t tv) {
          const acc_t d = pv - tv;
          return d < acc_t(0) ? d * d : std::abs(d);
        },
        spanned<scalar_t>(pred, out), spanned<scalar_t>(target, out));
  });
  return out;
}

// g * dL/dd, with dL/dd = 2d where d < 0, sign(d) elsewhere (0 at the kink, as autograd's abs does).
template <typename acc_t>
inline acc_t grad_d(acc_t g, acc_t p, acc_t t) {
  const acc_t d = p - t;
  const acc_t slope = d < acc_t(0) ? d + d : (d > acc_t(0) ? acc_t(1) : acc_t(0));
  return g * slope;
}

at::Tensor custom_loss_backward(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target) {
  at::Tensor out = backward_output(grad, pred, target, "opforge::custom_loss_backward");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), "opforge::custom_loss_backward", [&] {
    using acc_t = opmath_t<scalar_t>;
    spanned_kernel<scalar_t>(
        out.data_ptr<scalar_t>(), out.numel(), [](acc_t gv, acc_t pv, acc_t tv) { return grad_d(gv, pv, tv); },
        spanned<scalar_t>(grad, out), spanned<scalar_t>(pred, out), spanned<scalar_t>(target, out));
  });
  return out;
}

// (dL/dpred, dL/dtarget) = (g * slope, -g * slope): both gradients from one read of grad, pred and target.
std::tuple<at::Tensor, at::Tensor> custom_loss_grads(const at::Tensor& grad, const at::Tensor& pred,
                                                     const at::Tensor& target) {
  constexpr const char* op = "opforge::custom_loss_grads";
  const custom_loss::GradOperands operands = grads_operands(grad, pred, target, op);
  const at::Tensor &grad_pred = operands.grad_pred, &grad_target = operands.grad_target;
  const at::Tensor &g = operands.grad, &p = operands.pred, &t = operands.target;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), op, [&] {
    using acc_t = opmath_t<scalar_t>;
    elementwise_kernel2<scalar_t>(
        grad_pred.data_ptr<scalar_t>(), grad_target.data_ptr<scalar_t>(), grad_pred.numel(),
        [](acc_t gv, acc_t pv, acc_t tv) {
          const acc_t gd = grad_d(gv, pv, tv);
          return Two<acc_t>{gd, -gd};
        },
        g.const_data_ptr<scalar_t>(), p.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>());
  });
  return {grad_pred, grad_target};
}

// dL/dpred over `rows` rows of `span` elements (target repeated on each), and each column's terms added to
// partial[column] in double. Float16/bfloat16 are computed in float through buffers of kWidenBlock elements.
template <typename scalar_t>
void repeated_rows(const scalar_t* grad, const scalar_t* pred, const scalar_t* target, scalar_t* grad_pred,
                   int64_t rows, int64_t span, double* partial) {
  using acc_t = opmath_t<scalar_t>;
  constexpr bool kNative = std::is_same_v<acc_t, scalar_t>;
  constexpr int64_t kBuffer = kNative ? 1 : kWidenBlock;
  acc_t g_buf[kBuffer], p_buf[kBuffer], t_buf[kBuffer], out_buf[kBuffer];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t block = 0; block < span; block += kWidenBlock) {
      const int64_t n = std::min(kWidenBlock, span - block);
      const int64_t i = r * span + block;
      const acc_t* g = widened(grad + i, n, g_buf);
      const acc_t* p = widened(pred + i, n, p_buf);
      const acc_t* t = widened(target + block, n, t_buf);
      acc_t* out = out_buf;
      if constexpr (kNative) {
        out = grad_pred + i;
      }
      double* sums = partial + block;
      for (int64_t j = 0; j < n; ++j) {
        const acc_t d = grad_d(g[j], p[j], t[j]);
        out[j] = d;
        sums[j] += static_cast<double>(d);
      }
      if constexpr (!kNative) {
        at::vec::convert(out_buf, grad_pred + i, n);
      }
    }
  }
}

// (dL/dpred, dL/dtarget) for a target repeated over pred's rows, in one pass: dL/dpred in pred's shape, dL/dtarget
// in target's, the sum over the rows of -dL/dd. Its terms are added in double in a fixed order of row chunks (the
// same bits on any thread count) and rounded once: rounding each float16/bfloat16 term first was 7% off over 33
// rows. Before this op the autograd formula cast grad and pred to float32, wrote dL/dd full-size and summed it.
std::tuple<at::Tensor, at::Tensor> custom_loss_grads_repeated(const at::Tensor& grad, const at::Tensor& pred,
                                                              const at::Tensor& target) {
  constexpr const char* op = "opforge::custom_loss_grads_repeated";
  const custom_loss::GradOperands operands = repeated_operands(grad, pred, target, op);
  const at::Tensor &grad_pred = operands.grad_pred, &grad_target = operands.grad_target;
  const at::Tensor &g = operands.grad, &p = operands.pred, &t = operands.target;
  const int64_t span = target.numel();
  if (pred.numel() == 0) {
    return {grad_pred, grad_target.zero_()};  // a sum over no rows
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), op, [&] {
    const scalar_t* gd = g.const_data_ptr<scalar_t>();
    const scalar_t* pd = p.const_data_ptr<scalar_t>();
    const scalar_t* td = t.const_data_ptr<scalar_t>();
    scalar_t* out = grad_pred.data_ptr<scalar_t>();
    const auto add_rows = [&](int64_t first, int64_t last, double* partial) {
      const int64_t i = first * span;
      repeated_rows<scalar_t>(gd + i, pd + i, td, out + i, last - first, span, partial);
    };
    const at::Tensor partials = chunk_column_sums(pred.numel() / span, span, add_rows);
    sum_chunks(partials, grad_target.data_ptr<scalar_t>());
  });
  return {grad_pred, grad_target.neg_()};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.custom_loss");
  m.def("custom_loss(Tensor pred, Tensor target) -> Tensor");
  m.def("custom_loss_backward(Tensor grad, Tensor pred, Tensor target) -> Tensor");
  m.def("custom_loss_grads(Tensor grad, Tensor pred, Tensor target) -> (Tensor grad_pred, Tensor grad_target)");
  m.def(
      "custom_loss_grads_repeated(Tensor grad, Tensor pred, Tensor target) -> (Tensor grad_pred, Tensor grad_target)");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("custom_loss", &custom_loss);
  m.impl("custom_loss_backward", &custom_loss_backward);
  m.impl("custom_loss_grads", &custom_loss_grads);
  m.impl("custom_loss_grads_repeated", &custom_loss_grads_repeated);
}

}  // namespace opforge::cpu
