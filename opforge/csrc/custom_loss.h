// Argument checks and output allocation of opforge::custom_loss, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "layout.h"
#include "message.h"

namespace opforge::custom_loss {

inline void check_pair(const at::Tensor& pred, const at::Tensor& target, const char* op) {
  TORCH_CHECK(at::isFloatingType(pred.scalar_type()), op, ": pred must be float32, float64, float16 or bfloat16, got ",
              pred.scalar_type(), ". Cast it first, e.g. pred.float().");
  TORCH_CHECK(pred.scalar_type() == target.scalar_type(), op, ": target must have pred's dtype ",
              pred.scalar_type(), ", got ", target.scalar_type(), ". Cast one of them.");
  TORCH_CHECK(pred.device() == target.device(), op, ": target must be on pred's device ", pred.device(), ", got ",
              target.device(), ". Move one of them with .to().");
}

// Broadcast output, always contiguous: the fake implementation returns the same.
inline at::Tensor broadcast_output(const at::Tensor& a, const at::Tensor& b) {
  return at::empty(at::infer_size(a.sizes(), b.sizes()), a.options());
}

// A backward's grad must match the forward's output: the broadcast shape, pred's dtype and device.
inline void check_backward_grad(const at::Tensor& grad, const at::Tensor& out, const char* op) {
  TORCH_CHECK(grad.sizes() == out.sizes(), op, ": grad must have the broadcast shape ", shape_text(out.sizes()),
              ", got ", shape_text(grad.sizes()), ".");
  TORCH_CHECK(grad.scalar_type() == out.scalar_type(), op, ": grad must have pred's dtype ", out.scalar_type(),
              ", got ", grad.scalar_type(), ".");
  TORCH_CHECK(grad.device() == out.device(), op, ": grad must be on pred's device ", out.device(), ", got ",
              grad.device(), ".");
}

// custom_loss_grads_repeated's operands: grad and pred in the output's shape, target repeated over its leading
// dimensions (target's sizes, past any leading 1s, are the output's trailing sizes).
inline void check_repeated(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target, const char* op) {
  check_backward_grad(grad, pred, op);
  TORCH_CHECK(repeats_over_rows(target.sizes(), pred.sizes()), op,
              ": target must repeat over pred's leading dimensions (its sizes the trailing sizes of ",
              shape_text(pred.sizes()), "), got ", shape_text(target.sizes()),
              ". Use custom_loss_grads for other broadcasts.");
}

// custom_loss_backward's output, once its arguments are checked: dL/dd in the broadcast shape.
inline at::Tensor backward_output(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                                  const char* op) {
  check_pair(pred, target, op);
  at::Tensor out = broadcast_output(pred, target);
  check_backward_grad(grad, out, op);
  return out;
}

// What a two-gradient kernel reads and writes, the same on CPU and CUDA: both outputs allocated, and the three inputs
// in the layout the kernel walks. Callers name its members rather than bind them (`auto [a, b] = ...`): a C++17
// lambda, AT_DISPATCH's under torch 2.11, cannot capture a structured binding.
struct GradOperands {
  at::Tensor grad_pred, grad_target;
  at::Tensor grad, pred, target;
};

// custom_loss_grads': both gradients in the broadcast shape, grad, pred and target laid out like them (a broadcast
// input expanded, not copied), so the kernel reads all five element for element.
inline GradOperands grads_operands(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                                   const char* op) {
  at::Tensor grad_pred = backward_output(grad, pred, target, op);
  at::Tensor grad_target = at::empty_like(grad_pred);
  return {grad_pred, grad_target, with_layout_of(grad, grad_pred), with_layout_of(pred, grad_pred),
          with_layout_of(target, grad_pred)};
}

// custom_loss_grads_repeated's: dL/dpred in pred's shape, dL/dtarget in target's, the inputs contiguous (rows of
// grad and pred against target's one row).
inline GradOperands repeated_operands(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                                      const char* op) {
  check_pair(pred, target, op);
  check_repeated(grad, pred, target, op);
  return {at::empty(pred.sizes(), pred.options()), at::empty(target.sizes(), target.options()), grad.contiguous(),
          pred.contiguous(), target.contiguous()};
}

}  // namespace opforge::custom_loss
