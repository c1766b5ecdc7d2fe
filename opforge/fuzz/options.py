"""`opforge fuzz`'s options and defaults, apart from the search (which imports hypothesis) so that the command line
stays quick to start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_BUDGET = 60.0
DEFAULT_MAX_NUMEL = 2**20
DATABASE = Path(".opforge") / "fuzz"


@dataclass(frozen=True)
class FuzzOptions:
    budget: float = DEFAULT_BUDGET
    max_examples: int | None = None
    seed: int | None = None
    device: str = "cpu"
    # --check: the checks (or their results) whose oracles judge, as `opforge check --check` names them; empty: every
    # oracle that applies and is not asked for by name only (opforge.fuzz.search.oracles_for).
    oracles: tuple[str, ...] = ()
    max_numel: int = DEFAULT_MAX_NUMEL
    cuda_arch: str | None = None
    database: Path = DATABASE
    # Stop once a failure is found (and shrunk), instead of searching on for others until the budget runs out.
    exit_first: bool = False
