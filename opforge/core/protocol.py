"""The one protocol between opforge and every child process it runs an op in: the engine's workers
(opforge.engine.worker, started by opforge.engine.isolated), fuzz's worker (opforge.fuzz.worker, started by
opforge.fuzz.process), the large_index child (opforge.engine.large_index_child) and the sanitizers' child
(opforge.engine.sanitize_child), and the fork server that forks them (opforge.engine.forkserver).

Every message is a typed dataclass, a `Message`: what a parent asks of a child is a `Job` (one base class, a subclass
per child), what a child tells its parent an event. One encoding for all: one JSON object per line, `{"kind": ...,
<fields>}`, every non-finite float as a string (results.strict_json); a SEQPACKET packet (the fork server's) holds one
such line. A new child job is a `Job` subclass and its events here, the child's program, and its parent's side.

What carries the lines: a worker's stdin (its job) and a duplicate of its original stdout (its events: fd 1 then
points at stderr, so the op's own prints never reach the protocol), for the engine's and fuzz's workers and the
large_index child alike; the sanitizers' child runs under compute-sanitizer, whose reports go to the child's stdout
and stderr, so it appends its events to a channel file of its own, never to those.

Plain data and the result model only (nothing here imports torch or a layer above the vocabulary's): the checks'
parents (large_index, the sanitizers) speak it too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from opforge.core.errors import WorkerInternalError
from opforge.core.results import (
    CaseResult,
    Status,
    Verdict,
    mismatch_from_json,
    result_from_json,
    result_json,
    strict_json,
)

# Characters of a malformed message quoted in the error that reports it.
QUOTED = 200


class ProtocolError(WorkerInternalError):
    """A line that is no message of this protocol (not JSON, no known kind, wrong fields): a bug in opforge, or a child
    of another opforge version."""


class Message:
    """Base of every message. `kind` names each in its JSON line; each subclass with a `kind` of its own is known to
    decode. A field that is not plain JSON data overrides `to_json`/`from_json`."""

    kind: ClassVar[str] = ""
    _kinds: ClassVar[dict[str, type[Message]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind:
            if kind in Message._kinds:
                raise TypeError(f"two messages of kind {kind!r}: {Message._kinds[kind].__name__} and {cls.__name__}")
            Message._kinds[kind] = cls

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        return cls(**data)


class Job(Message):
    """What a parent asks of a child, the first message it sends: one subclass per child program."""

    def to_line(self) -> str:
        return encode(self)

    @classmethod
    def from_line(cls: type[_J], line: bytes | str) -> _J:
        message = decode(line)
        if not isinstance(message, cls):
            raise ProtocolError(f"expected a {cls.__name__}, got a {type(message).__name__} message")
        return message


_J = TypeVar("_J", bound=Job)


def encode(message: Message) -> str:
    """The message's one line (with its newline)."""
    return json.dumps(strict_json(message.to_json()), allow_nan=False, default=str) + "\n"


def decode(line: bytes | str) -> Message:
    """The message a line (or a packet) holds; ProtocolError, quoting it, when it holds none (not a JSON object, no
    kind this protocol knows). Fields its message class does not take raise that class's error (a TypeError naming
    the field: a child of another opforge version)."""
    try:
        data = json.loads(line)
        cls = Message._kinds[data.pop("kind")]
    except Exception as exc:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        quoted = text.strip()[:QUOTED] or "an empty line"
        raise ProtocolError(f"a malformed message ({type(exc).__name__}: {exc}): {quoted}") from exc
    return cls.from_json(data)


def decode_stream(data: bytes) -> tuple[list[Message], str]:
    """The complete messages of a stream that has ended, and what follows the last one: a partial line, when the
    child died in the middle of a message (what it said last is the messages before)."""
    *lines, tail = data.split(b"\n")
    return [decode(line) for line in lines if line.strip()], tail.decode("utf-8", "replace")


def send(fd: int, message: Message) -> None:
    """One message on `fd` in one write (a pipe's writes of up to 4 KiB are atomic; a file's are appended whole)."""
    data = encode(message).encode()
    while data:
        data = data[os.write(fd, data) :]


