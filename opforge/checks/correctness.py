"""correctness: the op's outputs and mutated arguments against the float64 reference on every case of the matrix;
their dtype, shape and device too; inputs the schema does not declare mutable must come back untouched."""

from __future__ import annotations

from opforge.building.op import Implementation
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, OneExample, Outcomes, all_cases
from opforge.checks.op_and_reference import (
    against_reference,
    argument,
    call_reference,
    compare_with_reference,
    compared_with,
    inputs_for,
    judged_nothing,
    mutated_values,
    nothing_judged,
    output_baseline,
    outputs_of,
)
from opforge.core.outcomes import CheckFailure, CheckSkipped


def correctness(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """Outputs and mutated arguments vs the reference; dtype, shape and device too; unmutated inputs untouched."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    mutated = set(loaded.mutated_arguments)
    before = {name: argument(inputs, loaded, name).clone() for name in inputs.tensor_names if name not in mutated}
    baseline = output_baseline(loaded, inputs, case.dtype)
    got = outputs_of(loaded, implementation, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    unjudged = judged_nothing(loaded, implementation, inputs)
    if not unjudged:
        compare_with_reference(loaded, case.dtype, case.device, compared, baseline)
    for name, original in before.items():
        value = argument(inputs, loaded, name)
        if not value.equal(original) and not (value.isnan() & original.isnan()).any():
            raise CheckFailure(
                f"{implementation.name} modified input {name} in place, but the schema does not declare it "
                f"mutable. Declare it as Tensor(a!) {name} or stop writing to it."
            )
    if unjudged:
        raise CheckSkipped(f"{nothing_judged(loaded)} (its read-only inputs came back untouched)")
    return {"correctness": compared_with(loaded)}


CHECKS = (
    Check(
        "correctness",
        "outputs and mutated arguments against the float64 reference, every dtype, shape, layout and value",
        all_cases,
        correctness,
        one_example=OneExample(),
    ),
)
