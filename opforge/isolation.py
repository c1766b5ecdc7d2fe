"""Running each op's checks in a worker process, so that a crash or a hang costs one row, not the run.

One worker per op (importing torch and loading the op cost seconds: once per op, not per row). The worker streams
results as it goes (opforge._worker); the parent knows which (check, case) row is in flight, so when the worker dies
(SIGSEGV, abort, a CUDA fault) that row becomes a CRASH row naming the signal and the tail of the worker's stderr,
and when it runs past its time limit the worker's whole process group is killed and the row becomes TIMEOUT. Either
way the op's remaining rows go on in a fresh worker, then the next op: a fresh process per op also means a CUDA error
in one op cannot poison the next. With `jobs` > 1, several ops run at once, one GPU per worker slot.

POSIX only (process groups, select on pipes); `opforge check --no-isolation` runs everything in-process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from opforge.errors import BuildError, OpforgeError, SpecError, UsageError
from opforge.results import CaseResult, OpReport, RunReport, Status, result_from_json
from opforge.runner import LOAD_CASE, LOAD_CHECK, Filters, repro_command
from opforge.loading import NATIVE
from opforge.spec import OpSpec

# Per-check time limit when neither the spec (`timeout:`) nor --timeout sets one. Generous: the slowest row measured
# on the 2-core CI VM (`compile`, every leaky_swish shape through inductor, cold inductor cache) takes ~30 s.
DEFAULT_CHECK_TIMEOUT = 300.0
# Loading is not a check: a cold build of CUDA sources for several architectures takes minutes. This only catches a
# load (or a pause between rows) that hangs.
LOAD_TIME_LIMIT = 3600.0
STDERR_TAIL_LINES = 20
STDERR_KEPT_BYTES = 64 * 1024
# How long a worker that closed its end of the protocol may take to exit before it is killed.
EXIT_GRACE = 10.0


class WorkerInternalError(Exception):
    """A bug in opforge surfaced inside a worker; carries the worker's traceback."""


@dataclass(frozen=True)
class Isolation:
    jobs: int = 1
    timeout: float | None = None  # --timeout: overrides every spec's `timeout:`
    cuda_arch: str | None = None


@dataclass
class Events:
    """What the parent reports while ops run; the CLI wires these to opforge.report."""

    step: Callable[[str], None] = lambda message: None
    planned: Callable[[str, int], None] = lambda op, total: None
    result: Callable[[str, CaseResult], None] = lambda op, result: None


def time_limit(spec: OpSpec, override: float | None) -> float:
    return override or spec.timeout or DEFAULT_CHECK_TIMEOUT


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPU ids workers may use: CUDA_VISIBLE_DEVICES' entries as given (they may be physical ids or UUIDs),
    else every device torch sees."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [v.strip() for v in value.split(",") if v.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_per_slot(jobs: int, gpus: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each worker slot: the visible GPUs round-robin, None where there are none."""
    if not gpus:
        return [None] * jobs
    return [gpus[slot % len(gpus)] for slot in range(jobs)]


