"""leaky_swish(x, alpha) = x * sigmoid(x) + alpha * x.

The native op (C++ kernels in opforge/csrc/leaky_swish.cpp, CUDA in opforge/csrc/cuda/leaky_swish.cu) gets its fake
implementation, autograd formula (with double backward) and vmap rule here. `leaky_swish_prototype` is the seed
article's first step: the same function as a pure-Python custom op, checked by the same spec.

Two mutating variants share the kernels:

- `opforge::leaky_swish_(Tensor(a!) self, float alpha=0.1) -> Tensor(a!)`, in place like torch.relu_ (tagged
  torch.Tag.inplace). A self whose elements overlap (an expanded tensor) is refused, as torch's in-place ops refuse
  it; a strided self is computed through a dense temporary and copied back.
- `opforge::leaky_swish.out(Tensor x, float alpha=0.1, *, Tensor(a!) out) -> Tensor(a!)` (tagged torch.Tag.out from
  torch 2.14 on; leaky_swish.cpp says why not before), with the conventions of PyTorch's native out= ops: out must
  have x's dtype and device, is resized to x's shape when it has another one (ATen's resize_output, with its
  warning when out held elements; on stderr, as for every torch.ops call), may be strided (written through a
  temporary), may be x itself, and may not overlap x partly.

Autograd. torch.library.register_autograd refuses any op with a mutable schema ("Cannot register autograd formula
for non-functional operator"), so both ops get hand-written Autograd kernels. The in-place op is differentiable as
torch's own in-place ops are: with grad enabled and self requiring grad it runs a torch.autograd.Function that marks
self dirty, so autograd rebases self's history onto it (a leaf that requires grad is refused, a view gets
CopySlices); its backward is the differentiable opforge::leaky_swish_backward at a copy of self taken before the
write, since the kernel overwrites the value the derivative needs (one extra pass, only when a gradient is wanted).
Double backward follows from the functional op's. The out= overload is not differentiable, as torch's out= ops are
not: with grad enabled and an argument that requires grad it raises torch's error. Both kernels bump the mutated
tensor's version counter, which the dispatcher's fallback for an op without an Autograd kernel does not do.

torch.compile. Under functionalization both ops are traced as the functional op plus a copy into the mutated
tensor (rules below: inductor miscompiles custom ops that return their mutated argument). There out must already
have x's shape: a custom op may not change an argument's metadata under functionalization, so the out= fake raises
a clear error instead of resizing. Dynamo itself refuses a non-contiguous out= tensor for every op (a graph break;
an error under fullgraph=True).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch._subclasses.functional_tensor import FunctionalTensorMode

from opforge.ops import load_native

if TYPE_CHECKING:
    from torch._functorch.autograd_function import VmapInfo

load_native("leaky_swish")

# The native ops, typed by their schemas.
_forward: Callable[[Tensor, float], Tensor] = torch.ops.opforge.leaky_swish.default
_backward: Callable[[Tensor, Tensor, float], Tensor] = torch.ops.opforge.leaky_swish_backward.default
_inplace: Callable[[Tensor, float], Tensor] = torch.ops.opforge.leaky_swish_.default
_out: Callable[..., Tensor] = torch.ops.opforge.leaky_swish.out


def leaky_swish(x: Tensor, alpha: float = 0.1) -> Tensor:
    """x * sigmoid(x) + alpha * x, computed by opforge's native kernels."""
    return _forward(x, alpha)


def leaky_swish_(x: Tensor, alpha: float = 0.1) -> Tensor:
    """x <- x * sigmoid(x) + alpha * x in place; returns x."""
    return _inplace(x, alpha)


def leaky_swish_out(x: Tensor, alpha: float = 0.1, *, out: Tensor) -> Tensor:
    """leaky_swish(x, alpha) written into out, which must have x's dtype and device and is resized to x's shape
    (eager only; ATen's warning, on stderr as for every torch.ops call, when out held elements); returns out."""
    return _out(x, alpha, out=out)


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


def reference_(self: Tensor, alpha: float = 0.1) -> tuple[Tensor, Tensor]:
    """The in-place op's reference: what it returns (self), then the new value of the mutated self."""
    new = reference(self, alpha)
    return new, new


def reference_out(x: Tensor, alpha: float = 0.1, *, out: Tensor) -> tuple[Tensor, Tensor]:
    """The out= overload's reference: what it returns (out), then the new value of the mutated out."""
    new = reference(x, alpha)
    return new, new