# ------------------------------------------------------------------------------------ the engine's workers


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


# The worker's events. Its job is engine.plan.CheckJob: its filters and settings are the engine's.
Event = Message


@dataclass(frozen=True)
class EnvironmentEvent(Message):
    kind: ClassVar[str] = "environment"
    environment: dict[str, Any]


@dataclass(frozen=True)
class Step(Message):
    """A long step's message (building the op's kernels)."""

    kind: ClassVar[str] = "step"
    message: str


@dataclass(frozen=True)
class Loaded(Message):
    """The op loaded and its tasks planned. From task 0 on it carries the tasks, the build and the skipped
    results; a worker that goes on from a later task sends only the count, which must not have changed."""

    kind: ClassVar[str] = "loaded"
    count: int
    tasks: tuple[TaskHeader, ...] | None = None
    build: dict[str, Any] | None = None
    skipped: tuple[CaseResult, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "count": self.count}
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
class Start(Message):
    """Planned task `index` starts: until its End, a death or a hang is its."""

    kind: ClassVar[str] = "start"
    index: int


@dataclass(frozen=True)
class Sweep(Message):
    """The task in flight now runs its op on another case of the spec (the dtypes check's sweep of an unclaimed
    dtype): until the next Sweep or End, a death or a hang is this case's."""

    kind: ClassVar[str] = "sweep"
    case_id: str
    dtype: str
    layout: str


@dataclass(frozen=True)
class Result(Message):
    kind: ClassVar[str] = "result"
    result: CaseResult

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "result": result_json(self.result)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(result_from_json(data["result"]))


@dataclass(frozen=True)
class End(Message):
    kind: ClassVar[str] = "end"
    index: int


@dataclass(frozen=True)
class Restart(Message):
    """The worker's device is unusable (a sticky CUDA error): the tasks after the last End go on in a fresh one."""

    kind: ClassVar[str] = "restart"
    reason: str


@dataclass(frozen=True)
class Done(Message):
    """A child's work is over: every event it had to send is sent."""

    kind: ClassVar[str] = "done"


@dataclass(frozen=True)
class LoadError(Message):
    """The op's spec or build is wrong (an OpforgeError): its load result says why, with the error's exit code.
    `died`: fuzz's worker saw the process that loaded the op die (a crash, not an error it reported)."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int
    died: bool = False


@dataclass(frozen=True)
class Internal(Message):
    """A bug in opforge inside the worker: the run ends with the internal-error exit code."""

    kind: ClassVar[str] = "internal"
    message: str
    traceback: str = field(default="", repr=False)


# ------------------------------------------------------------------------------------------- fuzz's worker


@dataclass(frozen=True)
class FuzzJob(Job):
    """Fuzz's worker: the op to load (its planning child answers Space or LoadError)."""

    kind: ClassVar[str] = "fuzz-job"
    spec: str
    cuda_arch: str | None = None


@dataclass(frozen=True)
class FuzzExample(Job):
    """One example for the judging child: a kept example's fields (spec.model.Regression's, as JSON) and the oracles
    that judge it."""

    kind: ClassVar[str] = "fuzz-example"
    example: dict[str, Any]
    oracles: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FuzzExample:
        return cls(data["example"], tuple(data["oracles"]))


@dataclass(frozen=True)
class Space(Message):
    """The planning child loaded the op: the search space hypothesis draws from."""

    kind: ClassVar[str] = "space"
    space: dict[str, Any]


@dataclass(frozen=True)
class Ready(Message):
    """A judging child loaded the op and waits for examples; `pid` is killed when an example hangs."""

    kind: ClassVar[str] = "ready"
    pid: int


@dataclass(frozen=True)
class ExampleStart(Message):
    """The judging child starts an example: until its verdict, a death is the example's. `case_id`: the example's
    case id without its fill, what an xfail entry's `case:` glob is matched against (a samples spec's case id names
    its sample's shapes, which only a process that loaded the op knows)."""

    kind: ClassVar[str] = "example-start"
    case_id: str = ""


