"""devices (CUDA): the CUDA result against the CPU result of the same implementation on the same input values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, all_cases
from opforge.checks.calls import (
    against_reference,
    call_reference,
    compare_with_reference,
    inputs_for,
    mutated_values,
    on_device,
    output_baseline,
    outputs_of,
    paired,
)
from opforge.compare import Baseline, check_result, tolerance_for
from opforge.loading import Implementation, LoadedOp
from opforge.outcomes import CheckFailure


def devices_agree(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """The CUDA result against the CPU result of the same implementation on the same input values.

    Catches a CUDA kernel that computes something else than the CPU one (extension-cpp's add kernel multiplied
    for a year while opcheck passed). Two correct kernels may still differ by more than the dtype's tolerance where
    they round differently (a reduction summed as a tree on the GPU and in order on the CPU): the results may then
    differ by as much as each is allowed to differ from the float64 reference, and no more. Either one failing
    that comparison is the failure.
    """
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    on_cpu = on_device(inputs, "cpu")
    baseline = output_baseline(loaded, inputs, case.dtype)
    got, want = outputs_of(loaded, implementation, inputs), outputs_of(loaded, implementation, on_cpu)
    agreement(
        loaded,
        case.dtype,
        Result("cuda", got, mutated_values(loaded, inputs)),
        Result("cpu", want, mutated_values(loaded, on_cpu)),
        lambda: call_reference(loaded, inputs),
        baseline,
    )
    return {"devices": None}


@dataclass(frozen=True)
class Result:
    """What one device's run of the op left: its outputs and the values of the arguments it mutates."""

    device: str
    outputs: tuple[Any, ...]
    mutated: dict[str, Any]


def agreement(
    loaded: LoadedOp,
    case_dtype: str,
    first: Result,
    second: Result,
    reference: Callable[[], tuple[Any, ...]],
    baseline: Baseline,
) -> None:
    """Raises CheckFailure unless the two results agree within the dtype's tolerance, or each is as close to the
    float64 reference as the op must be (then they may differ by up to both their errors)."""
    tol = tolerance_for(loaded.spec, case_dtype)
    label = f"{first.device} vs {second.device}"
    disagreement = None
    for name, a, b in paired(loaded, first.outputs, first.mutated, second.outputs, second.mutated):
        try:
            check_result(f"{name} ({label})", a, b, tol, b.dtype, first.device, against=f"the {second.device} result")
        except CheckFailure as failure:
            disagreement = disagreement or failure
    if disagreement is None:
        return
    expected = reference()
    for result in (first, second):
        compared = against_reference(loaded, result.outputs, result.mutated, expected)
        try:
            compare_with_reference(loaded, case_dtype, result.device, compared, baseline, label=f" ({result.device})")
        except CheckFailure as failure:
            raise CheckFailure(
                f"{disagreement.message} Beyond that, the {result.device} result is not as close to the float64 "
                f"reference as it must be: {failure.message}",
                failure.mismatch or disagreement.mismatch,
            ) from None


CHECKS = (
    Check(
        "devices",
        "the CUDA kernel computes what the CPU kernel computes on the same inputs",
        all_cases,
        devices_agree,
        devices=("cuda",),
    ),
)