def _second_derivative(x: Tensor) -> Tensor:
    # f'' = s(1 - s)(2 + x(1 - 2s)); composite torch ops, so triple backward works too.
    s = torch.sigmoid(x)
    return s * (1 - s) * (2 + x * (1 - 2 * s))


@torch.library.register_fake("opforge::leaky_swish")
def _(x: Tensor, alpha: float = 0.1) -> Tensor:
    return torch.empty_like(x)


@torch.library.register_fake("opforge::leaky_swish_")
def _(self: Tensor, alpha: float = 0.1) -> Tensor:
    _check_floating(self, "opforge::leaky_swish_", "self")
    return self


@torch.library.register_fake("opforge::leaky_swish.out")
def _(x: Tensor, alpha: float = 0.1, *, out: Tensor) -> Tensor:
    _check_out(x, out)
    return out


def _check_out(x: Tensor, out: Tensor) -> None:
    """The C++ kernels' checks of out, for traced calls; resizing is left to eager calls."""
    op = "opforge::leaky_swish.out"
    _check_floating(x, op, "x")
    torch._check(
        out.dtype == x.dtype,
        lambda: (
            f"{op}: out must have x's dtype {_aten_name(x.dtype)}, got {_aten_name(out.dtype)}. "
            "Allocate out with x's dtype, e.g. torch.empty_like(x)."
        ),
    )
    torch._check(
        out.device == x.device,
        lambda: (
            f"{op}: out must be on x's device {x.device}, got {out.device}. "
            "Allocate out on x's device, e.g. torch.empty_like(x)."
        ),
    )
    torch._check(
        out.shape == x.shape,
        lambda: (
            f"{op}: out must have x's shape {tuple(x.shape)} under torch.compile, got {tuple(out.shape)}. "
            "Pass an out of x's shape (only eager calls resize it), e.g. torch.empty_like(x)."
        ),
    )


# The kernels' dtypes, by the names ATen prints in the C++ checks' messages: the fakes' messages read the same.
_ATEN_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16"}


def _aten_name(dtype: torch.dtype) -> str:
    return _ATEN_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _check_floating(t: Tensor, op: str, name: str) -> None:
    torch._check(
        t.dtype in _ATEN_NAMES,
        lambda: (
            f"{op}: {name} must be float32, float64, float16 or bfloat16, got "
            f"{_aten_name(t.dtype)}. Cast it first, e.g. {name}.float()."
        ),
    )


@torch.library.register_fake("opforge::leaky_swish_backward")
def _(grad: Tensor, x: Tensor, alpha: float) -> Tensor:
    torch._check(grad.shape == x.shape, lambda: f"grad must have x's shape {tuple(x.shape)}, got {tuple(grad.shape)}")
    return torch.empty_like(x)


