"""Timers. Each returns per-call samples in seconds; the statistics are opforge.bench.stats'.

GPU: CUDA events around every rep, L2 flushed before every rep outside the timed region, a time-based warm-up,
then reps in growing batches until IQR/median is under the noise target (after a minimum of reps and time) or the
time budget is spent. An optional CUDA-graph mode replays many calls per sample for microsecond ops.
CPU: blocks of calls timed by torch.utils.benchmark's Timer.timeit, after the same time-based warm-up and under the
same stopping rule (measure_until_stable); the thread count is recorded.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opforge.bench.stats import relative_iqr
from opforge.core.cuda_spin import spin

if TYPE_CHECKING:
    import torch
    from torch.types import Device

# Triton's do_bench flushes with a 256 MB write; never flushing less keeps our medians comparable with its. Above
# that, twice the device's L2 (H200: 2 x 60 MiB) so no line of the op's inputs can survive.
MIN_FLUSH_BYTES = 256 * 2**20
# Calls made in the warm-up even when one call outlasts the warm-up time (the first call of a torch.compile
# baseline compiles; the next ones must run the compiled code before timing starts).
MIN_WARMUP_CALLS = 3
# CUDA-graph mode: calls captured per graph so that one replay lasts about this long (launch cost amortized),
# at most GRAPH_MAX_CALLS (each call's outputs live in the graph's memory pool).
GRAPH_REPLAY_S = 1e-3
GRAPH_MAX_CALLS = 1000
# Between the flush and the start event the GPU spins for this many times the call's host-side launch cost (and at
# least LAUNCH_COVER_MIN_S), so the whole call is queued before the timed region opens. Without it a call whose
# launch costs more than the flush's GPU time (an autograd backward: Python, autograd engine, dispatcher) is timed
# by its CPU overhead. 4x: at 2x a spin of 162 us left split samples where spins of 283 and 390 us gave clean runs,
# and a longer spin only costs wall time outside the timed region (docs/measurements/kernel-notes.md, "LAUNCH_COVER").
LAUNCH_COVER = 4.0
LAUNCH_COVER_MIN_S = 20e-6
# Calls whose host-side time is measured (median) to size that spin.
LAUNCH_PROBES = 5
# Reps in the first batch: few, so an op slower than budget / min_reps still stops near the budget.
FIRST_BATCH = 4
# CPU: calls per sample grow tenfold until one block lasts this long. Timer.timeit's fixed cost inside the timed
# region, 0.73 us, is < 0.1% of a 1 ms block; the default 0.1 s of measured time still gives ~100 samples, well above
# the default 25 --min-reps (docs/measurements/kernel-notes.md, "CPU_BLOCK_S").
CPU_BLOCK_S = 1e-3
CPU_MAX_BLOCK_CALLS = 10**6


@dataclass(frozen=True)
class TimingOptions:
    """How long and how precisely to time one contender on one case."""

    budget_s: float = 2.0  # the measurement loop stops after this much time even if still noisy
    warmup_s: float = 0.2
    noise_target: float = 0.02  # stop when IQR / median is below this ...
    min_reps: int = 25  # ... but not before this many samples
    min_time_s: float = 0.1  # ... and this much measured time
    max_reps: int = 10_000  # bounds a microsecond op's samples (and the JSON) when its noise stays high
    cuda_graph: bool = False
    # Wall-clock seconds one baseline (eager, compile) may take on one case, compiling and warm-up included; past it
    # it is cut off with a note. A slow reference otherwise stalls the run (a Python-loop reference took 11 minutes
    # on one case); 60 s is 30x the default timing budget. None: no limit.
    contender_limit_s: float | None = 60.0


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]  # seconds per call
    method: str
    calls_per_sample: int
    stopped: str  # "noise" (IQR/median under the target), "budget" or "max_reps"
    threads: int | None = None  # CPU: torch's intra-op threads
    flush_bytes: int | None = None  # GPU: the L2 flush written before each rep; None when not flushed
    launch_cover_s: float | None = None  # GPU: the spin before each rep's start event (LAUNCH_COVER)
    # GPU: the call's host-side time (host_launch_seconds). A median at or below it was set by the CPU, not the GPU,
    # for any timer that does not cover the launch (triton's do_bench).
    host_s: float | None = None


def flush_bytes_for(l2_bytes: int) -> int:
    return max(2 * l2_bytes, MIN_FLUSH_BYTES)


def l2_bytes(device: Device) -> int:
    import torch

    size: int = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    return size


def graph_input_copies(bytes_per_call: int | None, l2: int) -> int:
    """Copies of the inputs a CUDA graph's calls go round so that, together, they are a flush's worth of bytes: each
    call then finds its inputs out of L2, as a flushed rep does. One copy when the bytes are unknown."""
    if not bytes_per_call:
        return 1
    return max(1, min(GRAPH_MAX_CALLS, -(-flush_bytes_for(l2) // bytes_per_call)))


def warm_up(
    fn: Callable[[], object], seconds: float, sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter
) -> int:
    """Call fn until `seconds` have passed and at least MIN_WARMUP_CALLS were made; the number of calls."""
    start, calls = clock(), 0
    while calls < MIN_WARMUP_CALLS or clock() - start < seconds:
        fn()
        sync()
        calls += 1
    return calls


def measure_until_stable(
    run_batch: Callable[[int], list[float]], options: TimingOptions, clock: Callable[[], float] = time.perf_counter
) -> tuple[list[float], str]:
    """Samples from batches of reps (`run_batch(n)` returns n samples) until the noise target or the budget.

    Batches grow geometrically so that a noisy op does not pay a synchronization per rep, and a quiet one stops
    soon after the minimum. The minimum time is the clock's, not the samples' sum: a sample is one call's time,
    while a rep also spends time outside it (the L2 flush, the launch spin, a CUDA graph's other calls).
    """
    samples: list[float] = []
    start = clock()
    deadline = start + options.budget_s
    batch = FIRST_BATCH
    while True:
        samples += run_batch(min(batch, options.max_reps - len(samples)))
        if (
            len(samples) >= options.min_reps
            and clock() - start >= options.min_time_s
            and relative_iqr(samples) < options.noise_target
        ):
            return samples, "noise"
        if clock() >= deadline:
            return samples, "budget"
        if len(samples) >= options.max_reps:
            return samples, "max_reps"
        # The next batch fits the time left, judged by the clock time per rep so far.
        per_rep = (clock() - start) / len(samples)
        left = max(1, int((deadline - clock()) / per_rep)) if per_rep > 0 else 2 * batch
        batch = max(1, min(2 * batch, left))


# --------------------------------------------------------------------------------------------------- CUDA


class L2Flush:
    """Writes a buffer of at least twice the L2 before each rep. The buffer is the flusher's own and the write is
    aten::zero_ called with Python-level function overrides disabled, so nothing the op under test registers
    (a TorchFunctionMode, a tensor subclass, an override of its own op) takes part in it."""

    def __init__(self, device: Device) -> None:
        import torch

        self.nbytes = flush_bytes_for(l2_bytes(device))
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        import torch

        with torch._C.DisableTorchFunction():
            torch.ops.aten.zero_.default(self.buffer)


def host_launch_seconds(
    fn: Callable[[], object], sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter
) -> float:
    """The median host-side time of a call on an idle GPU: what the CPU spends queueing it."""
    import statistics

    times = []
    for _ in range(LAUNCH_PROBES):
        sync()
        start = clock()
        fn()
        times.append(clock() - start)
    sync()
    return statistics.median(times)


def time_cuda(
    fn: Callable[[], object], options: TimingOptions, device: Device = "cuda", reset: Callable[[], None] | None = None
) -> Timing:
    """CUDA-event samples of `fn`. `reset`, when given, runs before every rep outside the timed region (and before
    the L2 flush, so what it writes is not left in L2): it restores the arguments a mutating op changes."""
    import torch

    if options.cuda_graph:
        if reset is not None:
            raise ValueError(
                "a CUDA graph replays many calls per sample, so the arguments the op mutates cannot be "
                "restored between them; time this op without --cuda-graph"
            )
        return _time_cuda_graph(fn, options)
    flush = L2Flush(device)
    restore = reset or _nothing

    def flushed_call() -> None:
        restore()
        flush()
        fn()

    warm_up(flushed_call, options.warmup_s, torch.cuda.synchronize)
    host_s = host_launch_seconds(fn, torch.cuda.synchronize)
    cover_s = max(LAUNCH_COVER * host_s, LAUNCH_COVER_MIN_S)

    def run_batch(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends):
            restore()
            flush()
            spin(cover_s)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]

    samples, stopped = measure_until_stable(run_batch, options)
    return Timing(
        tuple(samples), "cuda-events", 1, stopped, flush_bytes=flush.nbytes, launch_cover_s=cover_s, host_s=host_s
    )


def graph_calls_for(seconds_per_call: float) -> int:
    """Calls captured in one graph so a replay lasts about GRAPH_REPLAY_S."""
    if seconds_per_call <= 0:
        return GRAPH_MAX_CALLS
    return max(1, min(GRAPH_MAX_CALLS, round(GRAPH_REPLAY_S / seconds_per_call)))


@functools.cache
def _graph_stream(device_index: int) -> torch.cuda.Stream:
    import torch

    return torch.cuda.Stream(device_index)


@contextmanager
def on_graph_stream(options: TimingOptions, device: Device) -> Iterator[None]:
    """With --cuda-graph on a GPU, everything a timed call is built from runs on the one stream its graph is
    captured on. A backward runs on the stream its forward ran on: a bwd call whose forward ran on the default
    stream, captured on another, makes the capture wait on a stream outside it, and CUDA invalidates the capture
    (custom_loss's first backward, `opforge bench --all --cuda-graph` on an H100, 2026-12-07)."""
    import torch

    if not options.cuda_graph or device is None or torch.device(device).type != "cuda":
        yield
        return
    stream = _graph_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


def _time_cuda_graph(fn: Callable[[], object], options: TimingOptions) -> Timing:
    """Replays of a graph of k calls, one sample = replay time / k. No L2 flush between the calls (flush_bytes
    None): this mode is for ops whose launch cost rivals their run time. The caller keeps inputs cold by passing
    an `fn` that goes round copies of them (opforge.bench.runner.graph_rotation), and builds it on_graph_stream.
    Warm-up, the probe call and the capture run on that stream, a side stream as CUDA graphs require."""
    import torch

    with on_graph_stream(options, "cuda"):
        warm_up(fn, options.warmup_s, torch.cuda.synchronize)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        calls = graph_calls_for(start.elapsed_time(end) / 1e3)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
            for _ in range(calls):
                fn()
    graph.replay()
    torch.cuda.synchronize()

    def run_batch(n: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for s, e in events:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 / calls for s, e in events]

    samples, stopped = measure_until_stable(run_batch, options)
    return Timing(tuple(samples), "cuda-graph", calls, stopped, flush_bytes=None)


# ---------------------------------------------------------------------------------------------------- CPU


def time_cpu(fn: Callable[[], object], options: TimingOptions, reset: Callable[[], None] | None = None) -> Timing:
    """Samples of blocks of calls timed by Timer.timeit. With `reset` (restoring what a mutating op changes) each
    sample is one call timed by the clock after a reset: Timer.timeit runs warm-up calls of its own inside a
    block, which would see the previous call's result."""
    import torch
    from torch.utils import benchmark

    threads = torch.get_num_threads()
    if reset is not None:
        return _time_cpu_restored(fn, reset, options, threads)
    warm_up(fn, options.warmup_s, _nothing)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    calls = cpu_block_calls(lambda number: timer.timeit(number).raw_times[0])

    def run_batch(n: int) -> list[float]:
        return [timer.timeit(calls).mean for _ in range(n)]

    samples, stopped = measure_until_stable(run_batch, options)
    return Timing(tuple(samples), "torch.utils.benchmark.Timer.timeit", calls, stopped, threads=threads)


def _time_cpu_restored(
    fn: Callable[[], object], reset: Callable[[], None], options: TimingOptions, threads: int
) -> Timing:
    def restored_call() -> None:
        reset()
        fn()

    warm_up(restored_call, options.warmup_s, _nothing)

    def run_batch(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            reset()
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return samples

    samples, stopped = measure_until_stable(run_batch, options)
    return Timing(tuple(samples), "time.perf_counter, arguments restored before each call", 1, stopped, threads=threads)


def cpu_block_calls(block_seconds: Callable[[int], float]) -> int:
    """Calls per CPU sample: tenfold steps until `block_seconds(calls)` reaches CPU_BLOCK_S."""
    calls = 1
    while calls < CPU_MAX_BLOCK_CALLS and block_seconds(calls) < CPU_BLOCK_S:
        calls *= 10
    return calls


def time_callable(
    fn: Callable[[], object], device: str, options: TimingOptions, reset: Callable[[], None] | None = None
) -> Timing:
    return time_cuda(fn, options, reset=reset) if device == "cuda" else time_cpu(fn, options, reset=reset)


def _nothing() -> None:
    return None
