// The seed article's CUDA leaky_swish kernel, kept as written (int32 index, default stream, float only, no launch
// check) as a baseline for benchmarks/cuda_bandwidth.py. Not part of opforge.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

__global__ void leaky_swish_kernel(const float* x, float* out, float alpha, int64_t n) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < n) {
    float sigmoid = 1.0f / (1.0f + expf(-x[idx]));
    out[idx] = x[idx] * sigmoid + alpha * x[idx];
  }
}

at::Tensor leaky_swish_seed(const at::Tensor& x, double alpha) {
  auto out = at::empty_like(x);
  const int64_t n = x.numel();
  const int threads = 256;
  const int blocks = (n + threads - 1) / threads;
  leaky_swish_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(alpha), n);
  return out;
}

TORCH_LIBRARY(seed, m) {
  m.def("leaky_swish(Tensor x, float alpha=0.1) -> Tensor");
  m.impl("leaky_swish", c10::DispatchKey::CUDA, &leaky_swish_seed);
}
