"""Joining the JSON reports of one run's shards (`--shard K/N` jobs of a CI matrix), or of jobs on different
machines (a CPU job and a GPU job), into one report: `opforge merge-reports`.

A set of shards must be whole: a missing shard (a job that died before writing its report) would leave its results
out of the merged report without a trace, and a merge that passes results nobody ran is what a gate must never do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opforge.core.errors import UsageError
from opforge.core.results import READABLE_SCHEMA_VERSIONS, CaseResult, OpReport, RunReport, run_from_json
from opforge.core.shard import Shard, shard_of_text

CHECK, BENCH = "check", "bench"


@dataclass(frozen=True)
class Report:
    path: Path
    kind: str  # CHECK or BENCH
    data: dict[str, Any]

    @property
    def shard(self) -> Shard | None:
        text = self.data.get("shard") if self.kind == CHECK else self.data.get("options", {}).get("shard")
        return shard_of_text(text if isinstance(text, str) else None)


def read_report(path: Path) -> Report:
    what = f"merge-reports {path}"
    hint = "Pass files written by `opforge check --json`, `opforge fuzz --json` or `opforge bench --json`."
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(what, "a readable file", exc.strerror or str(exc), hint) from None
    except ValueError as exc:
        raise UsageError(what, "JSON", f"invalid JSON ({exc})", hint) from None
    if not isinstance(data, dict) or data.get("tool") != "opforge":
        raise UsageError(what, "an opforge JSON report", "another kind of file", hint)
    kind = BENCH if data.get("kind") == "bench" else CHECK
    if kind == CHECK and data.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise UsageError(
            what,
            f"report schema version {' or '.join(map(str, READABLE_SCHEMA_VERSIONS))}",
            repr(data.get("schema_version")),
            "Merge reports written by this opforge version.",
        )
    return Report(Path(path), kind, data)


def check_kinds_and_shards(reports: Sequence[Report]) -> str:
    """The reports' one kind; raises unless every set of shards (by N) has each of its K = 1..N exactly once."""
    kinds = {r.kind for r in reports}
    if len(kinds) > 1:
        raise UsageError(
            "merge-reports",
            "reports of one kind",
            "both `check` and `bench` reports",
            "Merge the check reports and the bench reports separately.",
        )
    by_count: dict[int, list[int]] = {}
    for report in reports:
        if report.shard is not None:
            index, count = report.shard
            by_count.setdefault(count, []).append(index)
    for count, indices in sorted(by_count.items()):
        have = sorted(indices)
        if have != list(range(1, count + 1)):
            missing = sorted(set(range(1, count + 1)) - set(have))
            doubled = sorted({i for i in have if have.count(i) > 1})
            problems = []
            if missing:
                problems.append("missing " + ", ".join(f"{i}/{count}" for i in missing))
            if doubled:
                problems.append("twice " + ", ".join(f"{i}/{count}" for i in doubled))
            got = ", ".join(problems)
            raise UsageError(
                "merge-reports",
                f"each of the shards 1/{count} .. {count}/{count} once",
                got,
                "Pass every shard's report once; a job that ended without one must be rerun, or its tasks never ran.",
            )
    return kinds.pop()


def merge_check_reports(reports: Sequence[Report]) -> RunReport:
    """One RunReport: each op's results from every report. A result two reports both hold (a load error every shard
    reports, a CPU result a CPU and a GPU job both ran) appears once, the failing version if either failed."""
    runs = [run_from_json(r.data) for r in reports]
    merged = RunReport(
        environment=runs[0].environment,
        seed=runs[0].seed,
        seconds=max(run.seconds for run in runs),  # the jobs ran side by side
        incomplete=any(run.incomplete for run in runs),
        notes=list(dict.fromkeys(note for run in runs for note in run.notes)),
    )
    seeds = sorted({run.seed for run in runs})
    if len(seeds) > 1:
        merged.notes.append(f"the reports were run with different seeds ({', '.join(map(str, seeds))})")
    ops: dict[str, OpReport] = {}
    results: dict[str, dict[str, CaseResult]] = {}
    for run in runs:
        for op in run.ops:
            mine = ops.setdefault(op.op, OpReport(op=op.op, spec_path=op.spec_path, build=op.build))
            mine.seconds += op.seconds
            if op.load_exit_code is not None:
                mine.load_exit_code = max(mine.load_exit_code or 0, op.load_exit_code)
            seen = results.setdefault(op.op, {})
            for result in op.results:
                earlier = seen.get(result.full_id)
                if earlier is None or (result.status.failed and not earlier.status.failed):
                    seen[result.full_id] = result
    for name, op in ops.items():
        op.results = list(results[name].values())
        merged.ops.append(op)
    return merged


def merge_bench_reports(reports: Sequence[Report]) -> dict[str, Any]:
    """One bench JSON: every report's results (one per id), peaks and skipped devices; the first report's
    environment and options, without its shard."""
    first = reports[0].data
    results: dict[str, dict[str, Any]] = {}
    for report in reports:
        for result in report.data.get("results", []):
            results.setdefault(result["id"], result)
    options = {k: v for k, v in first.get("options", {}).items() if k != "shard"}
    return {
        **first,
        "options": options,
        "peaks": {k: v for r in reports for k, v in r.data.get("peaks", {}).items()},
        "skipped": {k: v for r in reports for k, v in r.data.get("skipped", {}).items()},
        "seconds": max(r.data.get("seconds", 0.0) for r in reports),
        "results": list(results.values()),
        # A shard holds every contender of its points, so each point slower than a baseline is in one shard's list.
        "trailing": [t for r in reports for t in r.data.get("trailing", [])],
    }
