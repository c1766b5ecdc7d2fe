"""Planning and running a spec's benchmarks: cases, verification against the reference, bytes moved, timing.

Every implementation (the op itself, the spec's `implementations`) is first checked on the benchmark's own inputs
with the same checks `opforge check` runs (`correctness` for the forward, `grad_lowp` for the gradients); one
that does not match the reference at the spec's tolerance is a WRONG row and is not timed. The baselines, the
reference run eagerly in the benchmark's dtype and `torch.compile` of it, are timed as they are.
"""

from __future__ import annotations

import functools
import itertools
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opforge.bench.model import (
    BASELINE,
    ERROR,
    IMPLEMENTATION,
    OK,
    SKIP,
    WRONG,
    BenchResult,
    BenchRun,
    point_key,
)
from opforge.bench.timing import Timing, TimingOptions, graph_input_copies, l2_bytes, time_callable
from opforge.cases import Case, CaseInputs, case_applies, make_inputs
from opforge.checks.base import CheckContext
from opforge.checks.calls import argument, differentiated, output_names
from opforge.checks.catalog import CATALOG
from opforge.compare import as_tuple
from opforge.engine.rows import apply_xfail, check_verdicts
from opforge.environment import device_unavailable
from opforge.errors import SpecError, UsageError
from opforge.loading import LoadedOp, Target
from opforge.outcomes import short
from opforge.results import Status
from opforge.shard import Shard, owns, shard_text
from opforge.spec import bytes_expr as expr
from opforge.spec.bench import POWER_OF_TWO
from opforge.spec.model import BENCH_LAYOUTS, FLOATING_DTYPES, BenchSpec, OpSpec, ScalarInput

if TYPE_CHECKING:
    import torch

EAGER, COMPILE = "eager", "compile"

# timer(call, device, options, reset): `reset` (None for ops that mutate nothing) restores the mutated arguments and
# must run before each timed call, outside the timed region.
Timer = Callable[[Callable[[], Any], str, TimingOptions, "Callable[[], None] | None"], Timing]


@dataclass(frozen=True)
class BenchFilters:
    """Command-line selections; empty means the spec's `bench:` defaults."""

    devices: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    impls: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    layouts: tuple[str, ...] = ()
    seed: int = 0
    shard: Shard | None = None  # --shard K/N: only the points whose key hashes to this shard


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
    target: Target | None = None


# ---------------------------------------------------------------------------------------------------- planning


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
    devices = _choose(filters.devices, bench.devices or spec.devices, spec.devices, "--device", spec)
    default_dtypes = bench.dtypes or tuple(d for d in spec.dtypes if d in FLOATING_DTYPES) or spec.dtypes
    dtypes = _choose(filters.dtypes, default_dtypes, spec.dtypes, "--dtype", spec)
    default_modes = bench.modes or tuple(m for m in ("fwd", "bwd") if m in spec.bench_modes)
    modes = _choose(filters.modes, default_modes, spec.bench_modes, "--mode", spec)
    return devices, dtypes, modes


def _choose(
    given: tuple[str, ...], default: tuple[str, ...], claimed: tuple[str, ...], option: str, spec: OpSpec
) -> tuple[str, ...]:
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
    """(label, shape of each tensor input) per size point: `sizes` give every tensor input the shape (n,)."""
    bench = bench_section(spec, filters)
    tensors = [t.name for t in spec.tensor_inputs()]
    sizes = filters.sizes or bench.sizes
    points: list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]] = [
        (f"n={_size_label(n)}", tuple((name, (n,)) for name in tensors)) for n in sizes
    ]
    if not filters.sizes:
        points += [
            (",".join(f"{name}={'x'.join(map(str, shape)) or '0d'}" for name, shape in shapes), shapes)
            for shapes in bench.shapes
        ]
    return points


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
    claimed = tuple(layout for layout in BENCH_LAYOUTS if layout == "contiguous" or layout in spec.layouts)
    default = spec.bench.layouts if spec.bench and spec.bench.layouts else ("contiguous",)
    return _choose(filters.layouts, default, claimed, "--layout", spec)


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


def contenders(loaded: LoadedOp, filters: BenchFilters) -> list[Contender]:
    everyone = [Contender(t.name, IMPLEMENTATION, t.fn, t) for t in loaded.targets] + [
        Contender(EAGER, BASELINE, loaded.reference),
        Contender(COMPILE, BASELINE, None),
    ]
    known = [c.name for c in everyone]
    for name in filters.impls:
        if name not in known:
            raise UsageError("--impl", f"one of {', '.join(known)}", repr(name), "Pick one of the op's contenders.")
    return [c for c in everyone if not filters.impls or c.name in filters.impls]


