"""Running a spec's benchmarks (planned by opforge.bench.plan, bytes counted by opforge.bench.bytes): verification
against the reference, then timing.

Every implementation (the op itself, the spec's `implementations`) is first checked on the benchmark's own inputs
with the same checks `opforge check` runs (`correctness` for the forward, `grad_lowp` for the gradients); one
that does not match the reference at the spec's tolerance is a WRONG result and is not timed. The baselines, the
reference run eagerly in the benchmark's dtype and `torch.compile` of it, are timed as they are.
"""

from __future__ import annotations

import functools
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opforge.bench.bytes import bytes_moved
from opforge.bench.model import (
    BASELINE,
    ERROR,
    IMPLEMENTATION,
    OK,
    SKIP,
    WRONG,
    BenchResult,
    BenchRun,
)
from opforge.bench.plan import (
    BenchFilters,
    BenchPoint,
    Contender,
    contenders,
    plan_points,
    replayable,
    restored_each_rep,
    runnable_devices,
    selected,
    size_points,
    unclaimed,
    unsized,
)
from opforge.bench.timing import (
    Timing,
    TimingOptions,
    graph_input_copies,
    l2_bytes,
    on_graph_stream,
    time_callable,
)
from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs, make_inputs
from opforge.cases.compare import leaves
from opforge.checks.base import CheckContext
from opforge.checks.catalog import CATALOG
from opforge.checks.op_and_reference import argument, differentiated
from opforge.core.errors import SpecError
from opforge.core.outcomes import short
from opforge.core.results import Status
from opforge.core.shard import shard_text
from opforge.engine.events import Events
from opforge.engine.tasks import apply_xfail, check_verdicts
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    import torch


# timer(call, device, options, reset): `reset` (None for ops that mutate nothing) restores the mutated arguments and
# must run before each timed call, outside the timed region.
Timer = Callable[[Callable[[], Any], str, TimingOptions, "Callable[[], None] | None"], Timing]


# ---------------------------------------------------------------------------------------------------- planning


# ----------------------------------------------------------------------------------------------------- running


def run_bench(
    specs: list[OpSpec],
    filters: BenchFilters,
    timing: TimingOptions,
    refresh_peak: bool = False,
    cuda_arch: str | None = None,
    events: Events | None = None,
    timer: Timer | None = None,
) -> BenchRun:
    """Load each op, measure (or read) each device's peak bandwidth, then time every point of every op. The library
    prints nothing: `events` hears each long task (loading an op, measuring a peak), the build's messages (step),
    how many (point, contender) pairs the run times (planned), each result, and the run's end (finish).

    `timer` replaces the timers (benchmarks/bench_fidelity.py times with do_bench)."""
    events = events or Events()
    from opforge.bench.environment import fingerprint
    from opforge.bench.peak import peak_bandwidth
    from opforge.loading.checked import load_checked

    start = time.perf_counter()
    for spec in specs:
        selected(spec, filters)  # a missing bench section or an unclaimed choice is an error before any build
    # `--all` leaves out an op that claims none of the asked devices, dtypes, modes or layouts, and sizes an op's
    # inputs cannot take, each with the reason; an op left with no point is not built, and the others are timed.
    left_out = {spec.name: why for spec in specs if (why := unclaimed(spec, filters))}
    kept = [spec for spec in specs if spec.name not in left_out]
    skipped = left_out | {spec.name: why for spec in kept if (why := unsized(spec, filters))}
    plans = []
    for spec in (s for s in kept if s.name not in skipped or size_points(s, filters)):
        with _task(events, f"loading {spec.name}"):
            loaded = load_checked(spec, cuda_arch, on_step=events.step)
        devices, skips = runnable_devices(spec, filters)
        points, unreplayable = replayable(
            spec, plan_points(spec, filters, devices), loaded.mutated_arguments, timing.cuda_graph
        )
        skipped.update(skips | unreplayable)
        plans.append((loaded, points, contenders(loaded, filters)))
    used = tuple(dict.fromkeys(p.device for _, points, _ in plans for p in points))
    env = fingerprint(used)
    options = {**vars(timing), "seed": filters.seed, "shard": shard_text(filters.shard)}
    run = BenchRun(environment=env, options=options, skipped=skipped)
    for device in used:
        with _task(events, f"peak bandwidth of {device}"):
            peak = peak_bandwidth(device, env, refresh=refresh_peak)
        run.peaks[device] = {
            "gbps": peak.gbps,
            "method": peak.method,
            "measured_at": peak.measured_at,
            "cached": peak.cached,
            "key": peak.key,
        }
    total = sum(len(points) * len(chosen) for _, points, chosen in plans)
    events.planned("bench", total)
    try:
        for loaded, points, chosen in plans:
            for point in points:
                run.results += run_point(
                    loaded,
                    point,
                    chosen,
                    timing,
                    filters.seed,
                    run.peaks[point.device]["gbps"],
                    on_result=functools.partial(events.result, "bench"),
                    timer=timer,
                )
        run.seconds = time.perf_counter() - start
    finally:
        events.finish(run)
    return run


