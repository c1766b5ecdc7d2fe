"""rms_norm(x, weight, eps) = x / sqrt(mean(x**2, -1) + eps) * weight: RMSNorm over the last dimension.

The native ops (C++ kernels in opforge/csrc/rms_norm.cpp, CUDA in opforge/csrc/cuda/rms_norm.cu) get their fake
implementations and the autograd formula here. The backward ops recompute each row's 1 / rms from x, which they
read anyway: the forward writes y alone and autograd keeps only x and weight. `rms_norm_backward_input` is the
backward for a frozen weight (fine-tuning with the norms frozen): it skips the reduction across rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from opforge.ops import load_native

load_native("rms_norm")

# The native ops, typed by their schemas.
_forward: Callable[[Tensor, Tensor, float], Tensor] = torch.ops.opforge.rms_norm.default
_backward: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]] = (
    torch.ops.opforge.rms_norm_backward.default
)
_backward_input: Callable[[Tensor, Tensor, Tensor, float], Tensor] = torch.ops.opforge.rms_norm_backward_input.default

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x**2, -1) + eps) * weight by opforge's native kernels.

    float16/bfloat16 are computed in float; float32's backward sums (1 / rms and the weight gradient, a sum over all
    rows) in double, so that the weight gradient keeps float32's accuracy over many rows.
    """
    return _forward(x, weight, eps)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned per-element scale, initialized to ones."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        device: torch.types.Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return _forward(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def reference(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# ------------------------------------------------------------------------------------------ fake implementations


def _check_args(x: Tensor, weight: Tensor) -> None:
    # The messages the kernels' TORCH_CHECKs give, so that a traced graph fails as eager does.
    torch._check(x.dtype in _DTYPES, lambda: f"x must be float32, float64, float16 or bfloat16, got {x.dtype}")
    torch._check(x.dim() >= 1, lambda: "x must have at least 1 dimension (the last one is normalized)")
    torch._check(weight.dim() == 1, lambda: f"weight must be 1-D, got shape {tuple(weight.shape)}")
    torch._check(
        weight.shape[0] == x.shape[-1],
        lambda: f"weight must have x.size(-1) = {x.shape[-1]} elements, got {weight.shape[0]}",
    )
    torch._check(weight.dtype == x.dtype, lambda: f"weight must have x's dtype {x.dtype}, got {weight.dtype}")


def _check_backward_args(grad: Tensor, x: Tensor, weight: Tensor) -> None:
    _check_args(x, weight)
    torch._check(grad.shape == x.shape, lambda: f"grad must have x's shape {tuple(x.shape)}, got {tuple(grad.shape)}")
    torch._check(grad.dtype == x.dtype, lambda: f"grad must have x's dtype {x.dtype}, got {grad.dtype}")


@torch.library.register_fake("opforge::rms_norm")
def _(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    _check_args(x, weight)
    return x.new_empty(x.shape)  # contiguous, whatever x's layout: what the kernels return


@torch.library.register_fake("opforge::rms_norm_backward")
def _(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check_backward_args(grad, x, weight)
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


@torch.library.register_fake("opforge::rms_norm_backward_input")
def _(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> Tensor:
    _check_backward_args(grad, x, weight)
    return x.new_empty(x.shape)


# ------------------------------------------------------------------------------------------------------ autograd


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight = inputs[0], inputs[1]
    ctx.eps = inputs[2] if len(inputs) > 2 else 1e-6
    ctx.save_for_backward(x, weight)


def _rms_norm_grad(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
    x, weight = ctx.saved_tensors
    needs_x, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if needs_weight:
        grad_x, grad_weight = _backward(grad, x, weight, ctx.eps)
        return (grad_x if needs_x else None), grad_weight, None
    if needs_x:
        return _backward_input(grad, x, weight, ctx.eps), None, None
    return None, None, None


def _no_double_backward(ctx: Any, *grads: Tensor) -> NoReturn:
    raise NotImplementedError(
        "opforge::rms_norm: double backward is not implemented (the backward ops have no derivative). "
        "Use torch.nn.functional.rms_norm where second derivatives are needed."
    )


def _save_nothing(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    pass


torch.library.register_autograd("opforge::rms_norm", _rms_norm_grad, setup_context=_save_inputs)
# Without these a second derivative through the backward ops would be silently missing (autograd's fallback only
# warns); with them it fails, saying why.
torch.library.register_autograd("opforge::rms_norm_backward", _no_double_backward, setup_context=_save_nothing)
torch.library.register_autograd("opforge::rms_norm_backward_input", _no_double_backward, setup_context=_save_nothing)