# ----------------------------------------------------------------------------------------------------- running


def _no_step(text: str) -> AbstractContextManager:
    return nullcontext()


def _no_info(text: str) -> None:
    return None


@contextmanager
def _no_progress(total: int) -> Iterator[Callable[[BenchResult], None]]:
    yield lambda result: None


@dataclass(frozen=True)
class BenchHooks:
    """How a caller follows a run; the library prints nothing. step(text) wraps a long step (loading an op,
    measuring a peak); info(text) receives build messages; progress(total) wraps the timing of `total`
    (point, contender) pairs and yields a callback that receives each result."""

    step: Callable[[str], AbstractContextManager] = _no_step
    info: Callable[[str], None] = _no_info
    progress: Callable[[int], AbstractContextManager[Callable[[BenchResult], None]]] = _no_progress


def run_bench(
    specs: list[OpSpec],
    filters: BenchFilters,
    timing: TimingOptions,
    refresh_peak: bool = False,
    cuda_arch: str | None = None,
    hooks: BenchHooks = BenchHooks(),
    timer: Timer | None = None,
) -> BenchRun:
    """Load each op, measure (or read) each device's peak bandwidth, then time every point of every op.

    `timer` replaces the timers (benchmarks/bench_fidelity.py times with do_bench)."""
    from opforge.bench.environment import fingerprint
    from opforge.bench.peak import peak_bandwidth
    from opforge.loading import load_op

    start = time.perf_counter()
    for spec in specs:
        selected(spec, filters)  # a missing bench section or an unclaimed choice is an error before any build
    plans, skipped = [], {}
    for spec in specs:
        with hooks.step(f"loading {spec.name}"):
            loaded = load_op(spec, cuda_arch, on_step=hooks.info)
        devices, skips = runnable_devices(spec, filters)
        skipped.update(skips)
        plans.append((loaded, plan_points(spec, filters, devices), contenders(loaded, filters)))
    used = tuple(dict.fromkeys(p.device for _, points, _ in plans for p in points))
    env = fingerprint(used)
    options = {**vars(timing), "seed": filters.seed, "shard": shard_text(filters.shard)}
    run = BenchRun(environment=env, options=options, skipped=skipped)
    for device in used:
        with hooks.step(f"peak bandwidth of {device}"):
            peak = peak_bandwidth(device, env, refresh=refresh_peak)
        run.peaks[device] = {
            "gbps": peak.gbps,
            "method": peak.method,
            "measured_at": peak.measured_at,
            "cached": peak.cached,
            "key": peak.key,
        }
    total = sum(len(points) * len(chosen) for _, points, chosen in plans)
    with hooks.progress(total) as advance:
        for loaded, points, chosen in plans:
            for point in points:
                run.results += run_point(
                    loaded,
                    point,
                    chosen,
                    timing,
                    filters.seed,
                    run.peaks[point.device]["gbps"],
                    on_result=advance,
                    timer=timer,
                )
    run.seconds = time.perf_counter() - start
    return run


def run_point(
    loaded: LoadedOp,
    point: BenchPoint,
    chosen: list[Contender],
    timing: TimingOptions,
    seed: int,
    peak_gbps: float | None,
    on_result: Callable[[BenchResult], None] | None = None,
    timer: Timer | None = None,
) -> list[BenchResult]:
    """Every contender on one point, each on the same input values (the same seed)."""
    results = []

    def emit(contender: Contender, status: str, **fields: Any) -> None:
        result = BenchResult(
            loaded.spec.name,
            contender.name,
            contender.role,
            point.device,
            point.dtype,
            point.mode,
            point.label,
            point.elements,
            status,
            peak_gbps=peak_gbps,
            **fields,
        )
        results.append(result)
        if on_result:
            on_result(result)

    try:
        inputs = input_source(loaded, point, seed)
    except Exception as exc:
        for contender in chosen:
            emit(contender, ERROR, message=f"could not make the inputs: {short(exc)}")
        return results
    try:
        nbytes = bytes_moved(loaded, point.mode, inputs())
    except SpecError as exc:  # a bytes expression this point cannot evaluate: its rows say why, the run goes on
        for contender in chosen:
            emit(contender, ERROR, message=str(exc))
        return results
    for contender in chosen:
        # Only a baseline is cut off: the op's own rows are what the user asked to time, and verifying a large case
        # against the float64 reference takes minutes on a CPU (affine_leaky_swish's 256x64x112x112 backward on
        # 2 cores ran past 60 s); the heartbeat shows they are alive.
        limit = timing.contender_limit_s if contender.role == BASELINE else None
        try:
            with contender_time_limit(limit):
                status, fields = _run_contender(
                    loaded, point, contender, inputs, nbytes, timing, seed, timer or time_callable
                )
        except ContenderTimeLimit as cut:
            status, fields = SKIP, {"message": cut_off_note(contender, cut.seconds)}
        emit(contender, status, bytes=nbytes, **fields)
    return results


