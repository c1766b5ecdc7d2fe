"""`opforge profile`: each implementation of an op under torch.profiler, the seed article's profiling section as one
command. Per (point, implementation): the kernels one call launches and each one's time and share, the host time
per call, the achieved GB/s where the bytes are known, and a Chrome/Perfetto trace.

The points are `opforge bench`'s (the spec's `bench:` section, or `--sizes`), the first size unless sizes are
given; the implementations are bench's contenders (the op's implementations, the eager reference, torch.compile of
it). Each contender is warmed up, then CALLS calls run under the profiler with CPU (and, on CUDA, device) activity.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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
    try:
        call = mode_callable(loaded, fn, inputs, point.mode, seed)
        restore: Callable[[], None] = argument_restorer(loaded, inputs, point.mode) or (lambda: None)
        nbytes = bytes_moved(loaded, point.mode, inputs)
        sync: Callable[[], None] = torch.cuda.synchronize if point.device == "cuda" else (lambda: None)
        for _ in range(WARMUP_CALLS):
            restore()
            call()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            restore()
            call()
        sync()
        wall = (time.perf_counter() - start) / calls
        activities = [torch.profiler.ProfilerActivity.CPU]
        if point.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(calls):
                restore()
                call()
            sync()
    except Exception as exc:  # the contender cannot run at this point: its result says why, the others still run
        return _with(base, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    return _summarize(base, prof.key_averages(), calls, wall, nbytes, point.device, trace)


def _summarize(
    base: Profiled,
    events: Sequence[FunctionEventAvg],
    calls: int,
    wall: float,
    nbytes: int | None,
    device: str,
    trace: Path | None,
) -> Profiled:
    on_device = device == "cuda"
    work = [e for e in events if _is_work(e, on_device)]
    total = sum(_self_seconds(e, on_device) for e in work) / calls
    # The host's share of a call. CUDA: the CPU time the profiled operators take (dispatch, launches), which the
    # device's work overlaps. CPU: what the wall time spends outside them (Python, argument handling).
    if on_device:
        host = sum(e.self_cpu_time_total for e in events if not _is_device_event(e) and e.key not in _NOT_WORK)
        host_per_call = host / 1e6 / calls
    else:
        host_per_call = max(wall - total, 0.0)
    kernels = sorted(
        (
            Kernel(
                str(e.key),  # an average of key_averages() always has its key
                e.count / calls,
                _self_seconds(e, on_device) / calls,
                _self_seconds(e, on_device) / calls / total if total else 0.0,
            )
            for e in work
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
