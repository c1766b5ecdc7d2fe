"""Comparing an op's results with the reference: tolerances, metadata, and the worst mismatching element."""

from __future__ import annotations

import math
from typing import Any

from opforge.outcomes import CheckFailure
from opforge.results import Mismatch
from opforge.spec.model import OpSpec, Tolerance

# torch.testing.assert_close's defaults, which users already know.
DEFAULT_TOLERANCES = {
    "float64": Tolerance(atol=1e-7, rtol=1e-7),
    "float32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "float16": Tolerance(atol=1e-5, rtol=1e-3),
    "bfloat16": Tolerance(atol=1e-5, rtol=1.6e-2),
    "complex128": Tolerance(atol=1e-7, rtol=1e-7),
    "complex64": Tolerance(atol=1e-5, rtol=1.3e-6),
}
EXACT = Tolerance(atol=0.0, rtol=0.0)


def tolerance_for(spec: OpSpec, dtype: str, grad: bool = False) -> Tolerance:
    table = dict(spec.tolerances)
    if grad:
        table.update(dict(spec.grad_tolerances))
    return table.get(dtype, DEFAULT_TOLERANCES.get(dtype, EXACT))


def as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def check_result(
    name: str, got: Any, expected: Any, tol: Tolerance, dtype: Any, device: str, against: str = "the reference"
) -> None:
    """`got` must be a tensor of `dtype` on `device`, shaped like `expected`, and close to it; `against` names what
    `expected` is in the failure message."""
    import torch

    if not isinstance(expected, torch.Tensor):
        if got != expected and not (_both_nan(got, expected)):
            raise CheckFailure(f"{name}: expected {expected!r}, got {got!r}.")
        return
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"{name}: expected a Tensor, got {type(got).__name__}.")
    if tuple(got.shape) != tuple(expected.shape):
        raise CheckFailure(f"{name}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}.")
    if got.dtype != dtype:
        raise CheckFailure(f"{name}: expected dtype {dtype}, got {got.dtype}.")
    if got.device.type != device:
        raise CheckFailure(f"{name}: expected a tensor on {device}, got one on {got.device}.")
    mismatch = worst_mismatch(name, got, expected, tol)
    if mismatch is not None:
        raise CheckFailure(
            f"{name}: {mismatch.mismatched} of {mismatch.total} elements differ from {against} beyond tolerance.",
            mismatch,
        )


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def worst_mismatch(name: str, got: Any, expected: Any, tol: Tolerance) -> Mismatch | None:
    """None when every element is within atol + rtol * |expected| (NaN matches NaN, inf matches inf)."""
    import torch

    g = got.detach().to("cpu", torch.complex128 if got.is_complex() else torch.float64)
    e = expected.detach().to("cpu", g.dtype)
    if g.numel() == 0:
        return None
    error = (g - e).abs()
    allowed = tol.atol + tol.rtol * e.abs()
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    excess = torch.where(same, torch.zeros_like(error), error - allowed)
    excess = torch.where(torch.isnan(excess), torch.full_like(excess, math.inf), excess)
    bad = excess > 0
    if not bool(bad.any()):
        return None
    flat = int(torch.argmax(excess.reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(g.shape))) if g.dim() else ()
    got_v, exp_v = g.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()
    abs_error = abs(got_v - exp_v)
    rel_error = abs_error / abs(exp_v) if exp_v else math.inf
    return Mismatch(
        output=name,
        index=index,
        got=_plain(got_v),
        expected=_plain(exp_v),
        abs_error=float(abs_error),
        rel_error=float(rel_error),
        atol=tol.atol,
        rtol=tol.rtol,
        mismatched=int(bad.sum()),
        total=g.numel(),
    )


def _plain(value: Any) -> Any:
    return value if isinstance(value, complex) else float(value)
