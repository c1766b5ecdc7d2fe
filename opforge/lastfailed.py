"""What failed last time, for `opforge check --last-failed`: full result ids and the spec each came from, kept in
`.opforge/lastfailed.json` under the directory opforge runs in (like pytest's cache)."""

from __future__ import annotations

import json
from pathlib import Path

from opforge.results import RunReport, write_atomically

STORE = Path(".opforge") / "lastfailed.json"


def recorded(root: Path) -> dict[str, str]:
    """Failed result id -> spec path. An unreadable store counts as empty: it only ever narrows a rerun."""
    try:
        data = json.loads((root / STORE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    failed = data.get("failed") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {}


def record(root: Path, run: RunReport) -> dict[str, str]:
    """Forget the ids that ran and did not fail, remember those that failed; returns what is now recorded."""
    from opforge.runner import LOAD_CHECK, load_row_id

    failed = recorded(root)
    for op in run.ops:
        if op.results and not any(r.check == LOAD_CHECK for r in op.results):
            failed.pop(load_row_id(op.op), None)
        for r in op.results:
            if r.status.failed:
                failed[r.full_id] = op.spec_path
            else:
                failed.pop(r.full_id, None)
    write_atomically(root / STORE, json.dumps({"failed": dict(sorted(failed.items()))}, indent=1) + "\n")
    return failed