@contextmanager
def _task(events: Events, name: str) -> Iterator[None]:
    events.task_started(name)
    try:
        yield
    finally:
        events.task_finished(name)


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

    def emit(contender: Contender, status: Status, **fields: Any) -> None:
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
    except SpecError as exc:  # a bytes expression this point cannot evaluate: its results say why, the run goes on
        for contender in chosen:
            emit(contender, ERROR, message=str(exc))
        return results
    for contender in chosen:
        # Only a baseline is cut off: the op's own results are what the user asked to time, and verifying a large case
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
    of the contender's own code (and of this module's error results) does not swallow it."""

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
        make()  # fail here, before any result, if the inputs cannot be made at all
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
) -> tuple[Status, dict[str, Any]]:
    """(status, the result's fields). Whatever a contender raises costs its result, never the benchmark."""
    fields: dict[str, Any] = {}
    if contender.role == IMPLEMENTATION and contender.implementation is not None:
        try:
            status, fields = verify(loaded, contender.implementation, point, seed)
        except Exception as exc:
            return ERROR, {"message": f"{contender.name} raised {short(exc)} while being verified"}
        if status is not None:
            return status, fields
    try:
        fn = contender.fn if contender.fn is not None else compiled_reference(loaded)
        with on_graph_stream(timing, point.device):
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


def verify(
    loaded: LoadedOp, implementation: Implementation, point: BenchPoint, seed: int
) -> tuple[Status | None, dict[str, Any]]:
    """(None, fields) when the implementation may be timed, else (WRONG, ERROR or SKIP, the result's fields): the
    point's checks (correctness for a forward, grad_lowp for a backward) through the engine's own outcome and xfail
    mapping. A mismatch the spec declares as xfail (for this implementation, check, dtype, device) is timed, with a
    note. What a check raises besides its outcomes propagates: the caller makes it the result's ERROR."""
    names = {"fwd": ("correctness",), "bwd": ("grad_lowp",), "fwd+bwd": ("correctness", "grad_lowp")}[point.mode]
    context = CheckContext(loaded, seed)
    notes = []
    for name in names:
        check = CATALOG.get(name)
        verdict = check_verdicts(check, functools.partial(check.run, context, implementation, point.case))[name]
        verdict = apply_xfail(loaded.spec, implementation.name, name, point.case, verdict)
        if verdict.status == Status.FAIL:
            return WRONG, {"message": f"{name}: {verdict.message}", "mismatch": verdict.mismatch}
        if verdict.status == Status.ERROR:
            return ERROR, {"message": verdict.message}
        if verdict.status == Status.SKIP:
            return SKIP, {"message": f"{name} skipped: {verdict.message}"}
        if verdict.status == Status.XFAIL:
            xfail = loaded.spec.xfail_for(
                implementation.name, name, point.dtype, point.device, point.case.layout, point.case.id
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

    if not restored_each_rep(loaded.mutated_arguments, mode):
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

    flat = [leaf for _, leaf in leaves("", returned)]
    return [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad]


def _random_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Random values in t's own layout: a channels_last output gets a channels_last gradient, as the next layer's
    backward hands it in a channels_last network. A contiguous gradient made every contender time a layout
    conversion too (an H200's NHWC backward of affine_leaky_swish: 3-4x its NCHW time, for eager and compile too)."""
    import torch

    generator = torch.Generator(device=t.device).manual_seed(seed)
    return torch.empty_like(t).normal_(generator=generator)


# ----------------------------------------------------------------------------------------------- bytes moved
