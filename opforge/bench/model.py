"""The result model of `opforge bench`: data only (opforge.reporters renders it and writes its JSON, CSV and plot).

The JSON form carries every raw sample so that a later run can be gated against it (opforge.bench.baseline).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from opforge.bench.stats import RatioInterval, iqr, median
from opforge.bench.timing import Timing
from opforge.core.results import CaseResult, Mismatch, OpReport, RunReport, Status, Verdict, case_result

BENCH_SCHEMA_VERSION = 2
IMPLEMENTATION, BASELINE = "implementation", "baseline"
# Bench's names for the statuses it uses (results.Status): timed; wrong (output differs from the reference: not
# timed); error (could not run); skip (its check could not apply here, e.g. not enough memory for the case: not
# timed, not a failure).
OK, WRONG, ERROR, SKIP = Status.PASS, Status.FAIL, Status.ERROR, Status.SKIP
# How the bench JSON, its CSV and its terminal spell them: the saved baselines of schema 2 say "ok" and "wrong".
_WORDS = {OK: "ok", WRONG: "wrong"}


def status_word(status: Status) -> str:
    return _WORDS.get(status, status.value)


def point_key(op: str, mode: str, dtype: str, device: str, case: str) -> str:
    """What `--shard` splits a benchmark by: a point, all of whose contenders run in one job (their speedups are
    over each other)."""
    return f"{op}[{mode}-{dtype}-{device}-{case}]"


@dataclass
class BenchResult:
    op: str
    contender: str
    role: str  # IMPLEMENTATION (the op, the spec's implementations) or BASELINE (eager, compile)
    device: str
    dtype: str
    mode: str  # fwd, bwd, fwd+bwd
    case: str  # the size point: "n=16777216" or "pred=4096x4096,target=4096"
    elements: int  # the largest tensor input's numel: the x axis of the plot
    status: Status
    bytes: int | None = None  # moved per call (spec expression or default count)
    message: str = ""
    mismatch: Mismatch | None = None
    timing: Timing | None = None
    peak_gbps: float | None = None
    # Why a gate failed this result, when one did: the regression gate (opforge.bench.baseline.gate) or
    # --fail-slower-than (opforge.bench.trailing.fail_slower).
    regression: str = ""

    @property
    def point(self) -> str:
        """The point as ids show it and `bench.slower` globs match it: mode-dtype-device-case."""
        return f"{self.mode}-{self.dtype}-{self.device}-{self.case}"

    @property
    def id(self) -> str:
        return f"{self.op}/{self.contender}[{self.point}]"

    @property
    def case_key(self) -> tuple[str, str, str, str, str]:
        """What contenders of the same case share (their speedups are over each other)."""
        return self.op, self.device, self.dtype, self.mode, self.case

    @property
    def samples(self) -> list[float]:
        return list(self.timing.samples) if self.timing is not None else []

    @property
    def timed(self) -> bool:
        return bool(self.samples)

    @property
    def median_s(self) -> float | None:
        return median(self.samples) if self.timed else None

    @property
    def iqr_s(self) -> float | None:
        return iqr(self.samples) if self.timed else None

    @property
    def gbps(self) -> float | None:
        m = self.median_s
        return self.bytes / m / 1e9 if m and self.bytes is not None else None

    @property
    def pct_of_peak(self) -> float | None:
        g = self.gbps
        return 100 * g / self.peak_gbps if g is not None and self.peak_gbps else None

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("timing", "mismatch")}
        data.update(
            status=status_word(self.status),
            id=self.id,
            median_s=self.median_s,
            iqr_s=self.iqr_s,
            gbps=self.gbps,
            pct_of_peak=self.pct_of_peak,
            mismatch=asdict(self.mismatch) if self.mismatch else None,
        )
        data["timing"] = None if self.timing is None else {**asdict(self.timing), "samples": list(self.timing.samples)}
        return data


def speedups(result: BenchResult, results: list[BenchResult]) -> dict[str, float]:
    """Baseline name -> baseline median / this median, over the baselines timed on the same case."""
    mine = result.median_s
    if not mine:
        return {}
    ratios = {}
    for b in results:
        theirs = b.median_s
        if b.role == BASELINE and b.case_key == result.case_key and theirs is not None and b is not result:
            ratios[b.contender] = theirs / mine
    return ratios


@dataclass(frozen=True)
class Trail:
    """One implementation's point slower than one baseline's, beyond the noise (opforge.bench.trailing)."""

    result: str  # the implementation's result id
    baseline: str  # the baseline contender: eager, compile
    interval: RatioInterval  # implementation median / baseline median
    tolerance_pct: float
    declared: str = ""  # the spec's reason when its `bench.slower` covers the point: listed, never failed

    def describe(self) -> str:
        i = self.interval
        return (
            f"{i.ratio:.3f}x the time of {self.baseline}, its {round(100 * i.confidence)}% interval "
            f"[{i.low:.3f}, {i.high:.3f}] above {1 + self.tolerance_pct / 100:.3g}"
        )

    def to_json(self) -> dict[str, Any]:
        i = self.interval
        return {
            "result": self.result,
            "baseline": self.baseline,
            "ratio": i.ratio,
            "low": i.low,
            "high": i.high,
            "confidence": i.confidence,
            "tolerance_pct": self.tolerance_pct,
            "declared": self.declared,
        }


@dataclass
class BenchRun:
    environment: dict[str, Any]
    options: dict[str, Any]
    results: list[BenchResult] = field(default_factory=list)
    peaks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Device (no GPU here) or op (its inputs cannot take the sizes asked for) -> why it was not benchmarked.
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    # Why a gate failed the run as a whole (the regression gate or --fail-slower-than compared nothing), when one did.
    gate_failure: str = ""
    # The implementations' points slower than a baseline beyond the noise (opforge.bench.trailing).
    trailing: list[Trail] = field(default_factory=list)

    @property
    def nothing_timed(self) -> bool:
        """A run that timed nothing proves nothing: never a pass (exit 5), whatever the reason."""
        return not any(r.timed for r in self.results)

    @property
    def failed(self) -> bool:
        """A WRONG or ERROR result, one a gate failed, or a gate that compared nothing."""
        return any(r.status.failed or r.regression for r in self.results) or bool(self.gate_failure)

    def ops(self) -> list[str]:
        return list(dict.fromkeys(r.op for r in self.results))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": BENCH_SCHEMA_VERSION,
            "tool": "opforge",
            "kind": "bench",
            "environment": self.environment,
            "options": self.options,
            "peaks": self.peaks,
            "skipped": self.skipped,
            "seconds": self.seconds,
            "results": [r.to_json() for r in self.results],
            "trailing": [t.to_json() for t in self.trailing],
        }

    def run_report(self) -> RunReport:
        """The run as results (an op's per contender and case, `bench` their check), for the JUnit and Markdown
        reports: a WRONG or ERROR result, and one the regression gate failed, fails; a gate that compared nothing
        is a failed result of its own."""
        ops = [OpReport(op, "", [_case_result(r) for r in self.results if r.op == op]) for op in self.ops()]
        if self.gate_failure:
            gate = case_result(
                "baseline", "-", "regression_gate", "-", "-", "-", Verdict(Status.FAIL, self.gate_failure)
            )
            ops.append(OpReport("baseline", "", [gate]))
        notes = [f"{device} not benchmarked: {why}" for device, why in self.skipped.items()]
        return RunReport(self.environment, ops, seconds=self.seconds, notes=notes)


def _case_result(r: BenchResult) -> CaseResult:
    verdict = Verdict(Status.FAIL, r.regression) if r.regression else Verdict(r.status, r.message, r.mismatch)
    case_id = f"{r.mode}-{r.dtype}-{r.device}-{r.case}"
    return case_result(r.op, r.contender, "bench", case_id, r.dtype, r.device, verdict, seconds=sum(r.samples))
