"""What a run reports while ops run, in a worker process or in this one: the reporters listen to these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opforge.core.results import CaseResult
from opforge.spec.model import OpSpec


def _ignore_step(message: str) -> None:
    return None


def _ignore_planned(op: str, total: int) -> None:
    return None


def _ignore_result(op: str, result: CaseResult) -> None:
    return None


@dataclass
class Events:
    """step: a long step's message (a build); planned: how many results an op will report; result: each result as
    it arrives."""

    step: Callable[[str], None] = _ignore_step
    planned: Callable[[str, int], None] = _ignore_planned
    result: Callable[[str, CaseResult], None] = _ignore_result


def progress_names(specs: Sequence[OpSpec]) -> dict[Path, str]:
    """What a run's progress calls each spec: its op's name, and where two specs of the run check one op, the name
    and the spec's file: keyed by name alone their counts mixed (fbgemm's pack_segments and
    pack_segments_strided_lengths read "248/12 results done")."""
    shared = Counter(spec.name for spec in specs)
    return {spec.path: spec.name if shared[spec.name] == 1 else f"{spec.name} ({spec.path.name})" for spec in specs}
