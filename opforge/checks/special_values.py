"""special_values: NaN, +-inf, -0.0, the dtype's largest value and subnormals go through the op as through the
reference."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
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
from opforge.core.outcomes import PassNote
from opforge.spec.model import FLOATING_DTYPES

if TYPE_CHECKING:
    import torch


def special_values(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """NaN, +-inf, -0.0, the dtype's largest value and subnormals (or the spec's `special_values:` choice of them)
    written into every floating input that takes them must come out as the reference's do, rounded to the dtype: a
    kernel that clamps, flushes or swallows NaN fails. They go at the same flat positions of each input (so paired
    inputs meet special values of each other): the first ones, and the last ones in reverse (NaN last), where a
    vectorized kernel's scalar tail and a row op's last row are; and, but for the finite extremes, one in every row
    (last dimension), where a row reduction meets it whatever row it is. An input marked `special_values: false`,
    or made by a generator, keeps its values; one with a list of names takes those. See EXTREMES for `max`."""
    judged = [
        _one_pass(ctx, implementation, case, names) for names in special_value_passes(ctx.loaded.spec.special_values)
    ]
    if not any(judged):
        return {
            "special_values": PassNote(
                f"no crash or hang, and no value compared: {nothing_judged(ctx.loaded)}; its other dtypes are "
                "compared with this case's values"
            )
        }
    return {"special_values": compared_with(ctx.loaded)}


# The finite extremes. In a reduction, whether max and -max cancel before they absorb the other terms, or whether
# a partial sum of several extremes times weights overflows on the way to a finite total, depends on the summation
# order alone: a correct row sum in plain order returns 0.0 where the float64 reference, adding pairwise, returns
# -0.17, and a correct float32 GEMM overflows to -inf where the reference gives -3.05e38. So an extreme goes at the
# head and the tail only, never in every row, and `-max` gets a call of its own, apart from `max`: a reduction then
# meets at most two extremes of one sign, which overflow (or not) in any order alike.
EXTREMES = ("max", "-max")


def special_value_passes(chosen: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The spec's special values split into calls, `max` and `-max` never in the same one."""
    if not set(EXTREMES) <= set(chosen):
        return [chosen]
    return [tuple(n for n in chosen if n != "-max"), ("-max",)]


def _one_pass(ctx: CheckContext, implementation: Implementation, case: Case, names: tuple[str, ...]) -> bool:
    """One call with the special values `names` against the reference's; False when the comparison judged nothing
    (a spec without a reference, on the case that is the op's own reference call: only a crash or a hang shows)."""
    import torch

    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    takes = {
        t.name: tuple(n for n in t.special_value_names(loaded.spec.special_values) if n in names)
        for t in loaded.spec.tensor_inputs()
        if t.takes_special_values
    }
    for name in inputs.tensor_names:
        value, ref = argument(inputs, loaded, name), argument(inputs, loaded, name, reference=True)
        if takes.get(name) and value.is_floating_point():
            for where, values in placements(tuple(value.shape), takes[name], value.dtype):
                rounded = values.to(value.dtype)
                # A CUDA input takes its rows' positions and values on its own device (index_put_ mixes none).
                on_device = where.to(value.device) if isinstance(where, torch.Tensor) else where
                value.view(-1)[on_device] = rounded.to(value.device)
                ref.view(-1)[where] = rounded.to(ref.dtype)
    baseline = output_baseline(loaded, inputs, case.dtype)
    got = outputs_of(loaded, implementation, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    if judged_nothing(loaded, implementation, inputs):
        return False
    compare_with_reference(
        loaded, case.dtype, case.device, compared, baseline, label=" (special values)", round_expected=True
    )
    return True


# The column of row r's special value steps by this many elements per row (a prime, so rows of any width get it at
# varied positions: a vector body's lanes and a scalar tail alike).
ROW_STEP = 7


def placements(
    shape: tuple[int, ...], names: tuple[str, ...], dtype: torch.dtype
) -> list[tuple[slice | torch.Tensor, torch.Tensor]]:
    """(flat positions, float64 values) of the special values `names` in a tensor of `shape`: the first positions
    in order, when both fit apart the last ones reversed (NaN last), and in a tensor of several rows one value in
    each row, the extremes left out (row r takes value r - 1 mod count, at column r * ROW_STEP mod width)."""
    import torch

    specials = special_value_tensor(dtype, names)
    numel = math.prod(shape)
    count = len(specials)
    placed: list[tuple[slice | torch.Tensor, torch.Tensor]] = [(slice(0, min(count, numel)), specials[:numel])]
    if numel >= 2 * count:
        placed.append((slice(numel - count, numel), specials.flip(0)))
    in_rows = special_value_tensor(dtype, tuple(n for n in names if n not in EXTREMES))
    width = shape[-1] if shape else 1
    rows = numel // width if width else 0
    if rows > 1 and len(in_rows):
        row = torch.arange(rows)
        # Row 0 holds the head (NaN beside both infinities: NaN whatever the op does with NaN), so NaN alone
        # starts at row 1.
        placed.append((row * width + (row * ROW_STEP) % width, in_rows[(row - 1) % len(in_rows)]))
    return placed


def special_value_tensor(dtype: torch.dtype, names: tuple[str, ...]) -> torch.Tensor:
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


def floating_nonempty_first_values(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Special values need room: at least 1-D, no zero-size dimension; a floating dtype; one layout."""

    def has_elements(shape: tuple[int, ...]) -> bool:
        return len(shape) > 0 and all(shape)

    return [
        c
        for c in first_values(loaded, implementation, cases)
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