@dataclass(frozen=True)
class Timed(Message):
    """A phase of an example ended after `seconds`: the first reference call ("reference"), the op's ("op")."""

    kind: ClassVar[str] = "timed"
    phase: str
    seconds: float


@dataclass(frozen=True)
class Judged(Message):
    """An example's verdict; `restart`: the child's device is unusable now, and it exits for a fresh one."""

    kind: ClassVar[str] = "judged"
    verdict: Verdict
    restart: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "verdict": asdict(self.verdict), "restart": self.restart}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Judged:
        return cls(verdict_from_json(data["verdict"]), data["restart"])


@dataclass(frozen=True)
class Died(Message):
    """Fuzz's worker saw a child die (`how`: describe_exit's words): the example it was judging is a crash."""

    kind: ClassVar[str] = "died"
    how: str


# ------------------------------------------------------------------------------------ the checks' children


@dataclass(frozen=True)
class LargeIndexJob(Job):
    """The large_index child (checks.large_index): one implementation of a spec on one large case."""

    kind: ClassVar[str] = "large-index-job"
    spec: str
    implementation: str
    seed: int
    dtype: str
    device: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    values: tuple[tuple[str, Any], ...]
    boundary: int = 2**31
    window: int = 2**20
    cuda_arch: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LargeIndexJob:
        shapes = tuple((name, tuple(shape)) for name, shape in data["shapes"])
        return cls(**{**data, "shapes": shapes, "values": tuple(map(tuple, data["values"]))})


@dataclass(frozen=True)
class Running(Message):
    """The child starts the op (on the large case): a death or a hang after this is the op's."""

    kind: ClassVar[str] = "running"


@dataclass(frozen=True)
class Outcome(Message):
    """A check child's verdict on its case (status PASS, FAIL with its mismatch, SKIP, ERROR)."""

    kind: ClassVar[str] = "outcome"
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "verdict": asdict(self.verdict)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(verdict_from_json(data["verdict"]))


@dataclass(frozen=True)
class SanitizeJob(Job):
    """The sanitizers' child (checks.sanitize), run under compute-sanitizer: one implementation on a list of cases
    (each cases.Case as JSON)."""

    kind: ClassVar[str] = "sanitize-job"
    spec: str
    implementation: str
    seed: int
    cases: tuple[dict[str, Any], ...]
    cuda_arch: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SanitizeJob:
        return cls(**{**data, "cases": tuple(data["cases"])})


@dataclass(frozen=True)
class CaseStarted(Message):
    """The sanitizers' child starts a case; `offset`: the size of its output (the tool's reports) then, so that the
    reports that follow are blamed on this case."""

    kind: ClassVar[str] = "case-started"
    case_id: str
    offset: int


@dataclass(frozen=True)
class CaseRaised(Message):
    """The op raised on a case in the sanitizers' child (correctness's to report; the tool's reports are what count)."""

    kind: ClassVar[str] = "case-raised"
    case_id: str
    message: str
    offset: int


# ---------------------------------------------------------------------------------------- the fork server


@dataclass(frozen=True)
class Fork(Message):
    """The parent asks the fork server for a child: `module.main()` on the three descriptors sent with it."""

    kind: ClassVar[str] = "fork"
    module: str
    env: dict[str, str]
    cwd: str | None


@dataclass(frozen=True)
class ServerReady(Message):
    """The fork server finished its imports."""

    kind: ClassVar[str] = "server-ready"


@dataclass(frozen=True)
class Forked(Message):
    kind: ClassVar[str] = "forked"
    pid: int


@dataclass(frozen=True)
class Exited(Message):
    """A forked child ended: its exit code as subprocess reports it (negative: the signal)."""

    kind: ClassVar[str] = "exited"
    pid: int
    code: int


def verdict_from_json(data: dict[str, Any]) -> Verdict:
    mismatch = mismatch_from_json(data["mismatch"]) if data.get("mismatch") else None
    return Verdict(
        Status(data["status"]),
        data["message"],
        mismatch,
        data.get("detail", ""),
        data.get("oracle", ""),
        data.get("cause", ""),
    )
