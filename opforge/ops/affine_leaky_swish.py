"""affine_leaky_swish(x, scale, shift, alpha) = leaky_swish(x * scale[c] + shift[c]) on (N, C, H, W) x.

An inference-time batch norm folded into a per-channel scale and shift, fused with the activation (leaky_swish(v) =
v * (sigmoid(v) + alpha), see opforge/ops/leaky_swish.py). The native kernels (opforge/csrc/affine_leaky_swish.cpp,
CUDA in opforge/csrc/cuda/affine_leaky_swish.cu) walk NCHW and channels_last (NHWC) inputs each in their own layout,
and return the input's layout. Here: their fake implementations, the autograd formula, and `reference`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

from opforge.ops import load_native

load_native("affine_leaky_swish")

# The native ops, typed by their schemas.
_forward: Callable[[Tensor, Tensor, Tensor, float], Tensor] = torch.ops.opforge.affine_leaky_swish.default
_backward: Callable[[Tensor, Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor, Tensor]] = (
    torch.ops.opforge.affine_leaky_swish_backward.default
)


def affine_leaky_swish(x: Tensor, scale: Tensor, shift: Tensor, alpha: float = 0.1) -> Tensor:
    """leaky_swish(x * scale[c] + shift[c]) for x of shape (N, C, H, W) and scale, shift of shape (C,)."""
    return _forward(x, scale, shift, alpha)


def fold_batch_norm(bn: torch.nn.BatchNorm2d) -> tuple[Tensor, Tensor]:
    """The scale and shift that make x * scale[c] + shift[c] equal an eval-mode `bn(x)`."""
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:
        raise ValueError("fold_batch_norm needs running statistics: a BatchNorm2d with track_running_stats=True")
    weight = bn.weight if bn.weight is not None else torch.ones_like(mean)
    bias = bn.bias if bn.bias is not None else torch.zeros_like(mean)
    scale = weight / torch.sqrt(var + bn.eps)
    return scale, bias - mean * scale


def _per_channel(p: Tensor) -> Tensor:
    return p.reshape(1, -1, 1, 1)


def reference(x: Tensor, scale: Tensor, shift: Tensor, alpha: float = 0.1) -> Tensor:
    v = x * _per_channel(scale) + _per_channel(shift)
    return v * (torch.sigmoid(v) + alpha)


def output_format(x: Tensor) -> torch.memory_format:
    """The memory format the kernels return for x (kernel_format in opforge/csrc/affine_leaky_swish.h): channels_last
    when x is and is not also contiguous (an empty x: contiguous whatever its strides), else contiguous when x is,
    else the format x's strides suggest."""
    nchw = x.is_contiguous()
    if x.is_contiguous(memory_format=torch.channels_last) and (not nchw or x.numel() == 0):
        return torch.channels_last
    if nchw:
        return torch.contiguous_format
    return suggest_memory_format(x)


def _check_fake_inputs(x: Tensor, scale: Tensor, shift: Tensor) -> None:
    torch._check(x.dim() == 4, lambda: f"x must be 4-D (N, C, H, W), got {x.dim()}-D shape {tuple(x.shape)}")
    for name, p in (("scale", scale), ("shift", shift)):
        torch._check(
            p.dim() == 1 and p.shape[0] == x.shape[1],
            lambda name=name, p=p: f"{name} must be 1-D with x's {x.shape[1]} channels, got {tuple(p.shape)}",
        )
        torch._check(p.dtype == x.dtype, lambda name=name, p=p: f"{name} must have x's dtype {x.dtype}, got {p.dtype}")


@torch.library.register_fake("opforge::affine_leaky_swish")
def _(x: Tensor, scale: Tensor, shift: Tensor, alpha: float = 0.1) -> Tensor:
    _check_fake_inputs(x, scale, shift)
    return torch.empty_like(x, memory_format=output_format(x))


@torch.library.register_fake("opforge::affine_leaky_swish_backward")
def _(grad: Tensor, x: Tensor, scale: Tensor, shift: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    _check_fake_inputs(x, scale, shift)
    torch._check(grad.shape == x.shape, lambda: f"grad must have x's shape {tuple(x.shape)}, got {tuple(grad.shape)}")
    return (
        torch.empty_like(x, memory_format=output_format(x)),
        scale.new_empty(scale.shape),
        shift.new_empty(shift.shape),
    )


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, scale, shift = inputs[:3]
    ctx.save_for_backward(x, scale, shift)
    ctx.alpha = inputs[3] if len(inputs) > 3 else 0.1


def _affine_leaky_swish_grad(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
    x, scale, shift = ctx.saved_tensors
    grad_x, grad_scale, grad_shift = _backward(grad, x, scale, shift, ctx.alpha)
    needs = ctx.needs_input_grad
    return (grad_x if needs[0] else None, grad_scale if needs[1] else None, grad_shift if needs[2] else None, None)


torch.library.register_autograd("opforge::affine_leaky_swish", _affine_leaky_swish_grad, setup_context=_save_inputs)
