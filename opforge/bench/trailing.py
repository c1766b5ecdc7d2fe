"""Where an implementation is slower than a baseline timed in the same run, beyond that run's noise.

A point trails a baseline when its median time is above the baseline's by more than a tolerance and the bootstrap
interval of the ratio (implementation median / baseline median, opforge.bench.stats.ratio_of_medians: the
regression gate's statistic) lies wholly above 1 + tolerance, so neither contender's own samples explain it.
`opforge bench` lists every such point; `--fail-slower-than NAME` fails the ones that trail NAME, a CI gate that an
op keeps up with torch.compile (or eager) at every point it declares, but for the points its spec's `bench.slower`
declares slower, with the reason (listed, not failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opforge.bench.model import BASELINE, IMPLEMENTATION, BenchResult, BenchRun, Trail
from opforge.bench.stats import ratio_of_medians
from opforge.spec.model import BenchSlower

# Percent slower than a baseline that is not yet called slower. One run's bootstrap interval sees only that run's
# samples, not where in the run each contender was timed: back-to-back runs of the same code agreed within +-0.7%
# of their mean (bench fidelity, H200, docs/performance.md), so two equal kernels' medians can sit ~1.4% apart.
# With no tolerance the H100 run of 2026-12-07 called 35 native points slower, 21 of them by 0.1-1.4% at sizes where
# native and compile trade places from run to run; 2% leaves the 14 that outlast it (h100-gpu-round-2026-12-07d.txt).
DEFAULT_MAX_SLOWER_PCT = 2.0


def trailing(
    results: list[BenchResult],
    tolerance_pct: float = DEFAULT_MAX_SLOWER_PCT,
    declared: Mapping[str, tuple[BenchSlower, ...]] | None = None,
) -> list[Trail]:
    """Every (implementation point, baseline) where the implementation is slower beyond noise and tolerance, with the
    reason its op's spec gives where it declares that point slower (`declared`: op name -> its `bench.slower`)."""
    limit = 1 + tolerance_pct / 100
    baselines: dict[tuple[str, ...], list[BenchResult]] = {}
    for r in results:
        if r.role == BASELINE and r.timed:
            baselines.setdefault(r.case_key, []).append(r)
    trails = []
    for r in results:
        mine = r.median_s  # None when not timed
        if r.role != IMPLEMENTATION or mine is None:
            continue
        for b in baselines.get(r.case_key, []):
            theirs = b.median_s
            # The bootstrap costs up to a third of a second per pair: only where the medians already say slower.
            if theirs is None or mine <= limit * theirs:
                continue
            interval = ratio_of_medians(r.samples, b.samples)
            if interval.low > limit:
                reason = _declared_reason(r, b.contender, (declared or {}).get(r.op, ()))
                trails.append(Trail(r.id, b.contender, interval, tolerance_pct, reason))
    return trails


def fail_slower(
    run: BenchRun,
    names: tuple[str, ...],
    tolerance_pct: float,
    declared: Mapping[str, tuple[BenchSlower, ...]] | None = None,
) -> BenchRun:
    """`run` with its trails listed, each result that trails a baseline in `names` failed with the reason unless
    its op's spec declares that point slower (`declared`: op name -> its `bench.slower`), and the run failed for
    each of `names` that no point could be compared with (a gate that judged nothing must not pass); what the JUnit
    report and the exit code read."""
    trails = trailing(run.results, tolerance_pct, declared)
    reasons: dict[str, list[str]] = {}
    for t in trails:
        if t.baseline in names and not t.declared:
            reasons.setdefault(t.result, []).append(f"slower than {t.baseline}: {t.describe()}")
    results = [_failed(r, reasons[r.id]) if r.id in reasons else r for r in run.results]
    failures = [run.gate_failure] if run.gate_failure else []
    failures += [nothing_compared(name) for name in uncompared(run.results, names)]
    return replace(run, results=results, trailing=trails, gate_failure="; ".join(failures))


def _declared_reason(result: BenchResult, baseline: str, entries: tuple[BenchSlower, ...]) -> str:
    return next((e.reason for e in entries if e.covers(result.contender, baseline, result.point)), "")


def uncompared(results: list[BenchResult], names: tuple[str, ...]) -> list[str]:
    """The baselines in `names` that no implementation was timed beside, on any point."""
    implemented = {r.case_key for r in results if r.role == IMPLEMENTATION and r.timed}
    return [n for n in names if not any(r.contender == n and r.timed and r.case_key in implemented for r in results)]


def nothing_compared(name: str) -> str:
    return (
        f"--fail-slower-than {name}: expected points where an implementation and {name} were both timed, got none. "
        f"Time {name} too (--contender {name}), or leave the option out."
    )


def _failed(result: BenchResult, reasons: list[str]) -> BenchResult:
    why = "; ".join(([result.regression] if result.regression else []) + reasons)
    return replace(result, regression=why)
