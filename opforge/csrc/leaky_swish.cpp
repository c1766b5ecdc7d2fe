// opforge::leaky_swish(x, alpha) = x * sigmoid(x) + alpha * x, and its backward as an op of its own so that
// autograd, torch.compile and double backward (registered in opforge/ops/leaky_swish.py) all see a real op.
#include <torch/library.h>

#include "elementwise.h"
#include "leaky_swish.h"

namespace opforge::cpu {
namespace {

using leaky_swish::check_backward_args;
using leaky_swish::check_input;


at::Tensor leaky_swish(const at::Tensor& x, double alpha) {
  check_input(x, "opforge::leaky_swish");
  at::Tensor out = elementwise_output_like(x);
  const at::Tensor xd = with_layout_of(x, out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::leaky_swish", [&] {
    using acc_t = opmath_t<scalar_t>;
    const auto a = static_cast<acc_t>(alpha);
    elementwise_kernel<scalar_t>(
        out.data_ptr<scalar_t>(), out.numel(),
        [a](acc_t v) { return v * (sigmoid(v) + a); },
        xd.const_data_ptr<scalar_t>());
  });
  return out;
}

// d/dx [x * s + alpha * x] = s + x * s * (1 - s) + alpha, with s = sigmoid(x).
at::Tensor leaky_swish_backward(const at::Tensor& grad, const at::Tensor& x, double alpha) {
  check_backward_args(grad, x);
  at::Tensor out = elementwise_output_like(x);
  const at::Tensor xd = with_layout_of(x, out);
  // Autograd often hands in an expanded (stride-0) or differently-strided grad.
  const at::Tensor gd = with_layout_of(grad, out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::leaky_swish_backward", [&] {
    using acc_t = opmath_t<scalar_t>;
    const auto a = static_cast<acc_t>(alpha);
    elementwise_kernel<scalar_t>(
        out.data_ptr<scalar_t>(), out.numel(),
        [a](acc_t g, acc_t v) {
          const acc_t s = sigmoid(v);
          return g * (s + v * s * (acc_t(1) - s) + a);
        },
        gd.const_data_ptr<scalar_t>(), xd.const_data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.leaky_swish");
  m.def("leaky_swish(Tensor x, float alpha=0.1) -> Tensor");
  m.def("leaky_swish_backward(Tensor grad, Tensor x, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("leaky_swish", &leaky_swish);
  m.impl("leaky_swish_backward", &leaky_swish_backward);
}

}  // namespace opforge::cpu
