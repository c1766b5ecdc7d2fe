"""opforge bench's arithmetic on synthetic samples: quantiles, the stopping rule, and the ratio's interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opforge.bench.stats import iqr, median, quantile, ratio_of_medians, relative_iqr
from opforge.bench.timing import (
    FIRST_BATCH,
    GRAPH_MAX_CALLS,
    MIN_FLUSH_BYTES,
    TimingOptions,
    flush_bytes_for,
    graph_calls_for,
    measure_until_stable,
    warm_up,
)


def noisy(median_s: float, spread: float, n: int = 60, seed: int = 0) -> list[float]:
    """n samples with a relative normal spread, scaled so that their median is exactly median_s."""
    rng = np.random.default_rng(seed)
    samples = 1 + spread * rng.standard_normal(n)
    return [float(s) for s in samples * median_s / np.median(samples)]


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("samples", [[3.0], [2.0, 1.0], [5.0, 1.0, 4.0, 2.0, 3.0], noisy(1.0, 0.3, 37)])
def test_quantile_matches_numpy(samples, q):
    assert quantile(samples, q) == pytest.approx(float(np.quantile(samples, q)))


def test_median_iqr_and_relative_iqr():
    samples = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert median(samples) == 3.0 and iqr(samples) == 2.0
    assert relative_iqr(samples) == pytest.approx(2 / 3)
    assert relative_iqr([1.0, 1.0, 1.0]) == math.inf  # too few samples to judge the noise
    with pytest.raises(ValueError):
        median([])


def test_identical_sample_sets_give_an_interval_around_one():
    old = noisy(1e-3, 0.02)
    interval = ratio_of_medians(list(old), old)
    assert interval.ratio == 1.0
    assert interval.low < 1.0 < interval.high < 1.05


def test_twenty_percent_slower_set_has_its_interval_above_the_threshold():
    interval = ratio_of_medians(noisy(1.2e-3, 0.02, seed=1), noisy(1e-3, 0.02, seed=2))
    assert interval.low > 1.05 and interval.ratio == pytest.approx(1.2)


def test_noisy_six_percent_slower_set_has_an_interval_that_includes_the_threshold():
    new, old = noisy(1.06e-3, 0.15, n=30, seed=3), noisy(1e-3, 0.15, n=30, seed=4)
    interval = ratio_of_medians(new, old)
    assert interval.ratio == pytest.approx(1.06)  # one median against the other would call this a regression ...
    assert interval.low < 1.05 < interval.high  # ... the samples say it is within noise


def test_interval_is_reproducible_and_stable_across_seeds():
    new, old = noisy(1.03e-3, 0.02, n=50, seed=5), noisy(1e-3, 0.02, n=50, seed=6)
    assert ratio_of_medians(new, old) == ratio_of_medians(new, old)
    lows = [ratio_of_medians(new, old, seed=s).low for s in range(5)]
    assert (max(lows) - min(lows)) / min(lows) < 0.005


def test_large_sample_sets_are_thinned_not_refused(monkeypatch):
    import numpy as np

    from opforge.bench import stats

    widths = []
    real_rng = np.random.default_rng

    class Recording:  # records the shape of each resampling draw: resamples x samples per set
        def __init__(self, seed) -> None:
            self.rng = real_rng(seed)

        def integers(self, low, high, size):
            widths.append(size[1])
            return self.rng.integers(low, high, size=size)

    big, small = noisy(1e-3, 0.02, n=20_000, seed=7), noisy(1e-3, 0.02, n=50, seed=8)
    monkeypatch.setattr(np.random, "default_rng", Recording)
    interval = ratio_of_medians(big, small)
    assert widths == [stats.MAX_BOOTSTRAP_SAMPLES, 50]
    assert interval.low <= interval.ratio <= interval.high


def test_the_ratio_is_of_the_samples_the_interval_resamples():
    # 20,000 samples whose thinned subset (every ~10th) is 2 ms and the rest 1 ms: the ratio must come from the
    # same thinned set as its interval, or it falls outside it.
    import numpy as np

    from opforge.bench.stats import MAX_BOOTSTRAP_SAMPLES

    kept = np.linspace(0, 19_999, MAX_BOOTSTRAP_SAMPLES).round().astype(int)
    new = np.full(20_000, 1e-3)
    new[kept] = 2e-3
    interval = ratio_of_medians(list(new), [1e-3] * 50)
    assert interval.low <= interval.ratio <= interval.high


# ------------------------------------------------------------------------------------------- the stopping rule


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batches_of(samples_for: callable, clock: FakeClock):
    """A run_batch that returns samples_for(i) for the i-th rep and advances the clock by their time."""
    calls = []

    def run_batch(n: int) -> list[float]:
        start = sum(calls)
        calls.append(n)
        out = [samples_for(start + i) for i in range(n)]
        clock.now += sum(out)
        return out

    return run_batch, calls


def test_quiet_op_stops_on_the_noise_target_after_the_minimums():
    clock = FakeClock()
    run_batch, calls = batches_of(lambda i: 1e-3 * (1 + 0.001 * (i % 3)), clock)
    options = TimingOptions(budget_s=10.0, noise_target=0.02, min_reps=25, min_time_s=0.05)
    samples, stopped = measure_until_stable(run_batch, options, clock)
    assert stopped == "noise"
    assert len(samples) >= 50 and sum(samples) >= 0.05  # min_time_s (50 x 1 ms) binds before min_reps
    assert calls[0] == FIRST_BATCH and calls == sorted(calls)  # batches grow


def test_noisy_op_stops_at_the_budget():
    clock = FakeClock()
    run_batch, _ = batches_of(lambda i: 1e-3 * (1 + (i % 2)), clock)  # 1 ms, 2 ms, 1 ms, ...: IQR/median ~ 0.67
    _, stopped = measure_until_stable(run_batch, TimingOptions(budget_s=0.5), clock)
    assert stopped == "budget"
    assert 0.5 <= clock.now < 0.6  # the last batch was sized to the time left


def test_minimum_time_is_clock_time_not_the_sum_of_samples():
    # A quiet 5 us op whose reps each spend 95 us more outside the sample (flush, spin): 0.1 s of clock time passes
    # after ~1,000 reps, while the samples' sum would need 20,000 (past max_reps).
    clock = FakeClock()
    samples_of = lambda i: 5e-6 * (1 + 0.001 * (i % 3))  # noqa: E731

    def run_batch(n: int) -> list[float]:
        clock.now += n * 100e-6
        return [samples_of(i) for i in range(n)]

    samples, stopped = measure_until_stable(run_batch, TimingOptions(budget_s=100.0, min_time_s=0.1), clock)
    assert stopped == "noise" and 1000 <= len(samples) < 2100


def test_max_reps_bounds_the_samples():
    clock = FakeClock()
    run_batch, _ = batches_of(lambda i: 1e-6 * (1 + (i % 2)), clock)
    samples, stopped = measure_until_stable(run_batch, TimingOptions(budget_s=100.0, max_reps=300), clock)
    assert stopped == "max_reps" and len(samples) == 300


def test_warm_up_is_time_based_with_a_minimum_of_calls():
    clock = FakeClock()
    calls = []

    def slow():  # a first call that compiles for 5 s, then 1 ms calls
        calls.append(1)
        clock.now += 5.0 if len(calls) == 1 else 1e-3

    assert warm_up(slow, 0.1, lambda: None, clock) == 3
    clock.now, calls[:] = 0.0, [1]
    assert warm_up(slow, 0.1, lambda: None, clock) in (100, 101)  # 0.1 s of 1 ms calls, give or take rounding


def test_flush_is_at_least_twice_l2_and_never_below_the_floor():
    assert flush_bytes_for(0) == MIN_FLUSH_BYTES
    assert flush_bytes_for(60 * 2**20) == MIN_FLUSH_BYTES  # H200: 2 x 60 MiB < 256 MiB
    assert flush_bytes_for(256 * 2**20) == 512 * 2**20


def test_graph_calls_amortize_launches_within_bounds():
    assert graph_calls_for(2e-6) == 500
    assert graph_calls_for(5e-3) == 1
    assert graph_calls_for(0.0) == GRAPH_MAX_CALLS
    assert graph_calls_for(1e-9) == GRAPH_MAX_CALLS


# ------------------------------------------------------------------------- the CUDA timer's order, with fakes


class FakeCuda:
    """Stands in for torch.cuda: logs every flush, event record, call and synchronization."""

    def __init__(self) -> None:
        self.log: list[str] = []
        fake = self

        class Event:
            count = 0

            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                Event.count += 1
                self.name = f"e{Event.count}"
                self.at = None

            def record(self) -> None:
                fake.log.append(f"record {self.name}")
                self.at = len(fake.log)

            def elapsed_time(self, end) -> float:
                return 0.5  # ms

        class Flush:
            nbytes = MIN_FLUSH_BYTES

            def __init__(self, device) -> None:
                pass

            def __call__(self) -> None:
                fake.log.append("flush")

        self.Event, self.Flush = Event, Flush

    def synchronize(self) -> None:
        self.log.append("sync")


def test_cuda_timer_flushes_before_every_rep_outside_the_events(monkeypatch):
    import torch

    from opforge.bench import timing

    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(timing, "L2Flush", fake.Flush)
    monkeypatch.setattr(timing, "spin", lambda seconds: fake.log.append(f"spin {seconds:g}"))
    monkeypatch.setattr(timing, "host_launch_seconds", lambda fn, sync: timing.LAUNCH_COVER_MIN_S)
    result = timing.time_cuda(lambda: fake.log.append("fn"), TimingOptions(warmup_s=0.0, budget_s=0.0, min_reps=4))
    assert result.samples == (0.5e-3,) * FIRST_BATCH and result.method == "cuda-events"
    assert result.flush_bytes == MIN_FLUSH_BYTES
    assert result.host_s == timing.LAUNCH_COVER_MIN_S
    assert result.launch_cover_s == timing.LAUNCH_COVER * timing.LAUNCH_COVER_MIN_S
    # Warm-up: flushed calls, each synchronized.
    assert fake.log[:9] == ["flush", "fn", "sync"] * 3
    timed = fake.log[9:]
    # Then per rep: flush, a spin covering the call's launch, start event, the call, end event; one synchronization
    # for the batch.
    starts = [f"e{i}" for i in range(1, FIRST_BATCH + 1)]
    ends = [f"e{i}" for i in range(FIRST_BATCH + 1, 2 * FIRST_BATCH + 1)]
    spin = f"spin {timing.LAUNCH_COVER * timing.LAUNCH_COVER_MIN_S:g}"
    expected = [step for s, e in zip(starts, ends) for step in ("flush", spin, f"record {s}", "fn", f"record {e}")]
    assert timed == expected + ["sync"]


def test_cuda_timer_restores_mutated_arguments_before_the_flush_of_every_rep(monkeypatch):
    import torch

    from opforge.bench import timing

    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(timing, "L2Flush", fake.Flush)
    monkeypatch.setattr(timing, "spin", lambda seconds: fake.log.append("spin"))
    monkeypatch.setattr(timing, "host_launch_seconds", lambda fn, sync: timing.LAUNCH_COVER_MIN_S)
    timing.time_cuda(
        lambda: fake.log.append("fn"),
        TimingOptions(warmup_s=0.0, budget_s=0.0, min_reps=4),
        reset=lambda: fake.log.append("reset"),
    )
    assert fake.log[:12] == ["reset", "flush", "fn", "sync"] * 3
    reps = [step for step in fake.log[12:] if not step.startswith("record")]
    assert reps == ["reset", "flush", "spin", "fn"] * FIRST_BATCH + ["sync"]


def test_cuda_graph_timing_refuses_an_op_whose_arguments_must_be_restored():
    from opforge.bench import timing

    with pytest.raises(ValueError, match="cannot be restored between them"):
        timing.time_cuda(lambda: None, TimingOptions(cuda_graph=True), reset=lambda: None)


def test_cpu_timer_restores_mutated_arguments_before_every_call():
    import torch

    from opforge.bench import timing

    x, seen = torch.ones(1), []

    def scale_in_place():
        seen.append(float(x))
        x.mul_(2)

    result = timing.time_cpu(
        scale_in_place, TimingOptions(warmup_s=0.01, budget_s=0.05, min_reps=5), reset=lambda: x.fill_(1)
    )
    assert len(result.samples) >= 5 and result.calls_per_sample == 1
    assert set(seen) == {1.0}  # without the reset: 1, 2, 4, ... up to inf


def test_launch_cost_is_the_median_host_time_of_calls_on_an_idle_gpu():
    from opforge.bench import timing

    log, now = [], [0.0]
    costs = iter([1e-3, 5e-3, 2e-3, 9e-3, 3e-3])

    def fn():
        log.append("fn")
        now[0] += next(costs)

    seconds = timing.host_launch_seconds(fn, lambda: log.append("sync"), clock=lambda: now[0])
    assert seconds == pytest.approx(3e-3)
    assert log == ["sync", "fn"] * timing.LAUNCH_PROBES + ["sync"]