def _save_x_alpha(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, alpha = inputs[0], inputs[1] if len(inputs) > 1 else 0.1
    ctx.save_for_backward(x)
    ctx.alpha = alpha


def _leaky_swish_grad(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    (x,) = ctx.saved_tensors
    return _backward(grad, x, ctx.alpha), None


def _save_backward_inputs(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    grad, x, alpha = inputs
    ctx.save_for_backward(grad, x)
    ctx.alpha = alpha


def _leaky_swish_backward_grad(ctx: Any, gg: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
    grad, x = ctx.saved_tensors
    grad_grad = _backward(gg, x, ctx.alpha) if ctx.needs_input_grad[0] else None
    grad_x = gg * grad * _second_derivative(x) if ctx.needs_input_grad[1] else None
    return grad_grad, grad_x, None


torch.library.register_autograd("opforge::leaky_swish", _leaky_swish_grad, setup_context=_save_x_alpha)
torch.library.register_autograd(
    "opforge::leaky_swish_backward", _leaky_swish_backward_grad, setup_context=_save_backward_inputs
)


# ---------------------------------------------------------------------- autograd of the in-place and out= variants

# Where the two hand-written Autograd kernels live (torch.library.register_autograd refuses mutating ops).
_lib = torch.library.Library("opforge", "IMPL")


class _LeakySwishInPlace(torch.autograd.Function):
    """self <- leaky_swish(self), self marked dirty. The derivative is taken at `before`, a copy of self made before
    the write with self's history: the gradient goes to self's own edge (a view's CopySlices needs it there), and
    a double backward reaches self's history through `before`."""

    @staticmethod
    def forward(ctx: Any, self: Tensor, before: Tensor, alpha: float) -> Tensor:
        _inplace(self, alpha)  # grad mode is off in here: the kernel's no-grad path below
        ctx.mark_dirty(self)
        ctx.save_for_backward(before)
        ctx.alpha = alpha
        return self

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (before,) = ctx.saved_tensors
        return _backward(grad, before, ctx.alpha), None, None


# Function.apply is untyped in torch, and mypy names the call by the subclass, out of untyped_calls_exclude's reach:
# typed here by forward's signature, as the native ops are above.
_apply_inplace: Callable[[Tensor, Tensor, float], Tensor] = _LeakySwishInPlace.apply


def _leaky_swish_inplace_autograd(self: Tensor, alpha: float = 0.1) -> Tensor:
    if torch.is_grad_enabled() and self.requires_grad:
        return _apply_inplace(self, self.clone(), alpha)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        _inplace(self, alpha)
    torch.autograd.graph.increment_version(self)
    return self


def _leaky_swish_out_autograd(x: Tensor, alpha: float = 0.1, *, out: Tensor) -> Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        # torch's own out= ops raise the same.
        raise RuntimeError(
            "opforge::leaky_swish.out: functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad. Call leaky_swish(x) for a "
            "differentiable result, or pass x.detach()."
        )
    with torch._C._AutoDispatchBelowADInplaceOrView():
        _out(x, alpha, out=out)
    torch.autograd.graph.increment_version(out)
    return out


_lib.impl("leaky_swish_", _leaky_swish_inplace_autograd, "Autograd")
_lib.impl("leaky_swish.out", _leaky_swish_out_autograd, "Autograd")


# ------------------------------------------------------------------ the mutating variants under torch.compile

# Under functionalization (torch.compile's and torch.export's FunctionalTensorMode) both mutating ops are traced as
# the functional op followed by a copy into the mutated tensor, instead of the auto_functionalized_v2 node the
# inplace/out tags would give. Inductor (torch 2.13.0 and 2.14.1, tested) lowers that node to a call of the op whose
# returned alias it does not track: it frees the mutated buffer after the call and reuses its storage while the
# alias is still read, so later ops read wrong values (torch's own torch.library.custom_op examples with
# tags=torch.Tag.inplace / torch.Tag.out miscompile the same way; pytorch/pytorch#189735 records that alias for ops
# that return their first argument, and 2.14.1, which has it, still reuses the storage).
# The copy costs one pass when the mutated tensor is a graph input; for an intermediate inductor fuses it into the
# kernel that reads the result next.


@torch.library.register_torch_dispatch("opforge::leaky_swish_", FunctionalTensorMode)
def _(
    mode: FunctionalTensorMode,
    func: torch._ops.OpOverload,
    types: tuple[type, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Tensor:
    self, alpha = _with_alpha(args, kwargs)
    with mode:
        return self.copy_(_forward(self, alpha))


@torch.library.register_torch_dispatch("opforge::leaky_swish.out", FunctionalTensorMode)
def _(
    mode: FunctionalTensorMode,
    func: torch._ops.OpOverload,
    types: tuple[type, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Tensor:
    x, alpha = _with_alpha(args, kwargs)
    out: Tensor = kwargs["out"]
    _check_out(x, out)
    with mode:
        return out.copy_(_forward(x, alpha))


def _with_alpha(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, float]:
    # The dispatcher drops an argument equal to its default.
    return args[0], args[1] if len(args) > 1 else kwargs.get("alpha", 0.1)


@torch.library.register_vmap("opforge::leaky_swish")
def _(info: VmapInfo, in_dims: tuple[int | None, ...], x: Tensor, alpha: float = 0.1) -> tuple[Tensor, int | None]:
    # Elementwise: the batch dimension passes straight through.
    return _forward(x, alpha), in_dims[0]


# ------------------------------------------------------------------------------------- the Python prototype


@torch.library.custom_op("opforge::leaky_swish_prototype", mutates_args=())
def leaky_swish_prototype(x: Tensor, alpha: float = 0.1) -> Tensor:
    return x * torch.sigmoid(x) + alpha * x


@leaky_swish_prototype.register_fake
def _(x: Tensor, alpha: float = 0.1) -> Tensor:
    return torch.empty_like(x)


def _prototype_grad(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(x)
    return grad * (s + x * s * (1 - s) + ctx.alpha), None


leaky_swish_prototype.register_autograd(_prototype_grad, setup_context=_save_x_alpha)
