"""`opforge profile`: each implementation of an op under torch.profiler, the seed article's profiling section as one
command. Per (point, implementation): the kernels one call launches and each one's time and share, the host time
per call, the achieved GB/s where the bytes are known, and a Chrome/Perfetto trace.

The points are `opforge bench`'s (the spec's `bench:` section, or `--sizes`), the first size unless sizes are
given; the implementations are bench's contenders (the op's implementations, the eager reference, torch.compile of
it). Each contender is warmed up, then CALLS calls run under the profiler with CPU (and, on CUDA, device) activity.
A mutating op's arguments are put back before each call, outside the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opforge.bench.bytes import bytes_moved
from opforge.bench.plan import BenchFilters, BenchPoint, contenders, plan_points, runnable_devices
from opforge.bench.runner import argument_restorer, compiled_reference, input_source, mode_callable
from opforge.core.errors import UsageError
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEventAvg

    from opforge.building.op import LoadedOp
    from opforge.cases.arguments import CaseInputs

# Calls profiled per contender: enough that per-call figures are averages, few enough for a large point.
CALLS = 10
# Warm-up calls before profiling: the first call of a compiled or lazily initialized contender is not its cost.
WARMUP_CALLS = 3
# Kernels listed per contender; the rest are summed into one line.
SHOWN_KERNELS = 6
# Events the profiler records about itself or about waiting, not the op's work.
_NOT_WORK = ("ProfilerStep", "cudaDeviceSynchronize", "cudaStreamSynchronize", "Activity Buffer Request")


@dataclass(frozen=True)
class Kernel:
    """One kernel (CUDA) or one operator's own work (CPU), per profiled call."""

    name: str
    calls: float
    seconds: float
    share: float


@dataclass(frozen=True)
class Profiled:
    """One implementation at one point."""

    point: str
    dtype: str
    device: str
    mode: str
    contender: str
    wall_seconds: float = 0.0
    work_seconds: float = 0.0
    host_seconds: float = 0.0
    launches: float = 0.0
    gb_per_s: float | None = None
    kernels: tuple[Kernel, ...] = ()
    trace: str | None = None
    error: str | None = None


@dataclass
class ProfileRun:
    op: str
    calls: int
    results: list[Profiled] = field(default_factory=list)
    skipped_devices: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "calls": self.calls,
            "skipped_devices": self.skipped_devices,
            "results": [asdict(r) for r in self.results],
        }


def profile_op(
    spec: OpSpec,
    filters: BenchFilters,
    trace: Path | None = None,
    calls: int = CALLS,
    on_step: Callable[[str], None] | None = None,
) -> ProfileRun:
    from opforge.loading.checked import load_checked

    if calls < 1:
        raise UsageError("--calls", "a number of calls >= 1", repr(calls), "Write e.g. --calls 10.")
    devices, skipped = runnable_devices(spec, filters)
    run = ProfileRun(spec.name, calls, skipped_devices=skipped)
    points = _first_size(plan_points(spec, filters, devices), filters)
    loaded = load_checked(spec)
    for point in points:
        make_inputs = input_source(loaded, point, filters.seed)
        for contender in contenders(loaded, filters):
            if on_step:
                on_step(f"profiling {contender.name} on {point.label} {point.dtype} {point.mode} {point.device}")
            fn = contender.fn or compiled_reference(loaded)
            path = _trace_path(trace, point, contender.name, len(run.results)) if trace else None
            run.results.append(_profile(loaded, point, contender.name, fn, make_inputs(), calls, filters.seed, path))
    return run


def _first_size(points: list[BenchPoint], filters: BenchFilters) -> list[BenchPoint]:
    """Without --sizes, the spec's first bench size (per device, dtype and mode): a profile is read, not swept."""
    if filters.sizes:
        return points
    return [p for p in points if p.case.shape_index == 0]


def _trace_path(trace: Path, point: BenchPoint, contender: str, index: int) -> Path:
    label = "".join(c if c.isalnum() or c in "-_=" else "_" for c in f"{point.label}-{point.dtype}-{point.mode}")
    return trace.with_name(f"{trace.stem}-{index:02d}-{contender}-{point.device}-{label}{trace.suffix or '.json'}")


