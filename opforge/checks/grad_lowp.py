"""grad_lowp: gradients computed in the case's dtype against autograd through the float64 reference."""

from __future__ import annotations

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.compare import check_result, rule_for
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes
from opforge.checks.op_and_reference import (
    argument,
    compared_with,
    differentiated,
    inputs_for,
    judged_nothing,
    nothing_judged,
    vector_jacobian_products,
)
from opforge.core.outcomes import CheckFailure, CheckSkipped


def grad_lowp(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """Gradients computed in the case's dtype vs autograd through the float64 reference (same grad_output)."""
    import torch

    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = differentiated(loaded, inputs)
    grads, ref_grads, baseline = vector_jacobian_products(loaded, implementation, case, ctx.base_seed, inputs, names)
    if judged_nothing(loaded, implementation, inputs):
        raise CheckSkipped(nothing_judged(loaded))
    rule = rule_for(loaded.spec, case.dtype, grad=True)
    for name, g, e in zip(names, grads, ref_grads):
        t = argument(inputs, loaded, name)
        if g is None:
            raise CheckFailure(f"grad[{name}]: expected a gradient, got None. Return it from the backward formula.")
        expected = e if e is not None else torch.zeros_like(g, dtype=torch.float64)
        check_result(
            f"grad[{name}]", g, expected, rule, t.dtype, case.device, against=_against(loaded), baseline=baseline
        )
    return {"grad_lowp": compared_with(loaded)}


def _against(loaded: LoadedOp) -> str:
    """What the gradients are compared with: autograd through the reference."""
    return f"autograd through {loaded.reference_label}"


def low_precision_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    if not loaded.spec.differentiable:
        return []
    return [c for c in cases if c.dtype != "float64"]


CHECKS = (
    Check(
        "grad_lowp",
        "gradients in every claimed dtype against autograd through the float64 reference",
        low_precision_cases,
        grad_lowp,
        default_when=("differentiable",),
    ),
)
