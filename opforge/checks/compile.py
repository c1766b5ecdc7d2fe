"""compile: torch.compile(fullgraph=True, dynamic=True) with inductor over every shape, against eager."""

from __future__ import annotations

from dataclasses import replace

from opforge.cases import Case, layout_applies
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
from opforge.checks.calls import inputs_for, outputs_of
from opforge.compare import as_tuple, check_result, tolerance_for
from opforge.loading import LoadedOp, Target
from opforge.outcomes import CheckFailure, short


def compile_check(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    spec = ctx.loaded.spec
    tensors = spec.tensor_inputs()
    torch._dynamo.reset()  # a fresh cache, so earlier cases' graphs neither help nor hit the recompile limit

    def call(*args, **kwargs):
        return target.fn(*args, **kwargs)

    compiled = torch.compile(call, fullgraph=True, dynamic=True, backend="inductor")
    tol = tolerance_for(spec, case.dtype)
    for shape_index in range(spec.shape_count):
        shapes = tuple((t.name, t.shapes[shape_index]) for t in tensors)
        if not all(layout_applies(case.layout, s) for _, s in shapes):
            continue
        shaped = replace(case, shape_index=shape_index, shapes=shapes)
        inputs = inputs_for(ctx.loaded, shaped, ctx.base_seed)
        eager = outputs_of(ctx.loaded, target, inputs)
        try:
            got = as_tuple(compiled(*inputs.args, **inputs.kwargs))
        except Exception as exc:
            raise CheckFailure(
                f"torch.compile(fullgraph=True) of {target.name} failed on {shaped.id}: {short(exc)}"
            ) from exc
        for i, (g, e) in enumerate(zip(got, eager)):
            check_result(f"compiled result[{i}] ({shaped.id})", g, e, tol, e.dtype, case.device)
    return {"compile": None}


def all_shapes_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """One case per dtype/device/layout that runs every shape through one compiled function (dynamic shapes)."""
    seen: dict[str, Case] = {}
    for case in first_values(loaded, target, cases):
        merged = replace(case, shapes=(), shape_index=-1)
        seen.setdefault(merged.id, merged)
    return list(seen.values())


CHECKS = (
    Check(
        "compile",
        "torch.compile(fullgraph=True, dynamic=True) with inductor over every shape, against eager",
        all_shapes_cases,
        compile_check,
    ),
)
