"""gradcheck and gradgradcheck in float64, with the worst gradient mismatch against the reference on failure."""

from __future__ import annotations

from dataclasses import replace

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes
from opforge.checks.calls import argument, differentiated, inputs_for, vector_jacobian_products, with_arguments
from opforge.compare import tolerance_for, worst_mismatch
from opforge.loading import LoadedOp, Target
from opforge.outcomes import CheckFailure, short

# Above this many elements across the differentiated inputs, gradcheck's exact mode builds an n x n Jacobian one
# perturbation at a time; fast mode checks random projections of it instead (torch's own recommendation).
EXACT_JACOBIAN_MAX_ELEMENTS = 512


def gradcheck(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    return {"gradcheck": _run(ctx, target, case, torch.autograd.gradcheck)}


def gradgradcheck(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    return {"gradgradcheck": _run(ctx, target, case, torch.autograd.gradgradcheck)}


def _run(ctx: CheckContext, target: Target, case: Case, checker) -> CheckFailure | None:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = differentiated(loaded, inputs)
    wrt = tuple(argument(inputs, loaded, n) for n in names)
    if sum(t.numel() for t in wrt) == 0:
        return None  # nothing to differentiate; the empty case is covered by correctness and opcheck

    def fn(*tensors):
        args, kwargs = with_arguments(loaded, inputs, dict(zip(names, tensors)))
        return target.fn(*args, **kwargs)

    fast = sum(t.numel() for t in wrt) > EXACT_JACOBIAN_MAX_ELEMENTS
    try:
        checker(fn, wrt, fast_mode=fast, raise_exception=True)
    except Exception as exc:
        return CheckFailure(f"{checker.__name__} failed: {short(exc)}", _gradient_mismatch(ctx, target, case, names))
    return None


def _gradient_mismatch(ctx, target, case, names):
    """Where the op's vector-Jacobian product departs most from the reference's, to show next to the verdict."""
    loaded = ctx.loaded
    try:
        inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
        got, expected = vector_jacobian_products(loaded, target, case, ctx.base_seed, inputs, names)
    except Exception:
        return None  # the verdict stands on its own; this is only a pointer to where
    tol = tolerance_for(loaded.spec, "float64", grad=True)
    for name, g, e in zip(names, got, expected):
        if g is not None and e is not None:
            mismatch = worst_mismatch(f"grad[{name}]", g, e, tol)
            if mismatch:
                return mismatch
    return None


def float64_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """gradcheck runs in float64 whatever dtypes the op claims: one case per device/layout/shape/values point."""
    if not loaded.spec.differentiable:
        return []
    seen: dict[str, Case] = {}
    for case in cases:
        as64 = replace(case, dtype="float64")
        seen.setdefault(as64.id, as64)
    return list(seen.values())


def double_backward_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return float64_cases(loaded, target, cases) if loaded.spec.double_backward else []


CHECKS = (
    Check(
        "gradcheck",
        "gradients against finite differences (torch.autograd.gradcheck in float64)",
        float64_cases,
        gradcheck,
        default_when=("differentiable",),
    ),
    Check(
        "gradgradcheck",
        "second derivatives against finite differences of the gradient (torch.autograd.gradgradcheck)",
        double_backward_cases,
        gradgradcheck,
        default_when=("differentiable", "double_backward"),
    ),
)
