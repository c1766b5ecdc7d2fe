// CUDA kernels of opforge::leaky_swish, its in-place and out= variants and its backward (schemas are defined in
// ../leaky_swish.cpp).
//
//   y      = x * (sigmoid(x) + alpha)
//   grad_x = grad * (s + x * s * (1 - s) + alpha),  s = sigmoid(x)
//
// Both are elementwise.cuh's kernels. Memory traffic: the forward reads x and writes y, the backward reads grad and
// x and writes grad_x, each byte once, at a copy's rate; the hardware exp keeps the arithmetic under the loads.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "elementwise.cuh"
#include "layout.h"
#include "leaky_swish.h"

namespace opforge::cuda {
namespace {

using leaky_swish::check_backward_args;
using leaky_swish::check_input;
using leaky_swish::check_out;

// float (and float16/bfloat16, computed in float): the hardware exp2 and reciprocal (__expf: 2 + 1.16|x| ulp;
// __fdividef: 2 ulp), well inside float32's rtol of 1.3e-6 for the values that matter, since where exp(-x) is
// large sigmoid is small and the output is dominated by alpha * x. expf and an IEEE division made the forward
// kernel arithmetic-bound (docs/measurements/tuned-constants.md, "fast exp"). Infinities and NaN propagate as in
// the reference.
__device__ __forceinline__ float sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

// double is computed exactly as the float64 reference is: gradcheck must not see float32 rounding.
__device__ __forceinline__ double sigmoid(double x) {
  return 1.0 / (1.0 + exp(-x));
}

template <typename acc_t>
struct Forward {
  acc_t alpha;
  __device__ __forceinline__ acc_t operator()(acc_t x) const {
    return x * (sigmoid(x) + alpha);
  }
};

template <typename acc_t>
struct Backward {
  acc_t alpha;
  __device__ __forceinline__ acc_t operator()(acc_t g, acc_t x) const {
    const acc_t s = sigmoid(x);
    return g * (s + x * s * (acc_t(1) - s) + alpha);
  }
};

// out = leaky_swish(xd) for dense tensors of one layout. `out` may be `xd` itself, the in-place op: each element is
// read once, by the thread that writes it, before it is written, and no element is read after any write to it, so
// the kernel's __restrict__ and read-only loads stay exact.
void forward_into(const at::Tensor& out, const at::Tensor& xd, double alpha) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xd.scalar_type(), "opforge::leaky_swish", [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise<scalar_t>(xd.device(), out.data_ptr<scalar_t>(), out.numel(),
                                 Forward<acc_t>{static_cast<acc_t>(alpha)}, xd.const_data_ptr<scalar_t>());
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
  // A strided self's copies run with its device current, as ATen's device_guard makes them for native ops.
  const c10::cuda::CUDAGuard guard(self.device());
  return elementwise_into(self, self, [alpha](const at::Tensor& dst, const at::Tensor& src) {
    forward_into(dst, src, alpha);
  });
}

at::Tensor& leaky_swish_out(const at::Tensor& x, double alpha, at::Tensor& out) {
  // The devices are checked before the guard: the dispatcher sends a CPU x with a CUDA out here too, and a guard on
  // the CPU device throws an error that names neither argument.
  check_out(x, out);
  const c10::cuda::CUDAGuard guard(x.device());
  at::native::resize_output(out, x.sizes());
  return elementwise_into(out, x, [alpha](const at::Tensor& dst, const at::Tensor& src) {
    forward_into(dst, src, alpha);
  });
}

at::Tensor leaky_swish_backward(const at::Tensor& grad, const at::Tensor& x, double alpha) {
  check_backward_args(grad, x);
  at::Tensor out = elementwise_output_like(x);
  const at::Tensor xd = with_layout_of(x, out);
  const at::Tensor gd = with_layout_of(grad, out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "opforge::leaky_swish_backward", [&] {
    using acc_t = opmath_t<scalar_t>;
    launch_elementwise<scalar_t>(x.device(), out.data_ptr<scalar_t>(), out.numel(),
                                 Backward<acc_t>{static_cast<acc_t>(alpha)}, gd.const_data_ptr<scalar_t>(),
                                 xd.const_data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("leaky_swish", &leaky_swish);
  m.impl("leaky_swish_", &leaky_swish_);
  m.impl("leaky_swish.out", &leaky_swish_out);
  m.impl("leaky_swish_backward", &leaky_swish_backward);
}

}  // namespace opforge::cuda
