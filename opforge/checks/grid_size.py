"""grid_size (CUDA, on by default): one case past 2^24 elements, compared in full with the reference.

A kernel that caps its grid at 65,535 blocks (the y/z grid limit, or an old x limit) without a grid-stride loop, or
computes its block count in 16 bits, leaves every element past 65,535 x its block size unwritten: right at every
shape of the spec, wrong on a large tensor. large_index catches it past 2^31 elements, opt-in and at a cost of GBs;
this case is 2^25 + 4099 elements (covering 65,535 blocks of 256 or 512 threads, or of 256 threads with two
elements each), in the op's narrowest claimed floating dtype, so every CUDA run has it.

The case keeps to the ranks the spec lists, since a kernel may accept no other (a row op that checks
x.dim() == 2). Tensor inputs that share a shape in one of the spec's pairings (one input always does) get one shape
each: the 1-D shape when a shared shape is 1-D; else a shared shape of rank 2 or more, the one with the fewest elements
per index of its first dimension, with that dimension grown until the tensor holds the elements (the most rows for a
kernel with a block per row). Any other op names its shapes in the spec (`grid_size: {shapes: {x: [70000, 256],
weight: [256]}}`: rows past 65,535 for a kernel with a block per row), else the check skips, saying what to write.
The output is the op's own allocation:
before the call a NaN-filled block of its size goes back to the allocator, so an element the kernel never writes
shows as NaN, not as a stale right value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case, grown_shapes
from opforge.checks.base import Check, CheckContext, Outcomes, SpecBeforeSections, SpecSection
from opforge.checks.op_and_reference import (
    against_reference,
    call_reference,
    compare_with_reference,
    inputs_for,
    mutated_values,
    output_baseline,
    outputs_of,
)
from opforge.core.outcomes import CheckFailure, CheckSkipped
from opforge.spec.model import OpSpec, TensorInput
from opforge.spec.reader import Reader, read_shape

if TYPE_CHECKING:
    import torch

# 2^25 + 4099: past 65,535 blocks x 512 threads (33,553,920), and no multiple of a vector width. A float16 input is
# 64 MiB on the GPU and its float64 reference copy 256 MiB on the host.
ELEMENTS = 2**25 + 4099
# The dtypes tried, narrowest first: the case is about indexing, not precision, and fewer bytes cost less. Floating
# only: the unwritten elements are found by the NaN they keep.
NARROWEST_FIRST = ("float16", "bfloat16", "float32", "float64")


# A grid capped at 65,535 blocks of 256 threads covers 2^24 - 256 elements: a grid_size shape must exceed 2^24.
GRID_SIZE_ELEMENTS_MIN = 2**24


@dataclass(frozen=True)
class GridSize:
    """The spec's `grid_size:` section: the shapes of the check's case, past 2^24 elements, for an op whose tensor
    inputs share no shape in the spec's pairings, or whose kernel's grid follows another dimension than grid_shapes
    grows."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]


def read_grid_size(r: Reader, spec: SpecBeforeSections) -> GridSize:
    node = r.child("grid_size")
    g = Reader(r.path, node, "grid_size", ("shapes",), required=("shapes",))
    tensors = [i.name for i in spec.inputs if isinstance(i, TensorInput)]
    s = Reader(r.path, g.child("shapes"), "grid_size.shapes", tuple(tensors), required=tuple(tensors))
    shapes = tuple((name, s.get(name, read_shape)) for name in tensors)
    largest = max(math.prod(shape) for _, shape in shapes)
    if largest <= GRID_SIZE_ELEMENTS_MIN:
        raise s.fail(
            g.child("shapes"),
            "grid_size.shapes",
            f"a tensor of more than 2^24 = {GRID_SIZE_ELEMENTS_MIN} elements (a grid capped at 65,535 blocks of 256 "
            "threads covers fewer)",
            f"{largest} at most",
            "Give one input a shape past 2^24 elements, e.g. [70000, 256] for an op with one block per row.",
        )
    return GridSize(shapes=shapes)


