"""What a reporter is (Reporter), how a file format is registered (ReportFormat), and the engine's events fanned
out to several reporters."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opforge.core.results import CaseResult, RunReport
from opforge.engine.events import Events


class Reporter:
    """What a format does with a run. Every hook is optional: the base ignores them all."""

    def start(self) -> None:
        """The run begins."""

    def step(self, message: str) -> None:
        """A long step's message (a build, a worker restart)."""

    def planned(self, op: str, total: int) -> None:
        """`op` will report `total` results."""

    def result(self, op: str, result: CaseResult) -> None:
        """One result, as it arrives."""

    def finish(self, run: Any) -> None:
        """The finished (or interrupted) run. A file format writes its file here; OSError if it cannot."""


class NotWritten(Exception):
    """A report that had nothing to hold (a plot of a run that timed nothing): the run goes on, the CLI warns."""


@dataclass(frozen=True)
class ReportFormat:
    """A report written to a file, asked for with `option PATH`."""

    option: str
    help: str
    # What the CLI says it wrote ("JSON report: path").
    title: str
    # `module:Class` of its Reporter, imported when asked for (a format may need a heavy package: --plot).
    reporter: str
    # Called before the run with nothing but the path: raises UsageError when the format cannot be written here.
    preflight: Callable[[], None] | None = None

    def make(self, path: Path) -> Reporter:
        module, name = self.reporter.split(":")
        reporter: Callable[[Path], Reporter] = getattr(importlib.import_module(f"opforge.reporters.{module}"), name)
        return reporter(path)


def fan_out(reporters: list[Reporter]) -> Events:
    """The engine's events, delivered to every reporter."""

    def step(message: str) -> None:
        for reporter in reporters:
            reporter.step(message)

    def planned(op: str, total: int) -> None:
        for reporter in reporters:
            reporter.planned(op, total)

    def result(op: str, result: CaseResult) -> None:
        for reporter in reporters:
            reporter.result(op, result)

    return Events(step=step, planned=planned, result=result)


def as_results(run: Any) -> RunReport:
    """What the result formats (JSON, JUnit, Markdown) render: a check run as it is, a bench run or a fuzz search as
    the results its `run_report()` gives."""
    return run if isinstance(run, RunReport) else run.run_report()
