"""What failed last time, for `opforge check --last-failed`: full result ids and the spec each came from, kept in
`.opforge/lastfailed.json` under the directory opforge runs in (like pytest's cache). Beside them, per spec, how many
results its last run gave and how many failed (`runs`), which `opforge scan --specs` shows.

The selection policy is pytest's: rerun the recorded failures of the selected specs; when none of them has any
recorded, run everything selected (saying so) rather than nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from opforge.core.files import write_atomically
from opforge.core.results import OpReport, RunReport
from opforge.engine.plan import LOAD_CHECK, Filters, load_result_id
from opforge.reporters.base import Reporter
from opforge.tools.scan import LastRun

STORE = Path(".opforge") / "lastfailed.json"


@dataclass(frozen=True)
class Selection:
    """What --last-failed runs: `ids` narrows the results (empty: all of them) of the specs in `paths` (None: the
    specs the caller selected). `notes` say what was decided and why."""

    ids: tuple[str, ...] = ()
    paths: list[Path] | None = None
    notes: list[str] = field(default_factory=list)


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
    try:
        data = json.loads((root / STORE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    failed = data.get("failed") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {}


def select(root: Path, selected: list[Path] | None) -> Selection:
    """The --last-failed selection, given the spec paths named on the command line (None when none were)."""
    failed = recorded(root)
    gone = sorted({spec for spec in failed.values() if not _exists(root, spec)})
    notes = [
        f"--last-failed: {spec} no longer exists; its recorded failures are skipped (and forgotten after this "
        f"run; delete {STORE} to forget them now)"
        for spec in gone
    ]
    failed = {ident: spec for ident, spec in failed.items() if spec not in gone}
    what = ""
    if selected is not None and failed:
        wanted = {_key(root, p) for p in selected}
        failed = {ident: spec for ident, spec in failed.items() if _key(root, Path(spec)) in wanted}
        what = " for the selected specs"
    if not failed:
        return Selection(notes=notes + [f"--last-failed: no failures recorded{what}, running everything selected"])
    paths = None if selected is not None else [Path(p) for p in dict.fromkeys(failed.values())]
    return Selection(
        ids=tuple(failed), paths=paths, notes=notes + [f"--last-failed: rerunning {len(failed)} failed results"]
    )


def record(root: Path, run: RunReport, filters: Filters | None = None, fail_fast: bool = False) -> dict[str, str]:
    """Forget the ids that ran and did not fail, remember those that failed; returns what is now recorded.

    A recorded id that an op ran in full (see _ran_in_full) did not produce belongs to a renamed or removed op,
    case or check: it is forgotten, else --last-failed would "rerun" it forever, running nothing. So are the
    failures of specs that no longer exist."""
    failed = {ident: spec for ident, spec in recorded(root).items() if _exists(root, spec)}
    for op in run.ops:
        if _ran_in_full(run, op, filters, fail_fast):
            produced = {r.full_id for r in op.results}
            failed = {
                ident: spec
                for ident, spec in failed.items()
                if ident in produced or _key(root, Path(spec)) != _key(root, Path(op.spec_path))
            }
        if op.results and not any(r.check == LOAD_CHECK for r in op.results):
            failed.pop(load_result_id(op.op), None)
        for r in op.results:
            if r.status.failed:
                failed[r.full_id] = op.spec_path
            else:
                failed.pop(r.full_id, None)
    runs = {spec: counts for spec, counts in _recorded_runs(root).items() if _exists(root, spec)}
    for op in run.ops:
        runs[op.spec_path] = {"results": len(op.results), "failed": sum(r.status.failed for r in op.results)}
    data = {"failed": dict(sorted(failed.items())), "runs": dict(sorted(runs.items()))}
    write_atomically(root / STORE, json.dumps(data, indent=1) + "\n")
    return failed


def last_runs(root: Path) -> dict[Path, LastRun]:
    """Resolved spec path -> what its last recorded run gave. An unreadable store counts as empty."""
    return {
        _key(root, Path(spec)): LastRun(int(counts["results"]), int(counts["failed"]))
        for spec, counts in _recorded_runs(root).items()
    }


def _recorded_runs(root: Path) -> dict[str, dict[str, int]]:
    try:
        data = json.loads((root / STORE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict):
        return {}
    return {
        str(spec): {"results": counts["results"], "failed": counts["failed"]}
        for spec, counts in runs.items()
        if isinstance(counts, dict) and isinstance(counts.get("results"), int) and isinstance(counts.get("failed"), int)
    }


def _ran_in_full(run: RunReport, op: OpReport, filters: Filters | None, fail_fast: bool) -> bool:
    """Whether the op ran every result a recorded id of it could name: it loaded, nothing stopped it early, and no
    filter but --last-failed's own ids narrowed it (a --shard K/N run produced only its shard's ids: another
    shard's failures stay recorded)."""
    if filters is None or run.incomplete or (fail_fast and run.failed):
        return False
    if filters.dtypes or filters.devices or filters.checks or filters.keyword or filters.shard:
        return False
    return not any(r.check == LOAD_CHECK for r in op.results)


def _key(root: Path, path: Path) -> Path:
    return (root / path).resolve()


def _exists(root: Path, spec: str) -> bool:
    return (root / spec).is_file()