def threads_per_worker(jobs: int, cpus: int | None) -> int:
    """Intra-op threads each of `jobs` CPU workers gets, so that parallel workers do not oversubscribe the cores."""
    return max(1, (cpus or 1) // jobs)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"{signal.Signals(-returncode).name} (signal {-returncode})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


# ------------------------------------------------------------------------------------------------------ a worker


class _Worker:
    def __init__(self, job: dict, env: dict[str, str]):
        self.stderr = tempfile.TemporaryFile()
        # Its own session: Ctrl-C at a terminal reaches the parent only, and a timeout kills the worker's whole
        # process group (inductor's compile workers included).
        self.proc = subprocess.Popen([sys.executable, "-m", "opforge._worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env, start_new_session=True)
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.close()
        self._buffer = b""

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read_events(self) -> list[dict] | None:
        """The complete events available now; None at end of stream."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            return None
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=EXIT_GRACE)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        # Whatever the worker left running in its group (compile workers) goes with it.
        self.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.stderr.close()

    def stderr_tail(self) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - STDERR_KEPT_BYTES))
        return stderr_excerpt(self.stderr.read().decode("utf-8", "replace"))


# ------------------------------------------------------------------------------------------------- one op's run


@dataclass
class _OpRun:
    spec: OpSpec
    report: OpReport
    limit: float
    slot: int
    rows: list[dict] | None = None
    next_index: int = 0
    in_flight: int | None = None
    since: float = field(default_factory=time.monotonic)
    worker: _Worker | None = None
    progressed: bool = False
    done: bool = False
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> bool:
        return self.rows is not None and self.next_index < len(self.rows)

    def deadline(self) -> float:
        return self.since + (self.limit if self.in_flight is not None else LOAD_TIME_LIMIT)


class Supervisor:
    """Runs specs in workers, `jobs` at a time, appending each op's report to `run` as soon as it starts so that an
    interrupted run still holds everything that finished."""

    def __init__(self, specs: list[OpSpec], filters: Filters, isolation: Isolation, run: RunReport,
                 events: Events, environ: Mapping[str, str] | None = None):
        self.filters = filters
        self.isolation = isolation
        self.run = run
        self.events = events
        self.pending = deque(specs)
        self.active: dict[int, _OpRun] = {}
        self.stopped = False
        environ = dict(os.environ if environ is None else environ)
        self.env = _worker_env(environ, isolation.jobs)
        gpus = visible_gpus(environ) if isolation.jobs > 1 else []
        self.gpus = gpu_per_slot(isolation.jobs, gpus)

    def execute(self) -> None:
        previous = _stop_on_sigterm()
        try:
            while True:
                self._fill_slots()
                if not self.active:
                    return
                self._step()
        finally:
            for op in self.active.values():
                if op.worker:
                    op.worker.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _fill_slots(self) -> None:
        while self.pending and not self.stopped and len(self.active) < self.isolation.jobs:
            slot = min(set(range(self.isolation.jobs)) - set(self.active))
            spec = self.pending.popleft()
            op = _OpRun(spec, OpReport(op=spec.name, spec_path=str(spec.path)),
                        time_limit(spec, self.isolation.timeout), slot)
            self.run.ops.append(op.report)
            self.active[slot] = op
            self._spawn(op)

    def _spawn(self, op: _OpRun) -> None:
        env = dict(self.env)
        if self.gpus[op.slot] is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[op.slot]
        job = {"spec": str(op.spec.path), "cuda_arch": self.isolation.cuda_arch, "filters": self.filters.to_json(),
               "start": op.next_index, "time_limit": op.limit}
        op.worker = _Worker(job, env)
        op.in_flight, op.since, op.progressed = None, time.monotonic(), False

    def _step(self) -> None:
        by_fd = {op.worker.fileno(): op for op in self.active.values()}
        wait = max(0.0, min(op.deadline() for op in self.active.values()) - time.monotonic())
        readable, _, _ = select.select(list(by_fd), [], [], wait)
        for fd in readable:
            op = by_fd[fd]
            events = op.worker.read_events()
            if events is None:
                self._worker_exited(op)
                continue
            for event in events:
                self._handle(op, event)
        now = time.monotonic()
        for op in list(self.active.values()):
            if self.active.get(op.slot) is op and not op.done and op.deadline() <= now:
                self._timed_out(op)

    # ------------------------------------------------------------------------------------------ events from a worker

    def _handle(self, op: _OpRun, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "environment":
            self.run.environment = self.run.environment or event["environment"]
        elif kind == "step":
            self.events.step(event["message"])
        elif kind == "loaded":
            if "rows" in event:
                op.rows = event["rows"]
                op.report.build = event["build"]
                self.events.planned(op.spec.name, len(event["skipped"]) + sum(len(r["rows"]) for r in op.rows))
                for data in event["skipped"]:
                    self._add(op, result_from_json(data))
            elif op.rows is None or event["count"] != len(op.rows):
                raise WorkerInternalError(f"{op.spec.name}: a fresh worker planned {event['count']} rows, the first "
                                          f"one {len(op.rows or [])}: planning is not deterministic")
        elif kind == "start":
            op.in_flight, op.since = event["index"], time.monotonic()
        elif kind == "result":
            self._add(op, result_from_json(event["result"]))
        elif kind == "end":
            op.in_flight, op.since, op.progressed = None, time.monotonic(), True
            op.next_index = event["index"] + 1
        elif kind == "restart":
            self.events.step(f"{op.spec.name}: going on in a fresh process ({event['reason']})")
        elif kind == "done":
            op.done = True
        elif kind == "error":
            raise _decode_error(event["type"], event["fields"])
        elif kind == "internal":
            raise WorkerInternalError(f"{event['message']} (in the worker for {op.spec.name})\n{event['traceback']}")

    def _add(self, op: _OpRun, result: CaseResult) -> None:
        op.report.results.append(result)
        self.events.result(op.spec.name, result)

    def _worker_exited(self, op: _OpRun) -> None:
        returncode = op.worker.wait()
        if op.done:
            self._finish(op)
            return
        how = f"the worker process died: {describe_exit(returncode)}"
        if op.in_flight is None and not op.progressed:
            self._lost_load(op, Status.CRASH, f"{how} while loading the op")
            return
        if op.in_flight is not None:
            self._lost_row(op, Status.CRASH, f"{how} while running this check")
        self._continue(op)

    def _timed_out(self, op: _OpRun) -> None:
        op.worker.kill()
        op.worker.wait()
        if op.in_flight is None:
            self._lost_load(op, Status.TIMEOUT, f"loading the op took over {LOAD_TIME_LIMIT:g} s; it was killed")
            return
        self._lost_row(op, Status.TIMEOUT,
                       f"the check ran past its time limit of {op.limit:g} s and was killed (raise it with "
                       "`timeout:` in the spec or --timeout)")
        self._continue(op)

    def _lost_row(self, op: _OpRun, status: Status, how: str) -> None:
        """A row that never reported: one result per row name it would have reported."""
        row = op.rows[op.in_flight]
        seconds = time.monotonic() - op.since
        message = _with_stderr(how, op.worker)
        for name in row["rows"]:
            self._add(op, CaseResult(
                op=op.spec.name, target=row["target"], check=name, case_id=row["case_id"], dtype=row["dtype"],
                device=row["device"], status=status, seconds=seconds, message=message, seed=row["seed"],
                repro=repro_command(op.spec, row["target"], name, row["case_id"], self.filters.seed)))
        op.next_index = op.in_flight + 1
        op.in_flight = None

    def _lost_load(self, op: _OpRun, status: Status, how: str) -> None:
        self._add(op, CaseResult(op=op.spec.name, target=NATIVE, check=LOAD_CHECK, case_id=LOAD_CASE, dtype="-",
                                 device="-", status=status, seconds=time.monotonic() - op.since,
                                 message=_with_stderr(how, op.worker),
                                 repro=f"opforge check {op.spec.path} --no-isolation"))
        self._finish(op)

    def _continue(self, op: _OpRun) -> None:
        """After a lost row or a restart: the op's remaining rows in a fresh worker, unless -x stops here."""
        op.worker.close()
        if op.remaining() and not (self.filters.fail_fast and op.report.failed):
            self._spawn(op)
        else:
            self._finish(op, closed=True)

    def _finish(self, op: _OpRun, closed: bool = False) -> None:
        if not closed:
            op.worker.close()
        op.report.seconds = time.monotonic() - op.started
        del self.active[op.slot]
        if self.filters.fail_fast and op.report.failed:
            self.stopped = True


def stderr_excerpt(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last lines of a worker's stderr; for a fatal signal, Python's own account of it instead (faulthandler's
    "Fatal Python error" and the innermost frames, which come first), without the list of extension modules."""
    all_lines = text.rstrip().splitlines()
    fatal = next((i for i in range(len(all_lines) - 1, -1, -1) if all_lines[i].startswith("Fatal Python error")),
                 None)
    if fatal is None:
        return "\n".join(all_lines[-lines:])
    report = [line for line in all_lines[fatal:] if line.strip()]
    report = [line for line in report if not line.startswith(("Extension modules:", "(total:"))]
    return "\n".join(report[:lines])


def _stop_on_sigterm():
    """A cancelled CI job gets SIGTERM: stop like Ctrl-C (workers killed, reports written, marked incomplete) rather
    than die and leave workers running. Returns the handler to restore (None off the main thread, where Python
    cannot install one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _with_stderr(how: str, worker: _Worker) -> str:
    tail = worker.stderr_tail()
    return f"{how}. Last lines of its stderr:\n{tail}" if tail else f"{how}. It wrote nothing to stderr."


def _worker_env(environ: dict[str, str], jobs: int) -> dict[str, str]:
    env = dict(environ)
    # The worker imports this opforge, wherever it came from (an install, a checkout, a test's sys.path).
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_worker(jobs, os.cpu_count()))
    return env


_ERRORS: dict[str, type[OpforgeError]] = {c.__name__: c for c in (SpecError, BuildError, UsageError)}


def _decode_error(name: str, fields: dict[str, Any]) -> Exception:
    cls = _ERRORS.get(name)
    if cls is None:
        return WorkerInternalError(f"the worker raised {name}: {fields}")
    if cls is SpecError:
        fields = {**fields, "path": Path(fields["path"])}
    if cls is BuildError:
        fields = {**fields, "log_path": Path(fields["log_path"])}
    return cls(**fields)


def run_isolated(specs: list[OpSpec], filters: Filters, isolation: Isolation, run: RunReport,
                 events: Events | None = None) -> None:
    Supervisor(specs, filters, isolation, run, events or Events()).execute()
