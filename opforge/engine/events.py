"""Every event a run reports as it goes, declared once (as pytest's hookspec declares its hooks): a check run's in
a worker process or in this one, a fuzz search's and a bench run's. Whoever follows a run subscribes to this one
declaration: a Reporter (the terminal report, the file formats), bench's progress bar, fuzz's live line, a test's
lambdas; each overrides the hooks it wants and inherits the others, which ignore their event."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from opforge.spec.model import OpSpec


class Events:
    """The events of a run, each a method that ignores it. A subscriber subclasses Events and overrides the ones it
    wants, or names them: `Events(result=lambda op, result: ...)`."""

    def __init__(self, **hooks: Callable[..., None]) -> None:
        for name, hook in hooks.items():
            if name not in HOOKS:
                raise TypeError(f"no event {name!r}: a run reports {', '.join(HOOKS)}")
            setattr(self, name, hook)

    def start(self) -> None:
        """The run begins."""

    def step(self, message: str) -> None:
        """A long step's message, to log: a build's, a worker's restart in a fresh process."""

    def task_started(self, name: str) -> None:
        """A long task begins (bench: loading an op, measuring a peak); task_finished(name) follows, whatever
        happens in it."""

    def task_finished(self, name: str) -> None:
        """The task task_started(name) announced is over."""

    def planned(self, op: str, total: int) -> None:
        """`op` will report `total` results (bench: "bench", every (point, contender) pair of the run)."""

    def result(self, op: str, result: Any) -> None:
        """One result as it arrives: a check's CaseResult, a bench timing's BenchResult."""

    def progress(self, run: Any, seconds_left: float) -> None:
        """How a search stands (fuzz: its FuzzReport so far) with `seconds_left` of its budget."""

    def finish(self, run: Any) -> None:
        """The finished (or interrupted) run. A file format writes its file here; OSError if it cannot."""


HOOKS = tuple(name for name, value in vars(Events).items() if callable(value) and not name.startswith("_"))


class FanOut(Events):
    """Every event delivered to each subscriber, in order."""

    def __init__(self, subscribers: Iterable[Events]) -> None:
        self.subscribers = list(subscribers)


def _fanned(name: str) -> Callable[..., None]:
    def deliver(self: FanOut, *args: Any) -> None:
        for subscriber in self.subscribers:
            getattr(subscriber, name)(*args)

    deliver.__name__ = name
    return deliver


for _name in HOOKS:
    setattr(FanOut, _name, _fanned(_name))


def progress_names(specs: Sequence[OpSpec]) -> dict[Path, str]:
    """What a run's progress calls each spec: its op's name, and where two specs of the run check one op, the name
    and the spec's file: keyed by name alone their counts mixed (fbgemm's pack_segments and
    pack_segments_strided_lengths read "248/12 results done")."""
    shared = Counter(spec.name for spec in specs)
    return {spec.path: spec.name if shared[spec.name] == 1 else f"{spec.name} ({spec.path.name})" for spec in specs}