class ContenderTimeLimit(BaseException):
    """Raised into a contender that ran past its time limit. A BaseException, so that the `except Exception`
    of the contender's own code (and of this module's error rows) does not swallow it."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


@contextmanager
def contender_time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupts the block after `seconds` of wall-clock time (SIGALRM; the main thread of a POSIX process only,
    elsewhere no limit). A Python-level loop is interrupted at once, a single long native call when it returns."""
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise ContenderTimeLimit(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cut_off_note(contender: Contender, seconds: float) -> str:
    return (
        f"cut off after {seconds:g} s (--contender-limit): {contender.name} had not finished. Bench smaller "
        "--sizes, or raise --contender-limit"
    )


def _fresh_inputs(loaded: LoadedOp, point: BenchPoint, seed: int) -> CaseInputs:
    return make_inputs(
        loaded.spec, loaded.arguments, point.case, seed, requires_grad=point.mode != "fwd", generators=loaded.generators
    )


def input_source(loaded: LoadedOp, point: BenchPoint, seed: int) -> Callable[[], CaseInputs]:
    """What gives each contender its inputs. An op that mutates an argument gets a fresh set (same seed, same
    values) per contender, so that neither verification nor an earlier contender leaves it changed values; any
    other op shares one set. Between the reps of one contender, argument_restorer puts the values back."""

    def make() -> CaseInputs:
        return _fresh_inputs(loaded, point, seed)

    if loaded.mutated_arguments:
        make()  # fail here, before any row, if the inputs cannot be made at all
        return make
    shared = make()
    return lambda: shared


def _run_contender(
    loaded: LoadedOp,
    point: BenchPoint,
    contender: Contender,
    inputs: Callable[[], CaseInputs],
    nbytes: int | None,
    timing: TimingOptions,
    seed: int,
    timer: Timer,
) -> tuple[str, dict]:
    """(status, the row's fields). Whatever a contender raises costs its row, never the benchmark."""
    fields: dict = {}
    if contender.role == IMPLEMENTATION and contender.target is not None:
        try:
            status, fields = verify(loaded, contender.target, point, seed)
        except Exception as exc:
            return ERROR, {"message": f"{contender.name} raised {short(exc)} while being verified"}
        if status is not None:
            return status, fields
    try:
        fn = contender.fn if contender.fn is not None else compiled_reference(loaded)
        case_inputs = inputs()
        call = mode_callable(loaded, fn, case_inputs, point.mode, seed)
        reset = argument_restorer(loaded, case_inputs, point.mode)
        copies = 1
        if timing.cuda_graph and point.device == "cuda" and reset is None:
            copies = graph_input_copies(nbytes, l2_bytes(point.device))
            call = graph_rotation(
                call,
                [
                    mode_callable(loaded, fn, _fresh_inputs(loaded, point, seed), point.mode, seed)
                    for _ in range(copies - 1)
                ],
            )
        measured = timer(call, point.device, timing, reset)
        if copies > 1:
            measured = replace(measured, method=f"{measured.method}, inputs rotated over {copies} copies")
        return OK, {**fields, "timing": measured}
    except Exception as exc:
        return ERROR, {"message": f"{contender.name} raised {short(exc)} while being timed"}


def graph_rotation(first: Callable[[], Any], others: list[Callable[[], Any]]) -> Callable[[], Any]:
    """A call that runs `first`, then each of `others`, then `first` again...: captured k times in a CUDA graph,
    the graph's calls go round the copies of the inputs those calls hold, so a call never reads what the one
    before it left in L2 (--cuda-graph has no flush between calls)."""
    turns = itertools.cycle([first, *others])
    return lambda: next(turns)()


def verify(loaded: LoadedOp, target: Target, point: BenchPoint, seed: int) -> tuple[str | None, dict]:
    """(None, fields) when the implementation may be timed, else (WRONG, ERROR or SKIP, the row's fields): the
    point's checks (correctness for a forward, grad_lowp for a backward) through the engine's own outcome and xfail
    mapping. A mismatch the spec declares as xfail (for this implementation, check, dtype, device) is timed, with a
    note. What a check raises besides its outcomes propagates: the caller makes it the row's ERROR."""
    names = {"fwd": ("correctness",), "bwd": ("grad_lowp",), "fwd+bwd": ("correctness", "grad_lowp")}[point.mode]
    context = CheckContext(loaded, seed)
    notes = []
    for name in names:
        check = CATALOG.get(name)
        verdict = check_verdicts(check, functools.partial(check.run, context, target, point.case))[name]
        verdict = apply_xfail(loaded.spec, target.name, name, point.case, verdict)
        if verdict.status == Status.FAIL:
            return WRONG, {"message": f"{name}: {verdict.message}", "mismatch": verdict.mismatch}
        if verdict.status == Status.ERROR:
            return ERROR, {"message": verdict.message}
        if verdict.status == Status.SKIP:
            return SKIP, {"message": f"{name} skipped: {verdict.message}"}
        if verdict.status == Status.XFAIL:
            xfail = loaded.spec.xfail_for(
                target.name, name, point.dtype, point.device, point.case.layout, point.case.id
            )
            notes.append(f"{name} xfail: {xfail.reason if xfail else verdict.message}")
    return None, {"message": "; ".join(notes)} if notes else {}


def compiled_reference(loaded: LoadedOp) -> Callable[..., Any]:
    """torch.compile of the reference, compiled afresh for each point with static shapes: one compilation per
    point is what a user's model gets, and dynamo's recompile limit (8 per function) would otherwise send later
    points back to eager silently."""
    import torch

    torch._dynamo.reset()
    return torch.compile(loaded.reference, dynamic=False)


def mode_callable(
    loaded: LoadedOp, fn: Callable[..., Any], inputs: CaseInputs, mode: str, seed: int
) -> Callable[[], Any]:
    """What one timed call does. fwd: the call. bwd: autograd.grad through a graph built once (retain_graph), so
    only the backward runs. fwd+bwd: the call, then autograd.grad."""
    import torch

    def call() -> Any:
        return fn(*inputs.args, **inputs.kwargs)

    if mode == "fwd":
        return call
    wrt = [argument(inputs, loaded, name) for name in differentiated(loaded, inputs)]
    outputs = _differentiable(call())
    if not outputs:
        raise RuntimeError("no output requires grad: there is no backward to time")
    grad_outputs = [_random_like(o, seed + i) for i, o in enumerate(outputs)]
    if mode == "bwd":
        return lambda: torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=True)
    return lambda: torch.autograd.grad(_differentiable(call()), wrt, grad_outputs)


