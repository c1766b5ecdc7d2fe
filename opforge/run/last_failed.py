"""What `opforge check --last-failed` runs, from the failures the last run recorded (opforge.reporters.lastfailed).

The selection policy is pytest's: rerun the recorded failures of the selected specs; when none of them has any
recorded, run everything selected (saying so) rather than nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opforge.reporters.lastfailed import STORE, recorded, spec_exists, spec_key


@dataclass(frozen=True)
class Selection:
    """What --last-failed runs: `ids` narrows the results (empty: all of them) of the specs in `paths` (None: the
    specs the caller selected). `notes` say what was decided and why."""

    ids: tuple[str, ...] = ()
    paths: list[Path] | None = None
    notes: list[str] = field(default_factory=list)


def select(root: Path, selected: list[Path] | None) -> Selection:
    """The --last-failed selection, given the spec paths named on the command line (None when none were)."""
    failed = recorded(root)
    gone = sorted({spec for spec in failed.values() if not spec_exists(root, spec)})
    notes = [
        f"--last-failed: {spec} no longer exists; its recorded failures are skipped (and forgotten after this "
        f"run; delete {STORE} to forget them now)"
        for spec in gone
    ]
    failed = {ident: spec for ident, spec in failed.items() if spec not in gone}
    what = ""
    if selected is not None and failed:
        wanted = {spec_key(root, p) for p in selected}
        failed = {ident: spec for ident, spec in failed.items() if spec_key(root, Path(spec)) in wanted}
        what = " for the selected specs"
    if not failed:
        return Selection(notes=notes + [f"--last-failed: no failures recorded{what}, running everything selected"])
    paths = None if selected is not None else [Path(p) for p in dict.fromkeys(failed.values())]
    return Selection(
        ids=tuple(failed), paths=paths, notes=notes + [f"--last-failed: rerunning {len(failed)} failed results"]
    )