def _profile(
    loaded: LoadedOp,
    point: BenchPoint,
    name: str,
    fn: Callable[..., Any],
    inputs: CaseInputs,
    calls: int,
    seed: int,
    trace: Path | None,
) -> Profiled:
    import torch

    base = Profiled(point.label, point.dtype, point.device, point.mode, name)
    on_device = point.device == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if on_device else (lambda: None)
    try:
        call = mode_callable(loaded, fn, inputs, point.mode, seed)
        restore = argument_restorer(loaded, inputs, point.mode)
        nbytes = bytes_moved(loaded, point.mode, inputs)
        # A mutating op's calls each start by putting its arguments back (as bench's reps do). That copy is the
        # harness's work, not the op's: it runs outside the wall clock, and its own profile is taken out of the
        # call's, so the figures are the op's alone (the trace keeps it, labelled).
        restore = _labelled(restore) if restore is not None else None
        step = call if restore is None else _after(restore, call)
        for _ in range(WARMUP_CALLS):
            step()
        wall = _wall_per_call(call, calls, sync, before_each=restore)
        totals, prof = _profiled(step, calls, sync, on_device)
        if restore is not None:
            totals = totals.less(_profiled(restore, calls, sync, on_device)[0])
    except Exception as exc:  # the contender cannot run at this point: its result says why, the others still run
        return _with(base, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    return _summarize(base, totals, calls, wall, nbytes, on_device, trace)


# The name a mutating op's argument restore carries in a trace (the figures leave it out).
RESTORE_LABEL = "opforge: restore the arguments the op writes"


def _labelled(restore: Callable[[], None]) -> Callable[[], None]:
    import torch

    def labelled() -> None:
        with torch.profiler.record_function(RESTORE_LABEL):
            restore()

    return labelled


def _after(first: Callable[[], None], call: Callable[[], Any]) -> Callable[[], Any]:
    def both() -> Any:
        first()
        return call()

    return both


def _wall_per_call(
    call: Callable[[], Any], calls: int, sync: Callable[[], None], before_each: Callable[[], None] | None = None
) -> float:
    """Back to back; with `before_each`, call by call with it outside the clock (on CUDA each call then waits for
    its own kernels instead of overlapping the next launch)."""
    if before_each is None:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        return (time.perf_counter() - start) / calls
    total = 0.0
    for _ in range(calls):
        before_each()
        sync()
        start = time.perf_counter()
        call()
        sync()
        total += time.perf_counter() - start
    return total / calls


@dataclass(frozen=True)
class _Totals:
    """A profile summed by event name over its calls: each kernel's (CUDA) or operator's own (CPU) count and
    seconds, and the host's CPU time in the profiled operators."""

    work: dict[str, tuple[float, float]]
    host_seconds: float

    def less(self, other: _Totals) -> _Totals:
        """These totals without `other`'s, name by name; a name left with no calls is gone."""
        work = {}
        for name, (count, seconds) in self.work.items():
            their_count, their_seconds = other.work.get(name, (0.0, 0.0))
            if count - their_count > 0:
                work[name] = (count - their_count, max(seconds - their_seconds, 0.0))
        return _Totals(work, max(self.host_seconds - other.host_seconds, 0.0))


def _profiled(step: Callable[[], Any], calls: int, sync: Callable[[], None], on_device: bool) -> tuple[_Totals, Any]:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_device:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        sync()
    events = prof.key_averages()
    work = {str(e.key): (float(e.count), _self_seconds(e, on_device)) for e in events if _is_work(e, on_device)}
    host = sum(e.self_cpu_time_total for e in events if not _is_device_event(e) and e.key not in _NOT_WORK) / 1e6
    return _Totals(work, host), prof


def _summarize(
    base: Profiled,
    totals: _Totals,
    calls: int,
    wall: float,
    nbytes: int | None,
    on_device: bool,
    trace: Path | None,
) -> Profiled:
    total = sum(seconds for _, seconds in totals.work.values()) / calls
    # The host's share of a call. CUDA: the CPU time the profiled operators take (dispatch, launches), which the
    # device's work overlaps. CPU: what the wall time spends outside them (Python, argument handling).
    host_per_call = totals.host_seconds / calls if on_device else max(wall - total, 0.0)
    kernels = sorted(
        (
            Kernel(name, count / calls, seconds / calls, seconds / calls / total if total else 0.0)
            for name, (count, seconds) in totals.work.items()
        ),
        key=lambda k: -k.seconds,
    )
    seconds = total if on_device and total else wall
    return _with(
        base,
        wall_seconds=wall,
        work_seconds=total,
        host_seconds=host_per_call,
        launches=sum(k.calls for k in kernels) if on_device else 0.0,
        gb_per_s=nbytes / seconds / 1e9 if nbytes and seconds else None,
        kernels=tuple(kernels),
        trace=str(trace) if trace else None,
    )


def _is_device_event(event: FunctionEventAvg) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def _is_work(event: FunctionEventAvg, on_device: bool) -> bool:
    """CUDA: every kernel and copy the device ran. CPU: every operator's own time (the leaf work)."""
    if event.key in _NOT_WORK:
        return False
    if on_device:
        return _is_device_event(event) and _self_seconds(event, True) > 0
    return not _is_device_event(event) and event.self_cpu_time_total > 0


def _self_seconds(event: FunctionEventAvg, on_device: bool) -> float:
    if on_device:
        # self_cuda_time_total: torch before the device-neutral names.
        micros: float = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        return micros / 1e6
    return event.self_cpu_time_total / 1e6


def _with(base: Profiled, **changes: Any) -> Profiled:
    from dataclasses import replace

    return replace(base, **changes)
