"""gradcheck and gradgradcheck: gradients against finite differences, in float64, or for an op that does not claim
float64 in its most precise claimed dtype with a step and tolerances suited to it; the worst gradient mismatch
against the reference is shown on failure."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, aligned
from opforge.checks.calls import argument, differentiated, inputs_for, vector_jacobian_products, with_arguments
from opforge.compare import tolerance_for, worst_mismatch
from opforge.loading import LoadedOp, Target
from opforge.outcomes import CheckFailure, short

# Above this many elements across the differentiated inputs, gradcheck's exact mode builds an n x n Jacobian one
# perturbation at a time; fast mode checks random projections of it instead (torch's own recommendation).
EXACT_JACOBIAN_MAX_ELEMENTS = 512


@dataclass(frozen=True)
class FiniteDifferences:
    """gradcheck's step and tolerances in one dtype."""

    eps: float
    atol: float
    rtol: float


# The finite-difference settings per dtype, most precise first: an op that does not claim float64 (a float32-only
# kernel rejects it) is checked in the first dtype here it claims. A central difference in a dtype with unit roundoff
# u has error ~ u|f|/eps (rounding) + eps^2|f3|/6 (truncation, f3 the third derivative), and x + eps is itself rounded
# to u|x|. float64: torch.autograd.gradcheck's own defaults. float32 (u = 6e-8): eps 1e-3 keeps the rounding term
# near 6e-5|f| and the truncation near 2e-7|f3|, under atol 1e-3 / rtol 1e-2 for values and derivatives of order
# 1-10. float16 (u = 4.9e-4) and bfloat16 (u = 3.9e-3): steps of 1e-1 and 2.5e-1 keep x + eps within 2% of the
# intended step, and the tolerances (5e-2, 1e-1) still catch the usual gradient bugs (a missing factor or term, a
# wrong sign: errors of order 1). Coarse, but the alternative is no gradient check at all for such an op.
FINITE_DIFFERENCES = {
    "float64": FiniteDifferences(eps=1e-6, atol=1e-5, rtol=1e-3),
    "float32": FiniteDifferences(eps=1e-3, atol=1e-3, rtol=1e-2),
    "float16": FiniteDifferences(eps=1e-1, atol=5e-2, rtol=5e-2),
    "bfloat16": FiniteDifferences(eps=2.5e-1, atol=1e-1, rtol=1e-1),
}


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
    steps = FINITE_DIFFERENCES[case.dtype]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # gradcheck warns about every input that is not float64: here that is the dtype chosen on purpose.
        warnings.filterwarnings("ignore", message=".*double precision floating point.*")
        try:
            checker(fn, wrt, eps=steps.eps, atol=steps.atol, rtol=steps.rtol, fast_mode=fast, raise_exception=True)
            failure = None
        except Exception as exc:
            failure = exc
    for warning in caught:  # on to the row's own record of warnings
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if failure is None:
        return None
    hint = NO_AUTOGRAD_HINT if any(NO_AUTOGRAD_WARNING in str(w.message) for w in caught) else ""
    return CheckFailure(
        f"{checker.__name__} failed: {short(failure)}{hint}", _gradient_mismatch(ctx, target, case, names)
    )


# What PyTorch says, as a warning only, when autograd meets an op with no autograd kernel: the gradient through it
# is then silently missing (None, treated as zero). For gradgradcheck that is a backward op without its own formula.
NO_AUTOGRAD_WARNING = "an autograd kernel was not registered to the Autograd key"
NO_AUTOGRAD_HINT = (
    " An op on the gradient's path has no autograd formula (see the warning below), so the derivative through it is"
    " silently missing; for gradgradcheck that is the backward op: register its own autograd formula"
    " (torch.library.register_autograd on the backward op) or compute the backward from differentiable ops."
)


def _gradient_mismatch(ctx, target, case, names):
    """Where the op's vector-Jacobian product departs most from the reference's, to show next to the verdict."""
    loaded = ctx.loaded
    try:
        inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
        got, expected, _ = vector_jacobian_products(loaded, target, case, ctx.base_seed, inputs, names)
    except Exception:
        return None  # the verdict stands on its own; this is only a pointer to where
    tol = tolerance_for(loaded.spec, case.dtype, grad=True)
    for name, g, e in zip(names, got, expected):
        if g is not None and e is not None:
            mismatch = worst_mismatch(f"grad[{name}]", g, e, tol)
            if mismatch:
                return mismatch
    return None


def finite_difference_dtype(claimed: tuple[str, ...]) -> str | None:
    """float64 when the op claims it, else the most precise floating dtype it claims (None: it claims none)."""
    return next((dtype for dtype in FINITE_DIFFERENCES if dtype in claimed), None)


def gradient_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """One case per device/layout/shape/values point, in the finite-difference dtype."""
    if not loaded.spec.differentiable:
        return []
    seen: dict[str, Case] = {}
    for case in aligned(cases):
        dtype = finite_difference_dtype(loaded.spec.dtypes_on(case.device))
        if dtype is None:
            continue
        moved = replace(case, dtype=dtype)
        seen.setdefault(moved.id, moved)
    return list(seen.values())


def double_backward_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return gradient_cases(loaded, target, cases) if loaded.spec.double_backward else []


CHECKS = (
    Check(
        "gradcheck",
        "gradients against finite differences (torch.autograd.gradcheck in float64)",
        gradient_cases,
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
