"""The protocol between an isolated run's parent (opforge.engine.isolated) and its workers (opforge.engine.worker):
a Job on the worker's stdin, then typed events back, one JSON object per line. Nothing here imports torch."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from opforge.core.results import CaseResult, result_from_json, result_json
from opforge.engine.plan import Filters, RunSettings


@dataclass(frozen=True)
class Job:
    """One op (or one part of its tasks) for a worker: its spec, from which task to go on, and the task's time
    limit."""

    spec: str
    filters: Filters
    settings: RunSettings
    start: int
    time_limit: float
    cuda_arch: str | None = None
    # One of `parts` workers that share an op's tasks: it runs those whose plan.part_of(group, parts) == part.
    part: int = 0
    parts: int = 1

    def to_line(self) -> str:
        return (
            json.dumps({**asdict(self), "filters": self.filters.to_json(), "settings": self.settings.to_json()}) + "\n"
        )

    @classmethod
    def from_line(cls, line: str) -> Job:
        data = json.loads(line)
        filters, settings = Filters.from_json(data["filters"]), RunSettings.from_json(data["settings"])
        return cls(**{**data, "filters": filters, "settings": settings})


@dataclass(frozen=True)
class TaskHeader:
    """What the parent knows of a task before it runs: enough to report it if the worker dies in it."""

    implementation: str
    case_id: str
    dtype: str
    device: str
    layout: str
    seed: int
    results: tuple[str, ...]
    group: int  # Task.group: the parent splits an op's tasks between workers as they do


class Event:
    """Base of the worker's events; `kind` names each in the JSON line."""

    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        return cls(**{k: v for k, v in data.items() if k != "event"})


@dataclass(frozen=True)
class EnvironmentEvent(Event):
    kind: ClassVar[str] = "environment"
    environment: dict[str, Any]


@dataclass(frozen=True)
class Step(Event):
    """A long step's message (building the op's kernels)."""

    kind: ClassVar[str] = "step"
    message: str


@dataclass(frozen=True)
class Loaded(Event):
    """The op loaded and its tasks planned. From task 0 on it carries the tasks, the build and the skipped
    results; a worker that goes on from a later task sends only the count, which must not have changed."""

    kind: ClassVar[str] = "loaded"
    count: int
    tasks: tuple[TaskHeader, ...] | None = None
    build: dict[str, Any] | None = None
    skipped: tuple[CaseResult, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"event": self.kind, "count": self.count}
        if self.tasks is not None:
            data.update(
                tasks=[asdict(r) for r in self.tasks], build=self.build, skipped=[result_json(r) for r in self.skipped]
            )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Loaded:
        if "tasks" not in data:
            return cls(count=data["count"])
        tasks = tuple(TaskHeader(**{**t, "results": tuple(t["results"])}) for t in data["tasks"])
        return cls(data["count"], tasks, data["build"], tuple(result_from_json(r) for r in data["skipped"]))


@dataclass(frozen=True)
class Start(Event):
    """Planned task `index` starts: until its End, a death or a hang is its."""

    kind: ClassVar[str] = "start"
    index: int


@dataclass(frozen=True)
class Sweep(Event):
    """The task in flight now runs its op on another case of the spec (the dtypes check's sweep of an unclaimed
    dtype): until the next Sweep or End, a death or a hang is this case's."""

    kind: ClassVar[str] = "sweep"
    case_id: str
    dtype: str
    layout: str


@dataclass(frozen=True)
class Result(Event):
    kind: ClassVar[str] = "result"
    result: CaseResult

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "result": result_json(self.result)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(result_from_json(data["result"]))


@dataclass(frozen=True)
class End(Event):
    kind: ClassVar[str] = "end"
    index: int


@dataclass(frozen=True)
class Restart(Event):
    """The worker's device is unusable (a sticky CUDA error): the tasks after the last End go on in a fresh one."""

    kind: ClassVar[str] = "restart"
    reason: str


@dataclass(frozen=True)
class Done(Event):
    kind: ClassVar[str] = "done"


@dataclass(frozen=True)
class LoadError(Event):
    """The op's spec or build is wrong (an OpforgeError): its load result says why, with the error's exit code."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int


@dataclass(frozen=True)
class Internal(Event):
    """A bug in opforge inside the worker: the run ends with the internal-error exit code."""

    kind: ClassVar[str] = "internal"
    message: str
    traceback: str = field(default="", repr=False)


_EVENTS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (EnvironmentEvent, Step, Loaded, Start, Sweep, Result, End, Restart, Done, LoadError, Internal)
}


def encode(event: Event) -> str:
    return json.dumps(event.to_json(), default=str) + "\n"


def decode(line: bytes | str) -> Event:
    data = json.loads(line)
    return _EVENTS[data["event"]].from_json(data)