def argument_restorer(loaded: LoadedOp, inputs: CaseInputs, mode: str) -> Callable[[], None] | None:
    """What puts back the arguments a mutating op changes, for the timers to run before every rep: each rep then
    computes on the inputs' values, not on the previous rep's result (which compounds: x.mul_(2) reaches inf, and
    subnormals slow a CPU down). None when the op mutates nothing, and for `bwd`, which does not call the op."""
    import torch

    if not loaded.mutated_arguments or mode == "bwd":
        return None
    mutated = [argument(inputs, loaded, name) for name in loaded.mutated_arguments]
    saved = [(t, t.detach().clone()) for t in mutated if isinstance(t, torch.Tensor)]

    def restore() -> None:
        with torch.no_grad():
            for tensor, original in saved:
                tensor.copy_(original)

    return restore


def _differentiable(returned: Any) -> list[Any]:
    import torch

    return [o for o in as_tuple(returned) if isinstance(o, torch.Tensor) and o.requires_grad]


def _random_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Random values in t's own layout: a channels_last output gets a channels_last gradient, as the next layer's
    backward hands it in a channels_last network. A contiguous gradient made every contender time a layout
    conversion too (an H200's NHWC backward of affine_leaky_swish: 3-4x its NCHW time, for eager and compile too)."""
    import torch

    generator = torch.Generator(device=t.device).manual_seed(seed)
    return torch.empty_like(t).normal_(generator=generator)


# ----------------------------------------------------------------------------------------------- bytes moved


def bytes_moved(loaded: LoadedOp, mode: str, inputs: CaseInputs) -> int | None:
    """Bytes one call moves: the spec's `bench.bytes` expression for the mode, else the default count.

    Default: fwd reads every tensor input once (a mutated argument too) and writes every output that is not an
    alias of an argument, and every mutated argument, once; bwd reads each floating output's gradient and every
    tensor input once and writes each differentiated input's gradient once; fwd+bwd is the sum. None when the op's
    outputs cannot be known (its call raised: its row says why). Raises SpecError for an expression this point
    cannot evaluate. An op that mutates an argument changes `inputs`: pass a set no contender uses.
    """
    sizes = _sizes(loaded, inputs, with_gradients=mode != "fwd")
    if sizes is None:
        return None
    expressions = dict(loaded.spec.bench.bytes) if loaded.spec.bench else {}
    parts = ("fwd", "bwd") if mode == "fwd+bwd" and mode not in expressions else (mode,)
    return sum(
        _evaluate(loaded.spec, part, expressions[part], sizes)
        if part in expressions
        else _default_bytes(loaded, part, sizes)
        for part in parts
    )


def _default_bytes(loaded: LoadedOp, mode: str, sizes: dict[str, Any]) -> int:
    def tensors(names: Iterable[str]) -> list[expr.TensorSize]:
        return [sizes[n] for n in names if isinstance(sizes.get(n), expr.TensorSize)]

    read = tensors(_input_names(loaded))
    if mode == "fwd":
        return sum(t.nbytes for t in read + tensors(_written_outputs(loaded)) + tensors(loaded.mutated_arguments))
    gradients = tensors(f"grad_{n}" for n in _output_names(loaded) + _input_names(loaded))
    return sum(t.nbytes for t in read + gradients)


def _sizes(loaded: LoadedOp, inputs: CaseInputs, with_gradients: bool) -> dict[str, Any] | None:
    """The names an expression can use, bound to TensorSize (tensors) or values (scalars); grad_<output> (floating
    outputs) and grad_<input> (inputs with requires_grad), the same sizes, for the modes that run a backward."""
    import torch

    names = _input_names(loaded)
    values = {n: _size_of(argument(inputs, loaded, n)) for n in names}
    try:
        with torch.no_grad():
            returned = loaded.overload(*inputs.args, **inputs.kwargs)
    except Exception:
        return None
    returned = as_tuple(returned) if loaded.overload._schema.returns else ()
    for name, value in zip(_output_names(loaded), returned):
        values[name] = _size_of(value)
        if with_gradients and isinstance(values[name], expr.TensorSize) and values[name].floating:
            values[f"grad_{name}"] = values[name]
    for name in inputs.tensor_names if with_gradients else ():
        if isinstance(values.get(name), expr.TensorSize) and argument(inputs, loaded, name).requires_grad:
            values[f"grad_{name}"] = values[name]
    return values


def _size_of(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return expr.TensorSize(
            tuple(value.shape), value.element_size(), value.is_floating_point() or value.is_complex()
        )
    return value


def _input_names(loaded: LoadedOp) -> list[str]:
    return [i.name for i in loaded.spec.inputs]


def _output_names(loaded: LoadedOp) -> list[str]:
    return output_names(loaded)


def _written_outputs(loaded: LoadedOp) -> list[str]:
    """Outputs a call writes: not those the schema declares as an alias of an argument (`-> Tensor(a!)`), which
    are the mutated argument itself, counted once as that."""
    returns = loaded.overload._schema.returns
    return [name for name, r in zip(_output_names(loaded), returns) if r.alias_info is None]


def _evaluate(spec: OpSpec, mode: str, text: str, sizes: dict[str, Any]) -> int:
    bench = spec.bench or BenchSpec()
    key = dict(bench.keys).get(mode, f"bench.bytes.{mode}")
    line = dict(bench.lines).get(mode)
    try:
        value = expr.evaluate(expr.parse(text, set(sizes)), sizes)
    except (ValueError, ArithmeticError) as exc:  # ExpressionError is a ValueError; so is math.ceil(nan)
        raise SpecError(
            spec.path,
            line,
            key,
            "an expression this point can evaluate",
            str(exc),
            "Use the names listed (see docs/specs.md, `bench.bytes`).",
        ) from None
    if value < 0:
        raise SpecError(spec.path, line, key, "a number of bytes >= 0", repr(value), "Fix the expression.")
    return int(value)


def runnable_devices(spec: OpSpec, filters: BenchFilters) -> tuple[tuple[str, ...], dict[str, str]]:
    """(devices to run, {device: why it is skipped})."""
    devices, _, _ = selected(spec, filters)
    reasons = {d: device_unavailable(d) for d in devices}
    return tuple(d for d in devices if reasons[d] is None), {d: r for d, r in reasons.items() if r}
