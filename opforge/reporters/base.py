"""What a reporter is (Reporter: a subscriber to the run's events), how a file format is registered (ReportFormat),
and the run's events fanned out to several reporters."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opforge.core.results import RunReport
from opforge.engine.events import Events, FanOut


class Reporter(Events):
    """What a format does with a run: it subscribes to the run's events (engine.events.Events, declared once), each
    hook optional; a file format writes its file in finish(run)."""


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
    """The run's events, delivered to every reporter."""
    return FanOut(reporters)


def as_results(run: Any) -> RunReport:
    """What the result formats (JSON, JUnit, Markdown) render: a check run as it is, a bench run or a fuzz search as
    the results its `run_report()` gives."""
    return run if isinstance(run, RunReport) else run.run_report()
