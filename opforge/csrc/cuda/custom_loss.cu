// CUDA kernels of opforge::custom_loss and its backward ops (schemas are defined in ../custom_loss.cpp).
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <tuple>

#include "custom_loss.h"
#include "elementwise.cuh"
#include "layout.h"

namespace opforge::cuda {
namespace {

using custom_loss::broadcast_output;
using custom_loss::check_backward_grad;
using custom_loss::check_pair;
using custom_loss::check_repeated;

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
  check_pair(pred, target, "opforge::custom_loss_backward");
  at::Tensor out = broadcast_output(pred, target);
  check_backward_grad(grad, out, "opforge::custom_loss_backward");
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
  check_pair(pred, target, op);
  at::Tensor grad_pred = broadcast_output(pred, target);
  check_backward_grad(grad, grad_pred, op);
  at::Tensor grad_target = at::empty_like(grad_pred);
  const at::Tensor g = with_layout_of(grad, grad_pred);
  const at::Tensor p = with_layout_of(pred, grad_pred);
  const at::Tensor t = with_layout_of(target, grad_pred);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pred.scalar_type(), op, [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise2<scalar_t>(pred.device(), grad_pred.data_ptr<scalar_t>(), grad_target.data_ptr<scalar_t>(),
                                  grad_pred.numel(), Grads<acc_t>{}, g.const_data_ptr<scalar_t>(),
                                  p.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>());
  });
  return {grad_pred, grad_target};
}

// The CPU kernel's contract (../custom_loss.cpp), computed as the autograd formula did before the op existed: the
// float terms of dL/dd written full-size by custom_loss_backward's kernel, summed over the rows by ATen. A fused
// kernel (pred's gradient written, target's summed in one pass, as rms_norm's weight gradient is) is left for a
// session with GPU time to measure it.
std::tuple<at::Tensor, at::Tensor> custom_loss_grads_repeated(const at::Tensor& grad, const at::Tensor& pred,
                                                              const at::Tensor& target) {
  constexpr const char* op = "opforge::custom_loss_grads_repeated";
  check_pair(pred, target, op);
  check_repeated(grad, pred, target, op);
  const at::ScalarType dtype = pred.scalar_type();
  const at::ScalarType wide = at::isReducedFloatingType(dtype) ? at::kFloat : dtype;
  const at::Tensor terms = custom_loss_backward(grad.to(wide), pred.to(wide), target.to(wide));
  return {terms.to(dtype), at::sum_to(terms, target.sizes()).neg().to(dtype)};
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("custom_loss", &custom_loss);
  m.impl("custom_loss_backward", &custom_loss_backward);
  m.impl("custom_loss_grads", &custom_loss_grads);
  m.impl("custom_loss_grads_repeated", &custom_loss_grads_repeated);
}

}  // namespace opforge::cuda
