"""devices (CUDA): the CUDA result against the CPU result of the same implementation on the same input values."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, all_cases
from opforge.checks.calls import (
    inputs_for,
    mutated_values,
    on_device,
    outputs_of,
    paired,
)
from opforge.compare import check_result, tolerance_for
from opforge.loading import Target


def devices_agree(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """The CUDA result against the CPU result of the same implementation on the same input values.

    Catches a CUDA kernel that computes something else than the CPU one (extension-cpp's add kernel multiplied
    for a year while opcheck passed), independently of how close either is to the reference.
    """
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    on_cpu = on_device(inputs, "cpu")
    got, want = outputs_of(loaded, target, inputs), outputs_of(loaded, target, on_cpu)
    tol = tolerance_for(loaded.spec, case.dtype)
    compared = paired(loaded, got, mutated_values(loaded, inputs), want, mutated_values(loaded, on_cpu))
    for name, g, w in compared:
        check_result(f"{name} (cuda vs cpu)", g, w, tol, w.dtype, case.device, against="the CPU result")
    return {"devices": None}


CHECKS = (
    Check(
        "devices",
        "the CUDA kernel computes what the CPU kernel computes on the same inputs",
        all_cases,
        devices_agree,
        devices=("cuda",),
    ),
)
