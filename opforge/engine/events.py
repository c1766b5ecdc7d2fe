"""What a run reports while ops run, in a worker process or in this one: the reporters listen to these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opforge.results import CaseResult


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
