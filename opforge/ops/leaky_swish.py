"""leaky_swish(x, alpha) = x * sigmoid(x) + alpha * x.

The native op (C++ kernels in opforge/csrc/leaky_swish.cpp, CUDA in opforge/csrc/cuda/leaky_swish.cu) gets its fake
implementation, autograd formula (with double backward) and vmap rule here. `leaky_swish_prototype` is the seed
article's first step: the same function as a pure-Python custom op, checked by the same spec.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from opforge.ops import load_native

load_native("leaky_swish")

_forward = torch.ops.opforge.leaky_swish.default
_backward = torch.ops.opforge.leaky_swish_backward.default


def leaky_swish(x: Tensor, alpha: float = 0.1) -> Tensor:
    """x * sigmoid(x) + alpha * x, computed by opforge's native kernels."""
    return _forward(x, alpha)


class LeakySwish(nn.Module):
    def __init__(self, alpha: float = 0.1) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return _forward(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


def reference(x: Tensor, alpha: float = 0.1) -> Tensor:
    # Factored as the kernels compute it. The seed's x * sigmoid(x) + alpha * x is the same function except at
    # x = -inf, where it gives NaN (-inf * 0 + -inf) instead of the limit -inf; the prototype keeps that form.
    return x * (torch.sigmoid(x) + alpha)


def _second_derivative(x: Tensor) -> Tensor:
    # f'' = s(1 - s)(2 + x(1 - 2s)); composite torch ops, so triple backward works too.
    s = torch.sigmoid(x)
    return s * (1 - s) * (2 + x * (1 - 2 * s))


@torch.library.register_fake("opforge::leaky_swish")
def _(x: Tensor, alpha: float = 0.1) -> Tensor:
    return torch.empty_like(x)


@torch.library.register_fake("opforge::leaky_swish_backward")
def _(grad: Tensor, x: Tensor, alpha: float) -> Tensor:
    torch._check(grad.shape == x.shape, lambda: f"grad must have x's shape {tuple(x.shape)}, got {tuple(grad.shape)}")
    return torch.empty_like(x)


def _save_x_alpha(ctx, inputs, output) -> None:
    x, alpha = inputs[0], inputs[1] if len(inputs) > 1 else 0.1
    ctx.save_for_backward(x)
    ctx.alpha = alpha


def _leaky_swish_grad(ctx, grad: Tensor):
    (x,) = ctx.saved_tensors
    return _backward(grad, x, ctx.alpha), None


def _save_backward_inputs(ctx, inputs, output) -> None:
    grad, x, alpha = inputs
    ctx.save_for_backward(grad, x)
    ctx.alpha = alpha


def _leaky_swish_backward_grad(ctx, gg: Tensor):
    grad, x = ctx.saved_tensors
    grad_grad = _backward(gg, x, ctx.alpha) if ctx.needs_input_grad[0] else None
    grad_x = gg * grad * _second_derivative(x) if ctx.needs_input_grad[1] else None
    return grad_grad, grad_x, None


torch.library.register_autograd("opforge::leaky_swish", _leaky_swish_grad, setup_context=_save_x_alpha)
torch.library.register_autograd("opforge::leaky_swish_backward", _leaky_swish_backward_grad,
                                setup_context=_save_backward_inputs)


@torch.library.register_vmap("opforge::leaky_swish")
def _(info, in_dims, x: Tensor, alpha: float = 0.1):
    # Elementwise: the batch dimension passes straight through.
    return _forward(x, alpha), in_dims[0]


# ------------------------------------------------------------------------------------- the Python prototype


@torch.library.custom_op("opforge::leaky_swish_prototype", mutates_args=())
def leaky_swish_prototype(x: Tensor, alpha: float = 0.1) -> Tensor:
    return x * torch.sigmoid(x) + alpha * x


@leaky_swish_prototype.register_fake
def _(x: Tensor, alpha: float = 0.1) -> Tensor:
    return torch.empty_like(x)


def _prototype_grad(ctx, grad: Tensor):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(x)
    return grad * (s + x * s * (1 - s) + ctx.alpha), None


leaky_swish_prototype.register_autograd(_prototype_grad, setup_context=_save_x_alpha)
