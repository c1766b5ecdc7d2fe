// opforge::leaky_swish(x, alpha) = x * sigmoid(x) + alpha * x, and its backward as an op of its own so that
// autograd, torch.compile and double backward (registered in opforge/ops/leaky_swish.py) all see a real op; plus
// the in-place opforge::leaky_swish_ and the out= overload opforge::leaky_swish.out.
//
// CPU kernels: elementwise.h's loop, split across threads by at::parallel_for and vectorized by the compiler.
// Memory traffic: the forward reads x and writes y, the backward reads grad and x and writes grad_x, each byte once;
// the aim is memcpy's rate for those bytes.
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <vector>

#include "elementwise.h"
#include "leaky_swish.h"

namespace opforge::cpu {
namespace {

using leaky_swish::check_backward_args;
using leaky_swish::check_input;
using leaky_swish::prepare_out;


// out = leaky_swish(xd) for dense tensors of one layout; `out` may be `xd` itself (each element is read before it
// is written, by the thread that writes it).
void forward_into(const at::Tensor& out, const at::Tensor& xd, double alpha) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xd.scalar_type(), "opforge::leaky_swish", [&] {
    using acc_t = opmath_t<scalar_t>;
    const auto a = static_cast<acc_t>(alpha);
    elementwise_kernel<scalar_t>(
        out.data_ptr<scalar_t>(), out.numel(),
        [a](acc_t v) { return v * (sigmoid(v) + a); },
        xd.const_data_ptr<scalar_t>());
  });
}

at::Tensor leaky_swish(const at::Tensor& x, double alpha) {
  check_input(x, "opforge::leaky_swish");
  at::Tensor out = elementwise_output_like(x);
  forward_into(out, with_layout_of(x, out), alpha);
  return out;
}

at::Tensor& leaky_swish_(at::Tensor& self, double alpha) {
  check_input(self, "opforge::leaky_swish_", "self");
  return elementwise_into(self, self, [alpha](const at::Tensor& dst, const at::Tensor& src) {
    forward_into(dst, src, alpha);
  });
}

at::Tensor& leaky_swish_out(const at::Tensor& x, double alpha, at::Tensor& out) {
  prepare_out(x, out);
  return elementwise_into(out, x, [alpha](const at::Tensor& dst, const at::Tensor& src) {
    forward_into(dst, src, alpha);
  });
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

// torch.Tag.out also makes inductor lower the functional leaky_swish to this overload (torch 2.13 and later).
// Inductor 2.13.0 builds that call's layout from the example output's SymInt sizes and fails an assertion under
// dynamic shapes, so every torch.compile(dynamic=True) of leaky_swish broke; 2.14.1 builds it correctly. Before 2.14
// the overload stays untagged; torch.compile traces it through the Python rule either way.
std::vector<at::Tag> out_tags() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  return {at::Tag::out};
#else
  return {};
#endif
}

// torch.Tag.inplace first appears in torch 2.13's tag list (2.11 has no such enumerator: the file would not compile).
std::vector<at::Tag> inplace_tags() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
  return {at::Tag::inplace};
#else
  return {};
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.leaky_swish");
  m.def("leaky_swish(Tensor x, float alpha=0.1) -> Tensor");
  // The tags say the returned tensor is the mutated argument, which functionalization requires of a custom op whose
  // return aliases an input (torch.compile itself traces both ops through opforge/ops/leaky_swish.py's rules).
  // Lvalues, or def() would take a temporary vector for a kernel.
  const std::vector<at::Tag> inplace = inplace_tags();
  const std::vector<at::Tag> out = out_tags();
  m.def("leaky_swish_(Tensor(a!) self, float alpha=0.1) -> Tensor(a!)", inplace);
  m.def("leaky_swish.out(Tensor x, float alpha=0.1, *, Tensor(a!) out) -> Tensor(a!)", out);
  m.def("leaky_swish_backward(Tensor grad, Tensor x, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("leaky_swish", &leaky_swish);
  m.impl("leaky_swish_", &leaky_swish_);
  m.impl("leaky_swish.out", &leaky_swish_out);
  m.impl("leaky_swish_backward", &leaky_swish_backward);
}

}  // namespace opforge::cpu
