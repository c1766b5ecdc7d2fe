"""The result model: what a run found, as data. Rendering lives in opforge.reporters; nothing here prints.

One status vocabulary (Status) and one verdict type (Verdict) for `opforge check`'s results, `opforge fuzz`'s
examples and failures and `opforge bench`'s timings; one CaseResult per (implementation, check, case), made only by
case_result. The JSON form is versioned (JSON_SCHEMA_VERSION); add fields freely, bump the version when one changes
meaning or goes away (docs/ci.md lists the versions).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from opforge.core.shard import Shard, shard_of_text, shard_text

# 3: the statuses reject and discard (fuzz's) joined the vocabulary, so every report's counts name them; the
# reports of `opforge fuzz --json` carry their results in this form too.
JSON_SCHEMA_VERSION = 3
# What `opforge merge-reports` reads: a version-2 report's statuses are a subset of version 3's.
READABLE_SCHEMA_VERSIONS = (2, 3)


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the check could not run: the reference raised, the inputs could not be made
    SKIP = "skip"
    XFAIL = "xfail"
    XPASS = "xpass"  # declared xfail but passed: the spec is stale, so the run fails
    CRASH = "crash"  # the process running the check died (a signal, an abort, an exit)
    TIMEOUT = "timeout"  # the check ran past its time limit and was killed
    # A fuzz example that judged nothing: the op refused a call its reference took (a narrower domain), or nothing
    # could judge it (outside the reference's domain, too costly, beyond the dtype: Verdict.cause says which).
    REJECT = "reject"
    DISCARD = "discard"

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR, Status.XPASS, Status.CRASH, Status.TIMEOUT)

    @property
    def unfinished(self) -> bool:
        """The check never produced a verdict: JUnit calls these errors."""
        return self in (Status.ERROR, Status.CRASH, Status.TIMEOUT)


@dataclass(frozen=True)
class Mismatch:
    """The worst element of a comparison: the one furthest beyond atol + rtol * |expected|."""

    output: str
    index: tuple[int, ...]
    # Complex for a complex output.
    got: float | complex
    expected: float | complex
    abs_error: float
    rel_error: float
    atol: float
    rtol: float
    mismatched: int
    total: int
    # When the op was also measured against the reference computed in the case's dtype (the low-precision rule):
    # the RMS errors of the op and of that baseline against the float64 reference, and what the op was allowed.
    rms_error: float | None = None
    baseline_rms_error: float | None = None
    allowed_rms_error: float | None = None
    baseline: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What one check on one case, one fuzz example or one bench timing says: its status and why.

    `detail`: what a pass adds for `-v` (outcomes.PassDetail). `oracle`: of a fuzz verdict, which oracle judged it
    ("crash" and "hang" when the op's process died or stalled). `cause`: of a fuzz failure, what went wrong (the kind
    of mismatch and the special value it needs), which tells distinct failures apart; of a discard, why nothing
    judged the example."""

    status: Status
    message: str = ""
    mismatch: Mismatch | None = None
    detail: str = ""
    oracle: str = ""
    cause: str = ""


@dataclass(frozen=True)
class CaseResult:
    op: str
    implementation: str
    check: str
    case_id: str
    dtype: str
    device: str
    status: Status
    seconds: float = 0.0
    message: str = ""
    mismatch: Mismatch | None = None
    seed: int | None = None
    repro: str | None = None
    # Distinct warnings raised while the case ran (a missing autograd kernel, a deprecated API): often the clue.
    warnings: tuple[str, ...] = ()
    # What a pass adds for `-v` (outcomes.PassDetail).
    detail: str = ""

    @property
    def full_id(self) -> str:
        return result_id(self.op, self.implementation, self.check, self.case_id)


def case_result(
    op: str,
    implementation: str,
    check: str,
    case_id: str,
    dtype: str,
    device: str,
    verdict: Verdict,
    *,
    seconds: float = 0.0,
    seed: int | None = None,
    repro: str | None = None,
    warnings: tuple[str, ...] = (),
) -> CaseResult:
    """The one place a result is made: where it ran, its verdict, and what reruns it."""
    return CaseResult(
        op=op,
        implementation=implementation,
        check=check,
        case_id=case_id,
        dtype=dtype,
        device=device,
        status=verdict.status,
        seconds=seconds,
        message=verdict.message,
        mismatch=verdict.mismatch,
        seed=seed,
        repro=repro,
        warnings=warnings,
        detail=verdict.detail,
    )


def result_from_json(data: dict[str, Any]) -> CaseResult:
    """The inverse of the JSON form of a result (what an isolated worker sends and a report stores)."""
    mismatch = mismatch_from_json(data["mismatch"]) if data.get("mismatch") else None
    verdict = Verdict(Status(data["status"]), data.get("message", ""), mismatch, data.get("detail", ""))
    return case_result(
        data["op"],
        data["implementation"],
        data["check"],
        data["case_id"],
        data["dtype"],
        data["device"],
        verdict,
        seconds=data.get("seconds", 0.0),
        seed=data.get("seed"),
        repro=data.get("repro"),
        warnings=tuple(data.get("warnings", ())),
    )


def mismatch_from_json(data: dict[str, Any]) -> Mismatch:
    mismatch = {k: _float(v) if k in _MISMATCH_FLOATS else v for k, v in data.items()}
    return Mismatch(**{**mismatch, "index": tuple(mismatch["index"])})


