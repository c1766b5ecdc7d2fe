"""special_values: NaN, +-inf, -0.0, the dtype's largest value and subnormals go through the op as through the
reference."""

from __future__ import annotations

from typing import Any

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
from opforge.checks.calls import (
    against_reference,
    argument,
    call_reference,
    compare_with_reference,
    inputs_for,
    mutated_values,
    output_baseline,
    outputs_of,
)
from opforge.loading import LoadedOp, Target
from opforge.spec.model import FLOATING_DTYPES


def special_values(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """NaN, +-inf, -0.0, the dtype's largest value and subnormals (or the spec's `special_values:` choice of them)
    written into every floating input that takes them must come out as the reference's do, rounded to the dtype: a
    kernel that clamps, flushes or swallows NaN fails. They go at the same flat positions of each input (so paired
    inputs meet special values of each other): the first ones, and the last ones too, in reverse (NaN last), where a
    vectorized kernel's scalar tail and a row op's last row are. An input marked `special_values: false`, or made by
    a generator, keeps its values; one with a list of names takes those."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    takes = {
        t.name: t.special_value_names(loaded.spec.special_values)
        for t in loaded.spec.tensor_inputs()
        if t.takes_special_values
    }
    for name in inputs.tensor_names:
        value, ref = argument(inputs, loaded, name), argument(inputs, loaded, name, reference=True)
        if name in takes and value.is_floating_point():
            specials = special_value_tensor(value.dtype, takes[name]).to(value.dtype)
            for where, values in placements(value.numel(), specials):
                value.view(-1)[where] = values
                ref.view(-1)[where] = values.to(ref.dtype)
    baseline = output_baseline(loaded, inputs, case.dtype)
    got = outputs_of(loaded, target, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    compare_with_reference(
        loaded, case.dtype, case.device, compared, baseline, label=" (special values)", round_expected=True
    )
    return {"special_values": None}


def placements(numel: int, specials: Any) -> list[tuple[slice, Any]]:
    """(positions, values) of the special values in `numel` elements: the first positions in order, and, when both
    fit apart, the last ones reversed (NaN last)."""
    count = len(specials)
    head = (slice(0, min(count, numel)), specials[:numel])
    return [head, (slice(numel - count, numel), specials.flip(0))] if numel >= 2 * count else [head]


def special_value_tensor(dtype, names: tuple[str, ...]):
    """The special values of `dtype` that `names` pick (opforge.spec.model.SPECIAL_VALUES), in that order, as
    float64."""
    import torch

    info = torch.finfo(dtype)
    subnormal = info.smallest_normal / 4
    value = {
        "nan": float("nan"),
        "inf": float("inf"),
        "-inf": -float("inf"),
        "negative_zero": -0.0,
        "zero": 0.0,
        "subnormal": subnormal,
        "negative_subnormal": -subnormal,
        "max": info.max,
        "-max": -info.max,
        "smallest_normal": info.smallest_normal,
    }
    return torch.tensor([value[name] for name in names], dtype=torch.float64)


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
