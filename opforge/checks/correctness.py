"""correctness: the op's outputs and mutated arguments against the float64 reference on every case of the matrix;
their dtype, shape and device too; inputs the schema does not declare mutable must come back untouched."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, all_cases
from opforge.checks.calls import (
    against_reference,
    argument,
    call_reference,
    compared_dtype,
    inputs_for,
    mutated_values,
    outputs_of,
)
from opforge.compare import check_result, tolerance_for
from opforge.loading import Target
from opforge.outcomes import CheckFailure


def correctness(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Outputs and mutated arguments vs the reference; dtype, shape and device too; unmutated inputs untouched."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    mutated = set(loaded.mutated_arguments)
    before = {name: argument(inputs, loaded, name).clone() for name in inputs.tensor_names if name not in mutated}
    got = outputs_of(loaded, target, inputs)
    tol = tolerance_for(loaded.spec, case.dtype)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    for name, g, e in compared:
        check_result(name, g, e, tol, compared_dtype(case.dtype, name, g, e), case.device)
    for name, original in before.items():
        value = argument(inputs, loaded, name)
        if not value.equal(original) and not (value.isnan() & original.isnan()).any():
            raise CheckFailure(
                f"{target.name} modified input {name} in place, but the schema does not declare it "
                f"mutable. Declare it as Tensor(a!) {name} or stop writing to it."
            )
    return {"correctness": None}


CHECKS = (
    Check(
        "correctness",
        "outputs and mutated arguments against the float64 reference, every dtype, shape, layout and value",
        all_cases,
        correctness,
    ),
)