_MISMATCH_FLOATS = (
    "got",
    "expected",
    "abs_error",
    "rel_error",
    "atol",
    "rtol",
    "rms_error",
    "baseline_rms_error",
    "allowed_rms_error",
)
# Strict JSON has no NaN or infinity; reports spell them as these strings (what float() reads back).
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _float(value: Any) -> Any:
    """A mismatch's number as JSON holds it: a non-finite float as one of those strings, a complex one (a complex
    output's element, which JSON has no form for) as its str, "(1+2j)", which complex() reads back."""
    if not isinstance(value, str):
        return value
    return _NON_FINITE[value] if value in _NON_FINITE else complex(value)


def strict_json(data: Any) -> Any:
    """`data` with every non-finite float as a string ("nan", "inf", "-inf"): a NaN in a mismatch (an op that
    swallows NaN) must not make a report that strict JSON readers (jq, JavaScript, Go) reject."""
    if isinstance(data, float) and not math.isfinite(data):
        return "nan" if math.isnan(data) else ("inf" if data > 0 else "-inf")
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json(v) for v in data]
    return data


def dumps_json(data: Any, indent: int = 2) -> str:
    """Strict JSON text of a report (non-finite floats as strings, other objects such as paths as str)."""
    return json.dumps(strict_json(data), indent=indent, allow_nan=False, default=str) + "\n"


def result_id(op: str, implementation: str, check: str, case_id: str) -> str:
    """`op/implementation::check[case]`: what -k matches and what the repro command selects."""
    return f"{op}/{implementation}::{check}[{case_id}]"


@dataclass
class OpReport:
    op: str
    spec_path: str
    results: list[CaseResult] = field(default_factory=list)
    build: dict[str, Any] | None = None
    seconds: float = 0.0
    # The exit code of the spec or build error that kept the op from loading (its load result says why), if any.
    load_exit_code: int | None = None

    @property
    def failed(self) -> bool:
        return any(r.status.failed for r in self.results)

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for r in self.results:
            counts[r.status.value] += 1
        return counts


@dataclass
class RunReport:
    environment: dict[str, Any]
    ops: list[OpReport] = field(default_factory=list)
    seed: int = 0
    seconds: float = 0.0
    incomplete: bool = False
    # What a reader of the results must know about the run itself (e.g. a check that cannot run as configured).
    notes: list[str] = field(default_factory=list)
    # --shard K/N: this run holds the K-th of N shares of the tasks (opforge merge-reports joins them).
    shard: Shard | None = None

    @property
    def failed(self) -> bool:
        return any(op.failed for op in self.ops)

    @property
    def nothing_ran(self) -> bool:
        """No check gave a verdict: every result a skip, or none at all."""
        return all(r.status == Status.SKIP for r in self.results())

    def results(self) -> list[CaseResult]:
        return [r for op in self.ops for r in op.results]

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for r in self.results():
            counts[r.status.value] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "tool": "opforge",
            "environment": self.environment,
            "seed": self.seed,
            "seconds": self.seconds,
            "incomplete": self.incomplete,
            "notes": self.notes,
            "shard": shard_text(self.shard),
            "counts": self.counts(),
            "ops": [
                {
                    "op": op.op,
                    "spec": op.spec_path,
                    "seconds": op.seconds,
                    "build": op.build,
                    "load_exit_code": op.load_exit_code,
                    "counts": op.counts(),
                    "results": [result_json(r) for r in op.results],
                }
                for op in self.ops
            ],
        }


def run_from_json(data: dict[str, Any]) -> RunReport:
    """The inverse of RunReport.to_json (what `opforge merge-reports` reads)."""
    return RunReport(
        environment=data.get("environment", {}),
        ops=[
            OpReport(
                op=op["op"],
                spec_path=op["spec"],
                results=[result_from_json(r) for r in op["results"]],
                build=op.get("build"),
                seconds=op.get("seconds", 0.0),
                load_exit_code=op.get("load_exit_code"),
            )
            for op in data["ops"]
        ],
        seed=data.get("seed", 0),
        seconds=data.get("seconds", 0.0),
        incomplete=data.get("incomplete", False),
        notes=list(data.get("notes", [])),
        shard=shard_of_text(data.get("shard")),
    )


def result_json(r: CaseResult) -> dict[str, Any]:
    data = asdict(r)
    data["status"] = r.status.value
    data["id"] = r.full_id
    return data


def failure_details(r: CaseResult) -> list[tuple[str, str]]:
    """What to show of a failed result, in order, as (kind, text) with kind one of message, mismatch, seed, repro,
    warning. The one account of a failure: the terminal, JUnit/pytest and the Markdown summary each render it."""
    details = [("message", r.message)] if r.message else []
    if r.mismatch:
        details.append(("mismatch", describe_mismatch(r.mismatch)))
    if r.seed is not None:
        details.append(("seed", f"seed: {r.seed}"))
    if r.repro:
        details.append(("repro", r.repro))
    details += [("warning", w) for w in r.warnings]
    return details


def failure_text(r: CaseResult) -> str:
    """Plain-text account of a result: message, worst mismatch, seed and repro. Shared by JUnit and pytest."""
    prefix = {"repro": "repro: ", "warning": "warning: "}
    return "\n".join(prefix.get(kind, "") + text for kind, text in failure_details(r))


def describe_mismatch(m: Mismatch) -> str:
    index = ", ".join(map(str, m.index))
    text = (
        f"worst mismatch in {m.output} at [{index}]: got {m.got!r}, expected {m.expected!r} "
        f"(abs error {m.abs_error:.3g}, rel error {m.rel_error:.3g}; atol {m.atol:g}, rtol {m.rtol:g}; "
        f"{m.mismatched} of {m.total} elements outside tolerance)"
    )
    if m.rms_error is not None and m.baseline is not None:
        text += (
            f"; RMS error {m.rms_error:.3g} against {m.baseline}'s {m.baseline_rms_error:.3g} "
            f"(allowed {m.allowed_rms_error:.3g})"
        )
    return text
