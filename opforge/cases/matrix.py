"""The test matrix of a spec: its cases, their ids and seeds, and the layouts and fills a case may name (the inputs
of each case are opforge.cases.arguments').

A case is one (dtype, device, layout, shape pairing, argument values) point. Its seed is derived from the run's
base seed and the case id alone, so a case rerun on its own (`-k <id>`) sees exactly the inputs it saw in the full
run.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass, replace
from typing import Any

from opforge.spec.model import OpSpec, Regression, ScalarInput, layout_kind

# The spec's `noncontiguous` layout expands into both kinds of non-contiguous view, since kernels get them wrong in
# different ways: a transpose is dense with permuted strides, a strided slice has gaps.
# `contiguous` also brings `offset`: a contiguous tensor whose data starts one element into its storage (base[1:],
# what everyday slicing hands a caller), so its pointer is not 16-byte aligned: a kernel's 128-bit vector loads
# without an alignment check fault ("misaligned address") or read wrong data on it. Only for the first argument
# values (alignment does not depend on them), and not for the checks where it adds nothing but cost (see each
# check's selection).
LAYOUT_VARIANTS = {
    "contiguous": ("contiguous", "offset"),
    "noncontiguous": ("transposed", "strided"),
    "channels_last": ("channels_last",),
}
# Beyond the matrix's layouts, a case (one `opforge fuzz` found, a spec's `regressions:`) may name a parameter:
# `offset:K` (data K elements into its storage), `transposed:I,J` (dims I and J swapped in memory), and `expanded`
# (dim 0 of stride 0, for inputs the op only reads). A kind belongs to the family its plain name belongs to.
LAYOUT_FAMILY = {
    "contiguous": "contiguous",
    "offset": "contiguous",
    "transposed": "noncontiguous",
    "strided": "noncontiguous",
    "expanded": "noncontiguous",
    "channels_last": "channels_last",
}
# The values a case's `fill` writes in place of sampled ones (see fill_values).
FILL_RULES = ("equal", "integers", "ends", "sorted", "reversed", "huge", "tiny")
SPECIAL_FILLS = ("one", "row", "all")
FILL_SPECIALS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "0": 0.0, "-0": -0.0}
# The key of a samples function's dict that names the sample (no argument: a leading underscore), for its case id.
SAMPLE_NAME_KEY = "_name"


@dataclass(frozen=True)
class Case:
    dtype: str
    device: str
    layout: str  # contiguous, transposed, strided, channels_last
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    values: tuple[tuple[str, Any], ...]
    values_index: int
    shape_index: int
    # Names a case that is no point of the matrix (an invalid call of error_inputs): it leads the id.
    label: str = ""
    # Its inputs come from sample number `shape_index` of the spec's `samples:` function.
    sample: bool = False
    # That sample's short name, if it gives one: the id shows it in place of the sample's index, its shapes and the
    # values it gives itself (`sample_arguments`, the names of both).
    sample_name: str = ""
    sample_arguments: tuple[str, ...] = ()
    # How the sampled values are rewritten (fill_values): "" keeps them.
    fill: str = ""
    # The seed of its values, when it is not derived from the run's seed and the id (a case fuzz found, kept).
    fixed_seed: int | None = None

    @property
    def id(self) -> str:
        at_sample = self.sample and self.shape_index >= 0
        hidden = set(self.sample_arguments) if at_sample and self.sample_name else set()
        shapes = "-".join(f"{name}={_shape_label(shape)}" for name, shape in self.shapes if name not in hidden)
        values = "-".join(f"{name}={value_label(value)}" for name, value in self.values if name not in hidden)
        sample = (self.sample_name or f"sample{self.shape_index}") if at_sample else ""
        fill = f"fill={self.fill}" if self.fill else ""
        parts = (self.label, self.dtype, self.device, self.layout, sample, shapes, values, fill)
        return "-".join(p for p in parts if p)

    def seed(self, base_seed: int) -> int:
        if self.fixed_seed is not None:
            return self.fixed_seed
        return zlib.crc32(f"{base_seed}:{self.id}".encode())


def _shape_label(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "0d"


def value_label(value: Any) -> str:
    """A non-tensor argument as a case id shows it: a tensor (in a sample's `Tensor[]` argument) by its shape, as a
    tensor input's shape shows, and a list by its items joined with commas (`offsets=4,3`, `max_lengths=2,3`,
    `empty` for none): no spaces, no brackets, so `-k` takes the id unquoted and an xfail's `case:` glob can name it
    (a bracket there is a character class)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return _shape_label(tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return ",".join(value_label(item) for item in value) if value else "empty"
    return str(value)


def offset_of(layout: str) -> int:
    """How many elements into its storage an `offset[:K]` layout starts (0 for the other kinds)."""
    if layout_kind(layout) != "offset":
        return 0
    return int(layout.split(":", 1)[1]) if ":" in layout else 1


def transposed_dims(layout: str, rank: int) -> tuple[int, int]:
    """The two dims a `transposed[:I,J]` layout swaps in memory (the last two by default)."""
    if ":" not in layout:
        return rank - 2, rank - 1
    first, second = (int(d) for d in layout.split(":", 1)[1].split(","))
    return first, second


def layout_error(layout: str) -> str | None:
    """Why `layout` is not one a case can name, or None."""
    kind, _, parameter = layout.partition(":")
    if kind not in LAYOUT_FAMILY:
        return f"a layout kind among {', '.join(LAYOUT_FAMILY)}"
    if not parameter:
        return None if ":" not in layout else "a parameter after the colon"
    if kind == "offset" and parameter.isdigit() and int(parameter) > 0:
        return None
    if kind == "transposed" and all(d.isdigit() for d in parameter.split(",")) and len(parameter.split(",")) == 2:
        return None
    return "offset:K (K > 0 elements) or transposed:I,J (two dims); the other kinds take no parameter"


def writes_special(fill: str) -> bool:
    """Whether `fill` writes a special value into an input (NAME=one|row|all:S), rather than a rule over its
    sampled values."""
    return fill.rpartition("=")[2].partition(":")[0] in SPECIAL_FILLS


def fill_error(fill: str, tensor_names: tuple[str, ...]) -> str | None:
    """Why `fill` is not a rule fill_values knows, or None."""
    name, _, rule = fill.rpartition("=")
    kind, _, argument = rule.partition(":")
    if not name:
        return None if kind in FILL_RULES else f"one of {', '.join(FILL_RULES)}, or NAME=one|row|all:SPECIAL"
    if name not in tensor_names:
        return f"a tensor input before `=` ({', '.join(tensor_names)})"
    special, _, where = argument.partition("@")
    if kind not in SPECIAL_FILLS or special not in FILL_SPECIALS:
        return f"NAME=one:S@P, NAME=row:S@R or NAME=all:S with S one of {', '.join(FILL_SPECIALS)}"
    if (kind == "all") != (where == "") or (where and not where.isdigit()):
        return "a position @P (one), a row @R (row), none for all"
    return None


def layout_applies(layout: str, shape: tuple[int, ...]) -> bool:
    kind = layout_kind(layout)
    if kind == "contiguous":
        return True
    if kind == "offset":
        return math.prod(shape) > 0
    if kind == "channels_last":
        return len(shape) == 4
    if kind == "transposed":
        if len(shape) < 2:
            return False
        first, second = transposed_dims(layout, len(shape))
        return max(first, second) < len(shape) and shape[first] > 1 and shape[second] > 1
    if kind == "expanded":
        return len(shape) >= 1 and shape[0] > 1
    return len(shape) >= 1 and all(shape)  # strided: a slice with step 2 of a non-empty last dim


def input_layout(spec: OpSpec, name: str, layout: str, shape: tuple[int, ...]) -> str:
    """The layout input `name` takes in a case of `layout`: the case's, when the input's layouts (its own, else the
    spec's) include it and its shape admits it; else contiguous."""
    from opforge.core.schema import mutated_names

    entry = next(t for t in spec.tensor_inputs() if t.name == name)
    families = entry.layouts if entry.layouts is not None else spec.layouts
    kind = layout_kind(layout)
    if kind == "expanded" and name in mutated_names(spec.schema):
        return "contiguous"  # one element of memory cannot hold the many values an op writes there
    return layout if LAYOUT_FAMILY.get(kind) in families and layout_applies(layout, shape) else "contiguous"


def case_applies(spec: OpSpec, layout: str, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> bool:
    """A case of a layout other than contiguous exists where at least one input takes that layout (the others stay
    contiguous: a 1-D scale beside a channels_last image, an `out` that must be contiguous)."""
    return layout == "contiguous" or any(input_layout(spec, name, layout, shape) == layout for name, shape in shapes)


def build_matrix(spec: OpSpec, dtypes: tuple[str, ...], devices: tuple[str, ...]) -> list[Case]:
    """Every applicable case, each device in the dtypes of `dtypes` it claims. Tensor shapes are paired by position
    (a sample spec: each sample is one pairing, with its own non-tensor values); `values:` lists are crossed."""
    scalars = [i for i in spec.inputs if isinstance(i, ScalarInput)]
    value_combos = list(itertools.product(*(s.values for s in scalars))) or [()]
    cases = []
    for device, spec_layout in itertools.product(devices, spec.layouts):
        claimed = tuple(d for d in dtypes if d in spec.dtypes_on(device))
        for dtype, layout in itertools.product(claimed, LAYOUT_VARIANTS[spec_layout]):
            for shape_index in range(spec.shape_count):
                point = at_point(spec, Case(dtype, device, layout, (), (), 0, -1), shape_index)
                if not case_applies(spec, layout, point.shapes):
                    continue
                combos = value_combos[:1] if layout == "offset" else value_combos
                for values_index, combo in enumerate(combos):
                    crossed = tuple((s.name, v) for s, v in zip(scalars, combo))
                    cases.append(replace(point, values=point.values + crossed, values_index=values_index))
    return cases + regression_cases(spec, dtypes, devices)


def regression_cases(spec: OpSpec, dtypes: tuple[str, ...], devices: tuple[str, ...]) -> list[Case]:
    """The spec's `regressions:` on the selected devices and dtypes, each with the layout, values and seed it was
    found with."""
    return [
        kept_case(spec, kept, f"regression{index}")
        for index, kept in enumerate(spec.regressions)
        if kept.device in devices and kept.dtype in dtypes and kept.dtype in spec.dtypes_on(kept.device)
    ]


def kept_case(spec: OpSpec, kept: Regression, label: str) -> Case:
    """The case a regression entry (or a fuzz example, the same thing) names. A sample spec's takes its sample's
    shapes and non-tensor values; a non-tensor argument it leaves out takes its first `values:` entry."""
    given = dict(kept.values)
    scalars = tuple((s.name, given.get(s.name, s.values[0])) for s in spec.inputs if isinstance(s, ScalarInput))
    case = Case(kept.dtype, kept.device, kept.layout, kept.shapes, scalars, 0, -1, label=label)
    if kept.sample is not None:
        case = at_point(spec, replace(case, values=()), kept.sample)
        own = dict(case.values)
        case = replace(case, values=case.values + tuple((n, v) for n, v in scalars if n not in own))
    return replace(case, fill=kept.fill, fixed_seed=kept.seed)


def crossed_values(spec: OpSpec, case: Case) -> tuple[tuple[str, Any], ...]:
    """The case's values that come from `values:` lists, without a sample's own."""
    crossed = {i.name for i in spec.inputs if isinstance(i, ScalarInput)}
    return tuple((name, value) for name, value in case.values if name in crossed)


def at_point(spec: OpSpec, case: Case, shape_index: int) -> Case:
    """`case` moved to the spec's shape pairing `shape_index`: its shapes and, in a sample spec, that sample's own
    non-tensor values in place of the case's (the crossed `values:` stay). An optional tensor the sample leaves None
    has no shape: its None is one of the sample's values."""
    given = ((t.name, t.shapes[shape_index]) for t in spec.tensor_inputs())
    shapes = tuple((name, shape) for name, shape in given if shape is not None)
    if spec.samples is None:
        return replace(case, shapes=shapes, shape_index=shape_index)
    sampled = spec.samples.values[shape_index]
    return replace(
        case,
        shapes=shapes,
        shape_index=shape_index,
        values=sampled + crossed_values(spec, case),
        sample=True,
        sample_name=spec.samples.names[shape_index] if spec.samples.names else "",
        sample_arguments=tuple(name for name, _ in shapes + sampled),
    )


def grown_shapes(spec: OpSpec, elements: int) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """One shape of the spec's own ranks holding at least `elements` for every tensor input, when the inputs share a
    shape in one of its pairings (grown_shape), else None: a size given as an element count (grid_size's case past
    the capped grid, `opforge bench --sizes`) must not hand a row op written for 2-D inputs a 1-D one."""
    tensors = spec.tensor_inputs()
    if not tensors:
        return None
    pairings = [{t.shapes[i] for t in tensors} for i in range(spec.shape_count)]
    shared = [shape for shapes in pairings if len(shapes) == 1 for shape in shapes if shape is not None]
    shape = grown_shape(shared, elements)
    return tuple((t.name, shape) for t in tensors) if shape is not None else None


def grown_shape(shapes: list[tuple[int, ...]], elements: int) -> tuple[int, ...] | None:
    """`elements` in the rank of one of `shapes`: 1-D when one is 1-D; else the one of rank 2 or more with the fewest
    elements per index of its first dimension, that dimension grown to hold `elements`; None when neither is listed
    (0-d shapes, or shapes empty past their first dimension)."""
    if any(len(shape) == 1 for shape in shapes):
        return (elements,)
    growable = [shape for shape in shapes if len(shape) >= 2 and math.prod(shape[1:]) > 0]
    if not growable:
        return None
    rest = min(growable, key=lambda shape: math.prod(shape[1:]))[1:]
    return (math.ceil(elements / math.prod(rest)), *rest)
