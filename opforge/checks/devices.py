"""devices (CUDA): the CUDA result against the CPU result of the same implementation on the same input values."""

from __future__ import annotations

from opforge.building.op import Implementation
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, OneExample, Outcomes, all_cases
from opforge.checks.op_and_reference import (
    RunOutputs,
    agreement,
    call_reference,
    inputs_for,
    mutated_values,
    on_device,
    output_baseline,
    outputs_of,
)
from opforge.spec.model import OpSpec


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
        RunOutputs("cuda", "cuda", got, mutated_values(loaded, inputs)),
        RunOutputs("cpu", "cpu", want, mutated_values(loaded, on_cpu)),
        lambda: call_reference(loaded, inputs),
        baseline,
    )
    return {"devices": None}


def _no_cpu(spec: OpSpec, device: str) -> str | None:
    """Fuzz compares an example's CUDA result with the CPU result only for a spec that runs on both."""
    return None if "cpu" in spec.devices else "the spec does not run on cpu"


CHECKS = (
    Check(
        "devices",
        "the CUDA kernel computes what the CPU kernel computes on the same inputs",
        all_cases,
        devices_agree,
        devices=("cuda",),
        one_example=OneExample(unless=_no_cpu),
    ),
)