def grid_shapes(spec: OpSpec) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The spec's grid_size shapes, else one shape of the spec's own ranks holding ELEMENTS for every tensor input,
    when they share a shape in one of its pairings (grown_shapes), else None."""
    given: GridSize | None = spec.section("grid_size")
    if given is not None:
        return given.shapes
    return grown_shapes(spec, ELEMENTS)


def missing_shapes_message(spec: OpSpec) -> str:
    """The skip of an op whose listed shapes give no grid_size case: what to write in the spec, with an example from
    its own first non-empty pairing (its largest tensor's first dimension grown past 2^24 elements)."""
    tensors = spec.tensor_inputs()
    index = spec.representative_shape_index()
    example = {t.name: list(shape) for t in tensors if (shape := t.shapes[index]) is not None}
    largest = max(example, key=lambda name: math.prod(example[name]), default=None)
    if largest is not None and example[largest]:
        rest = math.prod(example[largest][1:])
        example[largest][0] = math.ceil(ELEMENTS / rest) if rest else ELEMENTS
    written = ", ".join(f"{name}: {shape}" for name, shape in example.items())
    return (
        "grid_size: expected tensor inputs that share a shape of rank 1 or more in one of the spec's pairings, got "
        f"none ({', '.join(t.name for t in tensors) or 'no tensor inputs'}), so no case past 2^24 elements in the "
        f"op's own ranks. Give its shapes in the spec, e.g. `grid_size: {{shapes: {{{written}}}}}`, growing the "
        "dimensions the kernel's grid follows (rows past 65,535 for a kernel with a block per row)."
    )


def grid_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One CUDA case, first argument values, in the narrowest claimed floating dtype."""
    base = next((c for c in cases if c.values_index == 0 and c.layout == "contiguous"), None)
    dtype = next((d for d in NARROWEST_FIRST if d in loaded.spec.dtypes_on("cuda")), None)
    if base is None or dtype is None:
        return []
    shapes = grid_shapes(loaded.spec) or ()
    return [replace(base, dtype=dtype, shapes=shapes, shape_index=-1, label="grid")]


def grid_size(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    import torch

    loaded = ctx.loaded
    if not case.shapes:
        raise CheckSkipped(missing_shapes_message(loaded.spec))
    inputs = inputs_for(loaded, case, ctx.base_seed)
    largest = max(math.prod(shape) for _, shape in case.shapes)
    _poison_free_memory(largest, getattr(torch, case.dtype), case.device)
    baseline = output_baseline(loaded, inputs, case.dtype)
    got = outputs_of(loaded, implementation, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    try:
        compare_with_reference(loaded, case.dtype, case.device, compared, baseline, label=f" ({largest} elements)")
    except CheckFailure as failure:
        raise CheckFailure(
            f"{failure.message} Wrong only on a tensor this large: a grid capped at 65,535 blocks (or a block "
            "count computed in 16 or 32 bits) leaves the elements past it unwritten. Size the grid from the element "
            "count in int64, or loop over the elements with a grid-stride loop.",
            failure.mismatch,
        ) from None
    return {"grid_size": None}


def _poison_free_memory(elements: int, dtype: torch.dtype, device: str) -> None:
    """Hand the allocator a NaN-filled block of the output's likely size, so that what the op's output does not
    write reads NaN: a block that last held a right result (another implementation's, same inputs) would hide it."""
    import torch

    poison = torch.full((elements,), float("nan"), dtype=dtype, device=device)
    del poison


CHECKS = (
    Check(
        "grid_size",
        "a tensor past 2^24 elements: a grid capped at 65,535 blocks leaves the rest unwritten",
        grid_cases,
        grid_size,
        devices=("cuda",),
        section=SpecSection("grid_size", read_grid_size),
    ),
)
