"""custom_loss(pred, target) = where(d < 0, d**2, |d|), d = pred - target, elementwise with broadcasting.

The seed article's custom loss as a native op (opforge/csrc/custom_loss.cpp). Its backward op returns dL/dd in
the broadcast shape; the autograd formula below reduces it to each input's shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from opforge.ops import load_native

load_native("custom_loss")

_forward = torch.ops.opforge.custom_loss.default
_backward = torch.ops.opforge.custom_loss_backward.default


def custom_loss(pred: Tensor, target: Tensor) -> Tensor:
    return _forward(pred, target)


def reference(pred: Tensor, target: Tensor) -> Tensor:
    diff = pred - target
    return torch.where(diff < 0, diff**2, diff.abs())


def _broadcast_empty(pred: Tensor, target: Tensor) -> Tensor:
    torch._check(pred.dtype == target.dtype, lambda: f"target must have pred's dtype {pred.dtype}, got {target.dtype}")
    shape = torch.broadcast_shapes(pred.shape, target.shape)
    return pred.new_empty(shape)


@torch.library.register_fake("opforge::custom_loss")
def _(pred: Tensor, target: Tensor) -> Tensor:
    return _broadcast_empty(pred, target)


@torch.library.register_fake("opforge::custom_loss_backward")
def _(grad: Tensor, pred: Tensor, target: Tensor) -> Tensor:
    return _broadcast_empty(pred, target)


def _save_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _custom_loss_grad(ctx, grad: Tensor):
    pred, target = ctx.saved_tensors
    # A broadcast input's gradient sums many terms of dL/dd. In float16/bfloat16 each term would be rounded before
    # the sum and the roundings add up (seen: 7% off in bfloat16 over 33 rows), so compute the terms in float32
    # and round the sums once, as ATen's own reductions do.
    reduces = pred.shape != grad.shape or target.shape != grad.shape
    wide = torch.float32 if reduces and grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    grad_d = _backward(grad.to(wide), pred.to(wide), target.to(wide))
    grad_pred = grad_d.sum_to_size(pred.shape).to(pred.dtype) if ctx.needs_input_grad[0] else None
    grad_target = (-grad_d).sum_to_size(target.shape).to(target.dtype) if ctx.needs_input_grad[1] else None
    return grad_pred, grad_target


torch.library.register_autograd("opforge::custom_loss", _custom_loss_grad, setup_context=_save_inputs)
