"""Planning a spec's benchmarks: which points (size or shapes, dtype, device, mode, layout) and which contenders
(the implementations, the eager reference and torch.compile of it) `opforge bench` and `opforge profile` run."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opforge.bench.model import BASELINE, IMPLEMENTATION, point_key
from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case, case_applies, grown_shapes
from opforge.core.environment import device_unavailable
from opforge.core.errors import UsageError
from opforge.core.shard import Shard, owns
from opforge.spec.bench import POWER_OF_TWO
from opforge.spec.model import BENCH_BASELINES, BENCH_LAYOUTS, FLOATING_DTYPES, BenchSpec, OpSpec, ScalarInput

EAGER, COMPILE = BENCH_BASELINES


@dataclass(frozen=True)
class BenchFilters:
    """Command-line selections; empty means the spec's `bench:` defaults."""

    devices: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    contenders: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    layouts: tuple[str, ...] = ()
    seed: int = 0
    shard: Shard | None = None  # --shard K/N: only the points whose key hashes to this shard
    # --all: a choice above that an op does not claim narrows it to what it does claim, and an op left with none is
    # left out with the reason (`opforge bench --all --device cuda` beside a CPU-only op); a named op that does not
    # claim a choice is a usage error.
    every_spec: bool = False


@dataclass(frozen=True)
class BenchPoint:
    """One (device, dtype, mode, size) point every contender is timed on."""

    mode: str
    case: Case
    label: str
    elements: int

    @property
    def device(self) -> str:
        return self.case.device

    @property
    def dtype(self) -> str:
        return self.case.dtype


@dataclass(frozen=True)
class Contender:
    name: str
    role: str
    fn: Callable[..., Any] | None  # None for the compile baseline: compiled per point
    implementation: Implementation | None = None


def bench_section(spec: OpSpec, filters: BenchFilters) -> BenchSpec:
    if spec.bench is None and not filters.sizes:
        raise UsageError(
            f"opforge bench {spec.name}",
            f"a `bench:` section in {spec.path}",
            "none",
            "Add one (see docs/specs.md, `bench`) or pass --sizes.",
        )
    return spec.bench or BenchSpec()


def selected(spec: OpSpec, filters: BenchFilters) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(devices, dtypes, modes): the command line's choice, checked against what the op claims, else the bench
    section's, else the spec's."""
    bench = bench_section(spec, filters)
    devices = _choose(filters.devices, bench.devices or spec.devices, spec.devices, "--device", spec, filters)
    default_dtypes = bench.dtypes or tuple(d for d in spec.dtypes if d in FLOATING_DTYPES) or spec.dtypes
    dtypes = _choose(filters.dtypes, default_dtypes, spec.dtypes, "--dtype", spec, filters)
    default_modes = bench.modes or tuple(m for m in ("fwd", "bwd") if m in spec.bench_modes)
    modes = _choose(filters.modes, default_modes, spec.bench_modes, "--mode", spec, filters)
    return devices, dtypes, modes


def unclaimed(spec: OpSpec, filters: BenchFilters) -> str:
    """Why `--all` leaves the op out: none of the asked devices, dtypes, modes or layouts is one it claims; "" when
    it has something to time, or the run names its ops (a choice one does not claim is a usage error there)."""
    if not filters.every_spec:
        return ""
    asked = (
        ("--device", filters.devices, spec.devices),
        ("--dtype", filters.dtypes, spec.dtypes),
        ("--mode", filters.modes, spec.bench_modes),
        ("--layout", filters.layouts, _claimed_layouts(spec)),
    )
    for option, given, claimed in asked:
        if given and not set(given) & set(claimed):
            return f"{option} {', '.join(given)}: its spec claims {', '.join(claimed)}"
    return ""


def _choose(
    given: tuple[str, ...],
    default: tuple[str, ...],
    claimed: tuple[str, ...],
    option: str,
    spec: OpSpec,
    filters: BenchFilters,
) -> tuple[str, ...]:
    if filters.every_spec and given:
        return tuple(value for value in given if value in claimed)
    for value in given:
        if value not in claimed:
            raise UsageError(
                option,
                f"one of {', '.join(claimed)} (what {spec.name}'s spec claims)",
                repr(value),
                f"Pick one the op supports or add it to {spec.path.name}.",
            )
    return given or default


def size_points(spec: OpSpec, filters: BenchFilters) -> list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]]:
    """(label, shape of each tensor input) per size point: a size n gives every tensor input one shape of the spec's
    own ranks holding n elements (grown_shapes: a 2-D row op gets rows of its listed width, not a 1-D tensor it
    refuses; none where the inputs share no shape, see unsized); `bench.shapes` as written. Found on fbgemm's
    FloatToFused8BitRowwiseQuantized: `--sizes 2**16` gave it a 1-D input, which it refuses ("must have >= 2
    dimension(s)"), a WRONG result for a correct op."""
    bench = bench_section(spec, filters)
    points: list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]] = [
        (f"n={_size_label(n)}", shapes)
        for n in filters.sizes or bench.sizes
        if (shapes := grown_shapes(spec, n)) is not None
    ]
    if not filters.sizes:
        points += [
            (",".join(f"{name}={'x'.join(map(str, shape)) or '0d'}" for name, shape in shapes), shapes)
            for shapes in bench.shapes
        ]
    return points


