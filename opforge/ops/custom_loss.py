"""custom_loss(pred, target) = where(d < 0, d**2, |d|), d = pred - target, elementwise with broadcasting.

The seed article's custom loss as a native op (opforge/csrc/custom_loss.cpp). Its backward ops work in the
broadcast shape: custom_loss_grads returns the gradients of pred and target (dL/dd and -dL/dd) from one pass over
grad, pred and target; custom_loss_backward returns dL/dd alone, which is pred's gradient when target's is not
wanted (benchmarks/cuda_bandwidth.py times it as the 3-input kernel). The autograd formula below reduces each
gradient to its input's shape, only where that input was broadcast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from opforge.ops import load_native

load_native("custom_loss")

# The native ops, typed by their schemas.
_forward: Callable[[Tensor, Tensor], Tensor] = torch.ops.opforge.custom_loss.default
_backward: Callable[[Tensor, Tensor, Tensor], Tensor] = torch.ops.opforge.custom_loss_backward.default
_grads: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] = torch.ops.opforge.custom_loss_grads.default
_grads_repeated: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] = (
    torch.ops.opforge.custom_loss_grads_repeated.default
)


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


@torch.library.register_fake("opforge::custom_loss_grads")
def _(grad: Tensor, pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    grad_pred = _broadcast_empty(pred, target)
    return grad_pred, torch.empty_like(grad_pred)


@torch.library.register_fake("opforge::custom_loss_grads_repeated")
def _(grad: Tensor, pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    torch._check(
        _repeats_over_rows(target, pred.shape),
        lambda: f"target must repeat over pred's leading dimensions {list(pred.shape)}, got {list(target.shape)}",
    )
    return torch.empty_like(pred, memory_format=torch.contiguous_format), target.new_empty(target.shape)


def _repeats_over_rows(target: Tensor, shape: Sequence[int]) -> bool:
    """Whether target's sizes, past any leading 1s, are the trailing sizes of `shape`: a target repeated over the
    rows of the output (a per-feature target)."""
    sizes = list(target.shape)
    while sizes and sizes[0] == 1:
        sizes.pop(0)
    return len(sizes) <= len(shape) and sizes == list(shape)[len(shape) - len(sizes) :]


def _save_inputs(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _custom_loss_grad(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    pred, target = ctx.saved_tensors
    want_pred, want_target = ctx.needs_input_grad[:2]
    if (
        want_target
        and target.shape != grad.shape
        and pred.shape == grad.shape
        and _repeats_over_rows(target, grad.shape)
    ):
        # A per-feature target: both gradients from one pass, target's summed over the rows inside the op.
        grad_pred, grad_target = _grads_repeated(grad, pred, target)
        return (grad_pred if want_pred else None), grad_target
    # A broadcast input's gradient sums many terms of dL/dd. In float16/bfloat16 each term would be rounded before
    # the sum and the roundings add up (seen: 7% off in bfloat16 over 33 rows), so compute the terms in float32
    # and round the sums once, as ATen's own reductions do. Equal shapes: no cast, no reduction, one kernel pass.
    reduces = (want_pred and pred.shape != grad.shape) or (want_target and target.shape != grad.shape)
    wide = torch.float32 if reduces and grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    args = (grad.to(wide), pred.to(wide), target.to(wide))
    if want_target and target.shape == grad.shape:
        grad_pred, grad_target = _grads(*args)
        return _reduced(grad_pred, pred) if want_pred else None, grad_target.to(target.dtype)
    # A broadcast target's gradient is -sum(dL/dd) over its broadcast dimensions: negate the reduced sum rather than
    # write -dL/dd in the full shape only to sum it (the same values: negation is exact).
    grad_d = _backward(*args)
    grad_target_sum = -_reduced(grad_d, target) if want_target else None
    return _reduced(grad_d, pred) if want_pred else None, grad_target_sum


def _reduced(grad: Tensor, like: Tensor) -> Tensor:
    """`grad` summed over the dimensions `like` was broadcast along, in like's dtype; itself when nothing was."""
    return grad.sum_to_size(like.shape).to(like.dtype)


torch.library.register_autograd("opforge::custom_loss", _custom_loss_grad, setup_context=_save_inputs)
