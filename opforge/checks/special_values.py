"""special_values: NaN, +-inf, -0.0, the dtype's largest value and subnormals go through the op as through the
reference."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
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
from opforge.loading import LoadedOp, Target
from opforge.spec.model import FLOATING_DTYPES


def special_values(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """NaN, +-inf, -0.0, the dtype's largest value and subnormals written into every floating input (at the same
    flat positions, so paired inputs meet special values of each other) must come out as the reference's do,
    rounded to the dtype: a kernel that clamps, flushes or swallows NaN fails."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    for name in inputs.tensor_names:
        value, ref = argument(inputs, loaded, name), argument(inputs, loaded, name, reference=True)
        if value.is_floating_point():
            specials = _special_values(value.dtype)[: value.numel()]
            value.view(-1)[: len(specials)] = specials.to(value.dtype)
            ref.view(-1)[: len(specials)] = specials.to(value.dtype).to(ref.dtype)
    got = outputs_of(loaded, target, inputs)
    tol = tolerance_for(loaded.spec, case.dtype)
    for name, g, e in against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs)):
        dtype = compared_dtype(case.dtype, name, g, e)
        # What the dtype can hold: 1.1 * max is inf in it.
        check_result(f"{name} (special values)", g, e.to(dtype).to(e.dtype), tol, dtype, case.device)
    return {"special_values": None}


def _special_values(dtype):
    import torch

    info = torch.finfo(dtype)
    subnormal = info.smallest_normal / 4
    return torch.tensor(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            -0.0,
            0.0,
            subnormal,
            -subnormal,
            info.max,
            -info.max,
            info.smallest_normal,
        ],
        dtype=torch.float64,
    )


def floating_nonempty_first_values(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Special values need room: at least 1-D, no zero-size dimension; a floating dtype; one layout."""

    def has_elements(shape: tuple[int, ...]) -> bool:
        return len(shape) > 0 and all(shape)

    return [
        c
        for c in first_values(loaded, target, cases)
        if c.dtype in FLOATING_DTYPES and c.layout == "contiguous" and all(has_elements(s) for _, s in c.shapes)
    ]


CHECKS = (
    Check(
        "special_values",
        "NaN, infinities, signed zeros, the largest value and subnormals come out as the reference's",
        floating_nonempty_first_values,
        special_values,
    ),
)