def unsized(spec: OpSpec, filters: BenchFilters) -> str:
    """Why the run's sizes (--sizes, else `bench.sizes`) give the op no point: its tensor inputs share no shape to
    grow (an op of values and offsets); "" when they do, or no size is asked for."""
    sizes = filters.sizes or bench_section(spec, filters).sizes
    if not sizes or grown_shapes(spec, sizes[0]) is not None:
        return ""
    names = ", ".join(t.name for t in spec.tensor_inputs()) or "no tensor inputs"
    return (
        f"{'--sizes' if filters.sizes else 'bench.sizes'}: expected tensor inputs that share a shape in one of "
        f"{spec.name}'s listed pairings (a size grows it to that many elements in its own rank), got {names}, "
        "which share none. Write the shapes to time in its spec's bench.shapes"
        + (" and leave out --sizes." if filters.sizes else " instead.")
    )


def parse_sizes(texts: list[str]) -> tuple[int, ...]:
    """--sizes values: comma-separated element counts, each an integer or 2**k / 2^k."""
    sizes = []
    for text in texts:
        for item in filter(None, (t.strip() for t in text.split(","))):
            match = POWER_OF_TWO.match(item)
            value = 2 ** int(match.group(1)) if match else int(item) if item.isdigit() else 0
            if value <= 0:
                raise UsageError(
                    "--sizes", "element counts > 0 such as 65536 or 2**24", repr(item), "Separate sizes with commas."
                )
            sizes.append(value)
    return tuple(sizes)


def _size_label(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


def selected_layouts(spec: OpSpec, filters: BenchFilters) -> tuple[str, ...]:
    """The memory formats to time: --layout, checked against the spec's claimed ones, else `bench.layouts`, else
    contiguous."""
    default = spec.bench.layouts if spec.bench and spec.bench.layouts else ("contiguous",)
    return _choose(filters.layouts, default, _claimed_layouts(spec), "--layout", spec, filters)


def _claimed_layouts(spec: OpSpec) -> tuple[str, ...]:
    return tuple(layout for layout in BENCH_LAYOUTS if layout == "contiguous" or layout in spec.layouts)


def plan_points(spec: OpSpec, filters: BenchFilters, devices: tuple[str, ...]) -> list[BenchPoint]:
    _, dtypes, modes = selected(spec, filters)
    layouts = selected_layouts(spec, filters)
    values = tuple((i.name, i.values[0]) for i in spec.inputs if isinstance(i, ScalarInput))
    points = []
    for device, dtype, mode, layout in itertools.product(devices, dtypes, modes, layouts):
        if dtype not in spec.dtypes_on(device):
            continue
        for index, (size, shapes) in enumerate(size_points(spec, filters)):
            # A point of another layout is named by it; contiguous points keep their names (and old baselines).
            label = size if layout == "contiguous" else f"{size},{layout}"
            if not case_applies(spec, layout, shapes) or not owns(
                filters.shard, point_key(spec.name, mode, dtype, device, label)
            ):
                continue
            case = Case(dtype, device, layout, shapes, values, values_index=0, shape_index=index)
            elements = max((math.prod(s) for _, s in shapes), default=1)
            points.append(BenchPoint(mode, case, label, elements))
    return points


def restored_each_rep(mutated: Sequence[str], mode: str) -> bool:
    """Whether each rep of `mode` must first put back the arguments the op writes: it calls the op (fwd, fwd+bwd;
    bwd runs only the backward) and the op writes some."""
    return bool(mutated) and mode != "bwd"


def replayable(
    spec: OpSpec, points: list[BenchPoint], mutated: Sequence[str], cuda_graph: bool
) -> tuple[list[BenchPoint], dict[str, str]]:
    """The points --cuda-graph can time, and why the others are left out. A graph replays many calls per sample
    with nothing between them, so the arguments an op writes cannot be restored before each call as a rep needs
    (time_cuda refuses it): its CUDA forwards are left out with the reason, its backward (which does not call the
    op) is kept, and a CPU point is timed as always."""
    if not cuda_graph:
        return points, {}
    written = [p for p in points if p.case.device == "cuda" and restored_each_rep(mutated, p.mode)]
    if not written:
        return points, {}
    modes = ", ".join(dict.fromkeys(p.mode for p in written))
    why = (
        f"--cuda-graph: its {modes} on cuda writes {', '.join(mutated)}, which a graph's replays cannot restore "
        "between calls; time it without --cuda-graph"
    )
    return [p for p in points if p not in written], {spec.name: why}


def contenders(loaded: LoadedOp, filters: BenchFilters) -> list[Contender]:
    # A spec without a reference has no baseline to time: its reference is the op itself in float64.
    baselines = (
        []
        if loaded.self_reference is not None
        else [
            Contender(EAGER, BASELINE, loaded.reference),
            Contender(COMPILE, BASELINE, None),
        ]
    )
    everyone = [Contender(t.name, IMPLEMENTATION, t.fn, t) for t in loaded.implementations] + baselines
    known = [c.name for c in everyone]
    for name in filters.contenders:
        if name not in known:
            raise UsageError(
                "--contender", f"one of {', '.join(known)}", repr(name), "Pick one of the op's contenders."
            )
    return [c for c in everyone if not filters.contenders or c.name in filters.contenders]


def runnable_devices(spec: OpSpec, filters: BenchFilters) -> tuple[tuple[str, ...], dict[str, str]]:
    """(devices to run, {device: why it is skipped})."""
    devices, _, _ = selected(spec, filters)
    reasons = {d: device_unavailable(d) for d in devices}
    return tuple(d for d in devices if reasons[d] is None), {d: r for d, r in reasons.items() if r}
