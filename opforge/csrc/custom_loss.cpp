// opforge::custom_loss(pred, target) = where(d < 0, d^2, |d|) with d = pred - target, elementwise with
// broadcasting. Two backward ops, both in the broadcast shape: custom_loss_grads returns the gradients of pred and
// target from one pass, custom_loss_backward the gradient with respect to d alone (pred's gradient, when target's
// is not needed). The Python autograd formula (opforge/ops/custom_loss.py) reduces them to each input's shape.
#include <torch/library.h>

#include <tuple>

#include "custom_loss.h"
#include "elementwise.h"

namespace opforge::cpu {
namespace {

using custom_loss::broadcast_output;
using custom_loss::check_backward_grad;
using custom_loss::check_pair;


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
  check_pair(pred, target, "opforge::custom_loss_backward");
  at::Tensor out = broadcast_output(pred, target);
  check_backward_grad(grad, out, "opforge::custom_loss_backward");
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
  check_pair(pred, target, op);
  at::Tensor grad_pred = broadcast_output(pred, target);
  check_backward_grad(grad, grad_pred, op);
  at::Tensor grad_target = at::empty_like(grad_pred);
  const at::Tensor g = with_layout_of(grad, grad_pred);
  const at::Tensor p = with_layout_of(pred, grad_pred);
  const at::Tensor t = with_layout_of(target, grad_pred);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.custom_loss");
  m.def("custom_loss(Tensor pred, Tensor target) -> Tensor");
  m.def("custom_loss_backward(Tensor grad, Tensor pred, Tensor target) -> Tensor");
  m.def("custom_loss_grads(Tensor grad, Tensor pred, Tensor target) -> (Tensor grad_pred, Tensor grad_target)");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("custom_loss", &custom_loss);
  m.impl("custom_loss_backward", &custom_loss_backward);
  m.impl("custom_loss_grads", &custom_loss_grads);
}

}  // namespace opforge::cpu
