"""What failed last time, for `opforge check --last-failed`: full result ids and the spec each came from, kept in
`.opforge/lastfailed.json` under the directory opforge runs in (like pytest's cache). Beside them, per spec, how many
results its last run gave and how many failed (`runs`), which `opforge scan --specs` shows. What a rerun selects from
them is opforge.run.last_failed's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.core.results import OpReport, RunReport
from opforge.engine.plan import LOAD_CHECK, Filters, load_result_id
from opforge.reporters.base import Reporter
from opforge.tools.scan import LastRun

STORE = Path(".opforge") / "lastfailed.json"


class LastFailedReport(Reporter):
    """Records the run's failures under `root` for the next `--last-failed` (always on)."""

    def __init__(self, root: Path, filters: Filters, fail_fast: bool):
        self.root = root
        self.filters = filters
        self.fail_fast = fail_fast

    def finish(self, run: RunReport) -> None:
        record(self.root, run, self.filters, self.fail_fast)


def recorded(root: Path) -> dict[str, str]:
    """Failed result id -> spec path. An unreadable store counts as empty: it only ever narrows a rerun."""
    failed = _store(root).get("failed")
    return {str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {}


def record(root: Path, run: RunReport, filters: Filters | None = None, fail_fast: bool = False) -> dict[str, str]:
    """Forget the ids that ran and did not fail, remember those that failed; returns what is now recorded.

    A recorded id that an op ran in full (see _ran_in_full) did not produce belongs to a renamed or removed op,
    case or check: it is forgotten, else --last-failed would "rerun" it forever, running nothing. So are the
    failures of specs that no longer exist."""
    failed = {ident: spec for ident, spec in recorded(root).items() if spec_exists(root, spec)}
    for op in run.ops:
        if _ran_in_full(run, op, filters, fail_fast):
            produced = {r.full_id for r in op.results}
            failed = {
                ident: spec
                for ident, spec in failed.items()
                if ident in produced or spec_key(root, Path(spec)) != spec_key(root, Path(op.spec_path))
            }
        if op.results and not any(r.check == LOAD_CHECK for r in op.results):
            failed.pop(load_result_id(op.op), None)
        for r in op.results:
            if r.status.failed:
                failed[r.full_id] = op.spec_path
            else:
                failed.pop(r.full_id, None)
    runs = {spec: counts for spec, counts in _recorded_runs(root).items() if spec_exists(root, spec)}
    for op in run.ops:
        runs[op.spec_path] = {"results": len(op.results), "failed": sum(r.status.failed for r in op.results)}
    data = {"failed": dict(sorted(failed.items())), "runs": dict(sorted(runs.items()))}
    write_atomically(root / STORE, json.dumps(data, indent=1) + "\n")
    return failed


def last_runs(root: Path) -> dict[Path, LastRun]:
    """Resolved spec path -> what its last recorded run gave. An unreadable store counts as empty."""
    return {
        spec_key(root, Path(spec)): LastRun(int(counts["results"]), int(counts["failed"]))
        for spec, counts in _recorded_runs(root).items()
    }


def _recorded_runs(root: Path) -> dict[str, dict[str, int]]:
    runs = _store(root).get("runs")
    if not isinstance(runs, dict):
        return {}
    return {
        str(spec): {"results": counts["results"], "failed": counts["failed"]}
        for spec, counts in runs.items()
        if isinstance(counts, dict) and isinstance(counts.get("results"), int) and isinstance(counts.get("failed"), int)
    }


def _store(root: Path) -> dict[str, Any]:
    """The store's JSON object; an unreadable or malformed store is an empty one."""
    try:
        data = json.loads((root / STORE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ran_in_full(run: RunReport, op: OpReport, filters: Filters | None, fail_fast: bool) -> bool:
    """Whether the op ran every result a recorded id of it could name: it loaded, nothing stopped it early, and no
    filter but --last-failed's own ids narrowed it (a --shard K/N run produced only its shard's ids: another
    shard's failures stay recorded)."""
    if filters is None or run.incomplete or (fail_fast and run.failed):
        return False
    if filters.dtypes or filters.devices or filters.checks or filters.keyword or filters.shard:
        return False
    return not any(r.check == LOAD_CHECK for r in op.results)


def spec_key(root: Path, path: Path) -> Path:
    """A spec path as the store compares it: resolved under `root`."""
    return (root / path).resolve()


def spec_exists(root: Path, spec: str) -> bool:
    """Whether a spec the store names is still there."""
    return (root / spec).is_file()
