"""The regression gate: this run against a saved `--json` run, case by case, from the raw samples.

For each case timed in both runs, a bootstrap confidence interval of new median / old median
(opforge.bench.stats.ratio_of_medians). A case regresses when the whole interval lies above 1 + threshold: slower
by more than the threshold beyond what the two runs' own noise explains. Only implementations gate; the baselines
(eager, compile) are compared for information, since their change is the environment's, not the op's. A case timed
differently in the two runs (timing method, which includes --cuda-graph; L2 flush size; CPU threads) is listed,
not compared. A gate that compared no case at all fails: it cannot vouch for anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opforge.bench import environment
from opforge.bench.model import BASELINE, BENCH_SCHEMA_VERSION, OK, BenchRun, point_key, status_word
from opforge.bench.stats import RatioInterval, ratio_of_medians
from opforge.bench.timing import Timing
from opforge.core.errors import UsageError
from opforge.core.shard import owns, shard_of_text

REGRESSION, FASTER, SAME = "regression", "faster", "same"
# Timing fields whose difference makes two samples of a case incomparable, whatever the environment.
TIMING_FIELDS = ("method", "flush_bytes", "threads")


@dataclass(frozen=True)
class CaseComparison:
    id: str
    role: str
    old_median_s: float
    new_median_s: float
    interval: RatioInterval
    verdict: str

    @property
    def gated(self) -> bool:
        return self.role != BASELINE


@dataclass
class Comparison:
    baseline_path: str
    threshold_pct: float
    compared: list[CaseComparison] = field(default_factory=list)
    environment_differences: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    only_old: list[str] = field(default_factory=list)
    # (id, ["field: old -> new", ...]) of each case timed in both runs but not in the same way: not compared.
    incomparable: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def regressions(self) -> list[CaseComparison]:
        return [r for r in self.compared if r.gated and r.verdict == REGRESSION]

    @property
    def nothing_compared(self) -> bool:
        return not self.compared

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or self.nothing_compared


def load_baseline(path: Path) -> dict[str, Any]:
    what = f"--baseline {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(
            what, "a readable file", exc.strerror or str(exc), "Pass the --json of an earlier run."
        ) from None
    except ValueError as exc:
        raise UsageError(what, "JSON", f"invalid JSON ({exc})", "Pass the --json of an earlier run.") from None
    if not isinstance(data, dict) or data.get("kind") != "bench" or not isinstance(data.get("results"), list):
        raise UsageError(
            what,
            "the --json of an `opforge bench` run",
            "another kind of file",
            "Pass a file written by `opforge bench ... --json`.",
        )
    if data.get("schema_version") != BENCH_SCHEMA_VERSION:
        raise UsageError(
            what,
            f"bench schema version {BENCH_SCHEMA_VERSION}",
            repr(data.get("schema_version")),
            "Record the baseline again with this opforge version.",
        )
    return data


def compare(run: BenchRun, baseline: dict[str, Any], threshold_pct: float, path: str = "") -> Comparison:
    # A --shard run is gated on its own points: the baseline's others are another job's, not cases left out.
    shard = shard_of_text(run.options.get("shard"))
    old = {
        r["id"]: r
        for r in baseline["results"]
        if r.get("status") == status_word(OK)
        and _samples(r)
        and owns(shard, point_key(r["op"], r["mode"], r["dtype"], r["device"], r["case"]))
    }
    comparison = Comparison(
        path,
        threshold_pct,
        environment_differences=environment.differences(baseline.get("environment", {}), run.environment),
    )
    limit = 1 + threshold_pct / 100
    seen = set()
    for result in run.results:
        new_median = result.median_s
        if result.timing is None or new_median is None:
            continue
        seen.add(result.id)
        previous = old.get(result.id)
        if previous is None:
            comparison.only_new.append(result.id)
            continue
        differences = timing_differences(previous, result.timing)
        if differences:
            comparison.incomparable.append((result.id, differences))
            continue
        interval = ratio_of_medians(result.samples, _samples(previous))
        verdict = REGRESSION if interval.low > limit else FASTER if interval.high < 1 / limit else SAME
        comparison.compared.append(
            CaseComparison(result.id, result.role, previous["median_s"], new_median, interval, verdict)
        )
    comparison.only_old = [i for i in old if i not in seen]
    return comparison


def gate(run: BenchRun, comparison: Comparison) -> BenchRun:
    """`run` with the gate's verdicts in it: each gated regression's result failed, and the run failed when the gate
    compared nothing (what the JUnit report and the exit code read)."""
    regressed = {r.id: _regression(r, comparison) for r in comparison.regressions}
    results = [replace(r, regression=regressed[r.id]) if r.id in regressed else r for r in run.results]
    nothing = f"nothing compared with the baseline {comparison.baseline_path}" if comparison.nothing_compared else ""
    return replace(run, results=results, gate_failure=nothing)


def _regression(case: CaseComparison, comparison: Comparison) -> str:
    interval = case.interval
    return (
        f"regression: new/old median {interval.ratio:.3f} ({format_seconds(case.old_median_s)} -> "
        f"{format_seconds(case.new_median_s)}), its {round(100 * interval.confidence)}% confidence interval "
        f"[{interval.low:.3f}, {interval.high:.3f}] above {1 + comparison.threshold_pct / 100:.3g} "
        f"(--max-regression {comparison.threshold_pct:g}%, against {comparison.baseline_path})"
    )


def timing_differences(old: dict[str, Any], new: Timing) -> list[str]:
    """`field: old -> new` for each TIMING_FIELDS entry that differs between a saved result and a new timing."""
    saved = old.get("timing") or {}
    return [
        f"{name}: {saved.get(name)!r} -> {getattr(new, name)!r}"
        for name in TIMING_FIELDS
        if saved.get(name) != getattr(new, name)
    ]


def _samples(result: dict[str, Any]) -> list[float]:
    timing = result.get("timing") or {}
    return [float(s) for s in timing.get("samples") or []]


def markdown(comparison: Comparison) -> str:
    """A summary for a CI job summary ($GITHUB_STEP_SUMMARY): verdict, environment warnings, then every case."""
    n = len(comparison.regressions)
    ci = f"{round(100 * comparison.compared[0].interval.confidence)}%" if comparison.compared else "95%"
    title = (
        f"❌ {n} regression{'s' if n != 1 else ''}"
        if n
        else "❌ nothing compared"
        if comparison.nothing_compared
        else "✅ no regression"
    )
    lines = [
        f"### opforge bench: {title}",
        "",
        f"Against `{comparison.baseline_path}`; a case regresses when the {ci} confidence interval of "
        f"new/old median lies entirely above {1 + comparison.threshold_pct / 100:.3g} "
        f"(--max-regression {comparison.threshold_pct:g}%).",
        "",
    ]
    if comparison.environment_differences:
        lines += ["> **Warning: the environments differ**; timings may not be comparable:", ">"]
        lines += [f"> - {d}" for d in comparison.environment_differences] + [""]
    if comparison.incomparable:
        lines += ["> **Warning: timed differently from the baseline** (not compared, not gated):", ">"]
        lines += [f"> - `{i}`: {'; '.join(d)}" for i, d in comparison.incomparable] + [""]
    if comparison.nothing_compared:
        lines += ["> **No case of this run could be compared with the baseline: the gate fails.**", ""]
    lines += ["| case | old | new | new/old | CI | verdict |", "|---|---:|---:|---:|---|---|"]
    for r in sorted(comparison.compared, key=lambda r: (r.verdict != REGRESSION, r.id)):
        verdict = r.verdict if r.gated else f"{r.verdict} (baseline, not gated)"
        if r.verdict == REGRESSION and r.gated:
            verdict = f"**{verdict}**"
        lines.append(
            f"| `{r.id}` | {format_seconds(r.old_median_s)} | {format_seconds(r.new_median_s)} | "
            f"{r.interval.ratio:.3f} | [{r.interval.low:.3f}, {r.interval.high:.3f}] | {verdict} |"
        )
    if comparison.only_new:
        lines += ["", f"{len(comparison.only_new)} case(s) not in the baseline (not gated)."]
    if comparison.only_old:
        lines += [
            "",
            f"{len(comparison.only_old)} case(s) of the baseline not run this time: "
            + ", ".join(f"`{i}`" for i in comparison.only_old)
            + ".",
        ]
    return "\n".join(lines) + "\n"


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
