"""Running each op's checks in a worker process, so that a crash or a hang costs one task, not the run.

One worker per op (loading the op costs seconds: once per op, not per task), forked from this process's fork server
(opforge.engine.forkserver), which imported torch once for every worker of every run. The worker streams
results as it goes (opforge.engine.worker, the typed events of opforge.core.protocol); the parent knows which
(check, case) task is in flight, so when the worker dies (SIGSEGV, abort, a fatal signal from a native library) that
task's results are CRASH results naming the signal and the tail of the worker's stderr, and when it runs past its time
limit the worker's whole process group is killed and they are TIMEOUT. Either way the op's remaining tasks go on in
a fresh worker, then the next op. A CUDA fault (a device-side assert, an illegal memory access) does not kill the
worker: it raises, so its results are FAIL or ERROR, and because it leaves the CUDA context unusable the worker asks for
a fresh process for the tasks after it. A fresh process per op also means a CUDA error in one op cannot poison the
next. A spec or build error is the op's ERROR load result; the other ops still run. With `jobs` > 1, several ops run at
once, each worker slot with its own share of the GPUs.

POSIX only (process groups, select on pipes); `opforge check --no-isolation` runs everything in-process. This parent
never imports torch: what it needs to know of the GPUs it asks a child process.
"""

from __future__ import annotations

import functools
import os
import select
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opforge.checks.catalog import CATALOG
from opforge.core.child import EXIT_GRACE, LOAD_TIME_LIMIT, ChildProcess, describe_exit, with_this_opforge
from opforge.core.errors import WorkerInternalError
from opforge.core.protocol import (
    Done,
    End,
    EnvironmentEvent,
    Event,
    Internal,
    Loaded,
    LoadError,
    Restart,
    Result,
    Start,
    Step,
    Sweep,
    TaskHeader,
    decode,
)
from opforge.core.results import CaseResult, OpReport, RunReport, Status, Verdict, case_result
from opforge.engine.events import Events, progress_names
from opforge.engine.forkserver import ForkServer, shared_server
from opforge.engine.plan import CheckJob, Filters, RunSettings, load_result, part_of
from opforge.engine.tasks import declared, repro_command, stops_run
from opforge.spec.model import OpSpec

# Per-check time limit when neither the spec (`timeout:`) nor --timeout sets one. Generous: the slowest task measured
# on the 2-core CI VM (`compile`, every leaky_swish shape through inductor, cold inductor cache) takes ~30 s.
DEFAULT_CHECK_TIMEOUT = 300.0
# How often the supervisor looks whether such a dying worker has exited, while it goes on serving the others.
EXIT_POLL = 0.05
# Seconds an interrupted run spends reading the events its workers sent before the interrupt: a batch of results is
# read in milliseconds; the cap keeps a worker that goes on writing from delaying the stop a user asked for.
INTERRUPT_READ_LIMIT = 1.0
# Seconds a child may take to import torch and count the GPUs (about 2 s on CI's 2-core VM); past it the run
# treats the machine as having none, which only costs -j its GPU split.
GPU_PROBE_TIMEOUT = 60


@dataclass(frozen=True)
class Isolation:
    jobs: int = 1
    timeout: float | None = None  # --timeout: overrides every spec's `timeout:`
    cuda_arch: str | None = None
    # An explicit -j gives each worker its own share of the GPUs; the default worker count shares them all (so a
    # machine with two GPUs still runs multi_gpu, which needs both in one worker).
    split_gpus: bool = True


def time_limit(spec: OpSpec, override: float | None) -> float:
    return override or spec.timeout or DEFAULT_CHECK_TIMEOUT


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPU ids workers may use: CUDA_VISIBLE_DEVICES' entries as given (they may be physical ids or UUIDs),
    else every device torch sees (counted by a child process: this one stays torch-free)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(i) for i in range(_count_gpus(environ))]


def _count_gpus(environ: Mapping[str, str]) -> int:
    probe = "import torch; print(torch.cuda.device_count())"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=dict(environ), timeout=GPU_PROBE_TIMEOUT
        )
        return int(done.stdout.strip() or 0) if done.returncode == 0 else 0
    except (subprocess.TimeoutExpired, ValueError):
        return 0


def gpus_per_slot(jobs: int, gpus: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each worker slot: disjoint shares of the visible GPUs (slot i gets every jobs-th one
    from the i-th), so that a worker may hold several (multi_gpu needs two). With more slots than GPUs each slot
    gets one, round-robin, shared. None where there are no GPUs."""
    if not gpus:
        return [None] * jobs
    if jobs <= len(gpus):
        return [",".join(gpus[slot::jobs]) for slot in range(jobs)]
    return [gpus[slot % len(gpus)] for slot in range(jobs)]


def multi_gpu_note(specs: list[OpSpec], filters: Filters, slots: list[str | None]) -> str | None:
    """A warning when -j leaves a worker fewer GPUs than a check that needs several (multi_gpu) is to run with, on
    a machine that has them: the check would skip on every op, silently losing its coverage."""
    visible = {gpu for slot in slots if slot for gpu in slot.split(",")}
    fewest = min((len(slot.split(",")) for slot in slots if slot), default=0)
    for check in (c for c in CATALOG if c.gpus > 1):
        wanted = (
            any(check.name in spec.checks and "cuda" in spec.devices for spec in specs)
            and filters.wants_check(check.name)
            and (not filters.devices or "cuda" in filters.devices)
        )
        if wanted and len(visible) >= check.gpus and fewest < check.gpus:
            return (
                f"-j {len(slots)} leaves a worker {fewest} of the {len(visible)} visible GPUs, so {check.name} (which "
                f"needs {check.gpus}) skips: run with -j {max(1, len(visible) // check.gpus)} or fewer for it to run."
            )
    return None


def threads_per_worker(jobs: int, cpus: int | None) -> int:
    """Intra-op threads each of `jobs` CPU workers gets, so that parallel workers do not oversubscribe the cores."""
    return max(1, (cpus or 1) // jobs)


# ------------------------------------------------------------------------------------------------------ a worker


class Worker(ChildProcess):
    """An op's worker (opforge.engine.worker): its job on stdin, then its events on stdout until it ends."""

    def __init__(self, job: CheckJob, env: dict[str, str], server: ForkServer | None):
        super().__init__("opforge.engine.worker", env, server)
        self.send(job.to_line())
        self.stdin.close()

    def read_events(self) -> list[Event] | None:
        """The complete events available now; None at end of stream."""
        lines = self.read_lines()
        return None if lines is None else [decode(line) for line in lines]


# ------------------------------------------------------------------------------------------------- one op's run


@dataclass
class _OpRun:
    spec: OpSpec
    report: OpReport
    limit: float
    slot: int
    tasks: tuple[TaskHeader, ...] | None = None
    next_index: int = 0
    in_flight: int | None = None
    # The case the task in flight runs the op on when it is not the task's own (protocol.Sweep).
    sweeping: Sweep | None = None
    since: float = field(default_factory=time.monotonic)
    spawned: Worker | None = None
    progressed: bool = False
    done: bool = False
    # When the worker closed its protocol pipe without `done`: it is dying, and its exit status says how.
    dying_since: float | None = None
    started: float = field(default_factory=time.monotonic)
    # Several workers may share an op's tasks (the last op of a run, while slots are free): this one runs those of
    # its part (plan.part_of: a task group's work is reused in one process). Part 0 loads first (a cold build happens
    # once); the others wait in `waiting`, their slots reserved, and start from its plan.
    part: int = 0
    parts: int = 1
    waiting: list[_OpRun] = field(default_factory=list)

    def owns(self, index: int) -> bool:
        return self.tasks is not None and part_of(self.tasks[index].group, self.parts) == self.part

    @property
    def worker(self) -> Worker:
        if self.spawned is None:
            raise RuntimeError(f"no worker was started for {self.spec.name}")
        return self.spawned

    def remaining(self) -> bool:
        return self.tasks is not None and any(map(self.owns, range(self.next_index, len(self.tasks))))

    def deadline(self) -> float:
        if self.dying_since is not None:
            return min(time.monotonic() + EXIT_POLL, self.dying_since + EXIT_GRACE)
        return self.since + (self.limit if self.in_flight is not None else LOAD_TIME_LIMIT)


class Supervisor:
    """Runs specs in workers, `jobs` at a time, appending each op's report to `run` as soon as it starts so that an
    interrupted run still holds everything that finished."""

    def __init__(
        self,
        specs: list[OpSpec],
        filters: Filters,
        settings: RunSettings,
        isolation: Isolation,
        run: RunReport,
        events: Events,
        environ: Mapping[str, str] | None = None,
    ):
        self.filters = filters
        self.settings = settings
        self.isolation = isolation
        self.run = run
        self.events = events
        self.names = progress_names(specs)
        self.pending = deque(specs)
        self.active: dict[int, _OpRun] = {}
        self.reserved: set[int] = set()  # slots of parts waiting for their op's first part to load
        self.stopped = False
        environ = dict(os.environ if environ is None else environ)
        self.env = _worker_env(environ, isolation.jobs)
        gpus = visible_gpus(environ) if isolation.jobs > 1 and isolation.split_gpus else []
        self.gpus = gpus_per_slot(isolation.jobs, gpus)
        note = multi_gpu_note(specs, filters, self.gpus)
        if note:
            run.notes.append(note)

    def execute(self) -> None:
        try:
            while True:
                self._fill_slots()
                if not self.active:
                    return
                self._step()
                if self.stopped:
                    # -x: the ops still running stop too (what they finished is kept).
                    for op in list(self.active.values()):
                        self._finish(op)
        except KeyboardInterrupt:
            self._read_what_was_sent()
            raise
        finally:
            for op in self.active.values():
                op.worker.close()

    def _fill_slots(self) -> None:
        while self.pending and not self.stopped:
            free = sorted(set(range(self.isolation.jobs)) - set(self.active) - self.reserved)
            if not free:
                return
            spec = self.pending.popleft()
            # The last op takes every free slot: its tasks split between that many workers.
            slots = free if not self.pending else free[:1]
            report, limit = OpReport(op=spec.name, spec_path=str(spec.path)), time_limit(spec, self.isolation.timeout)
            parts = [_OpRun(spec, report, limit, slot, part=i, parts=len(slots)) for i, slot in enumerate(slots)]
            op = parts[0]
            op.waiting = parts[1:]
            self.reserved.update(slots[1:])
            self.run.ops.append(op.report)
            self.active[op.slot] = op
            self._spawn(op)

    def _start_waiting_parts(self, op: _OpRun) -> None:
        for part in op.waiting:
            part.tasks, part.started = op.tasks, op.started
            self.reserved.discard(part.slot)
            if part.remaining():  # an op with fewer tasks than parts leaves some without work: no worker for them
                self.active[part.slot] = part
                self._spawn(part)
        op.waiting = []

    def _spawn(self, op: _OpRun) -> None:
        env = dict(self.env)
        gpus = self.gpus[op.slot]
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        job = CheckJob(
            str(op.spec.path),
            self.filters,
            self.settings,
            op.next_index,
            op.limit,
            self.isolation.cuda_arch,
            op.part,
            op.parts,
        )
        op.spawned = self._start(job, env, own_gpus=gpus is not None)
        op.in_flight, op.since, op.progressed, op.dying_since = None, time.monotonic(), False, None

    def _start(self, job: CheckJob, env: dict[str, str], own_gpus: bool) -> Worker:
        """A worker forked from the fork server, else a process of its own: where forking is not available, where
        the server did not start or has died (a worker that fails the same way reports it as the op's load result),
        and for a worker with a share of the GPUs of its own, whose CUDA_VISIBLE_DEVICES is in its environment
        before it imports torch, as it always was (the server's torch is imported before)."""
        return Worker(job, env, None if own_gpus else self.server)

    @functools.cached_property
    def server(self) -> ForkServer | None:
        """This process's fork server, asked for once per run, with the first worker that can be forked."""
        return shared_server(self.env)

    def _read_what_was_sent(self) -> None:
        """On Ctrl-C or SIGTERM: the events the workers wrote before it and this process had not read yet, so that
        a result a worker finished is in the incomplete report (under load the parent may be an event behind)."""
        until = time.monotonic() + INTERRUPT_READ_LIMIT
        while self._read_ready(0.0, self._keep_result) and time.monotonic() < until:
            pass

    def _keep_result(self, op: _OpRun, event: Event) -> None:
        """An interrupted run's handling of an event: its results are kept; nothing else happens (no worker starts)."""
        if isinstance(event, Result):
            self._add(op, event.result)

    def _step(self) -> None:
        wait = max(0.0, min(op.deadline() for op in self.active.values()) - time.monotonic())
        self._read_ready(wait, self._handle)
        now = time.monotonic()
        for op in list(self.active.values()):
            if op.dying_since is not None:
                self._reap(op, now)
            elif not op.done and op.deadline() <= now:
                self._timed_out(op)

    def _read_ready(self, wait: float, handle: Callable[[_OpRun, Event], None]) -> bool:
        """Passes `handle` the events of the workers readable within `wait` seconds; whether any was."""
        by_fd = {op.worker.fileno(): op for op in self.active.values() if op.dying_since is None}
        readable, _, _ = select.select(list(by_fd), [], [], wait)
        for fd in readable:
            op = by_fd[fd]
            events = op.worker.read_events()
            if events is None:
                self._pipe_closed(op)
                continue
            for event in events:
                if self.active.get(op.slot) is not op:
                    break  # the op ended on an earlier event of this batch
                handle(op, event)
        return bool(readable)

    # ------------------------------------------------------------------------------------------ events from a worker

    def _handle(self, op: _OpRun, event: Event) -> None:
        if isinstance(event, EnvironmentEvent):
            self.run.environment = self.run.environment or event.environment
        elif isinstance(event, Step):
            self.events.step(event.message)
        elif isinstance(event, Loaded):
            self._loaded(op, event)
        elif isinstance(event, Start):
            op.in_flight, op.since, op.sweeping = event.index, time.monotonic(), None
        elif isinstance(event, Sweep):
            op.sweeping = event
        elif isinstance(event, Result):
            self._add(op, event.result)
        elif isinstance(event, End):
            op.in_flight, op.since, op.progressed, op.sweeping = None, time.monotonic(), True, None
            op.next_index = event.index + 1
        elif isinstance(event, Restart):
            self.events.step(f"{op.spec.name}: going on in a fresh process ({event.reason})")
        elif isinstance(event, Done):
            op.done = True
        elif isinstance(event, LoadError):
            # A spec or build error of this op: its load result says why, the other ops go on.
            op.report.load_exit_code = event.exit_code
            self._add(op, load_result(op.spec, Status.ERROR, event.message, time.monotonic() - op.since))
            self._finish(op)
        elif isinstance(event, Internal):
            raise WorkerInternalError(f"{event.message} (in the worker for {op.spec.name})", event.traceback)

    def _loaded(self, op: _OpRun, event: Loaded) -> None:
        if event.tasks is not None:
            op.tasks = event.tasks
            op.report.build = event.build
            self.events.planned(self._progress_name(op), len(event.skipped) + sum(len(t.results) for t in op.tasks))
            for result in event.skipped:
                self._add(op, result)
            self._start_waiting_parts(op)
        elif op.tasks is None or event.count != len(op.tasks):
            how = (
                f"a fresh worker planned {event.count} tasks where the first one planned "
                f"{len(op.tasks or ())}: what it can run changed (a GPU lost after a fault?), so this task and the "
                "op's other remaining tasks did not run"
            )
            for index in filter(op.owns, range(op.next_index, len(op.tasks or ()))):
                self._lost_task(op, index, Status.CRASH, how, seconds=0.0)
            self._finish(op)

    def _progress_name(self, op: _OpRun) -> str:
        # An op driven straight into a supervisor (not among the specs it was given) goes by its op's name.
        return self.names.get(op.spec.path, op.spec.name)

    def _add(self, op: _OpRun, result: CaseResult) -> None:
        op.report.results.append(result)
        self.events.result(self._progress_name(op), result)

    def _pipe_closed(self, op: _OpRun) -> None:
        if op.done:
            # Its results are all in; whatever it still runs (a stray thread) must not hold up the run.
            self._finish(op)
        else:
            op.dying_since = time.monotonic()

    def _reap(self, op: _OpRun, now: float) -> None:
        returncode = op.worker.poll()
        if returncode is None:
            if op.dying_since is not None and now < op.dying_since + EXIT_GRACE:
                return
            op.worker.kill()
            returncode = op.worker.wait()
        how = f"the worker process died: {describe_exit(returncode)}"
        if op.in_flight is None and not op.progressed:
            self._lost_load(op, Status.CRASH, f"{how} while loading the op")
            return
        if op.in_flight is not None:
            self._lost_task(op, op.in_flight, Status.CRASH, _with_stderr(f"{how} while running this check", op.worker))
        self._continue(op)

    def _timed_out(self, op: _OpRun) -> None:
        op.worker.kill()
        op.worker.wait()
        if op.in_flight is None:
            self._lost_load(op, Status.TIMEOUT, f"loading the op took over {LOAD_TIME_LIMIT:g} s; it was killed")
            return
        self._lost_task(
            op,
            op.in_flight,
            Status.TIMEOUT,
            _with_stderr(
                f"the check ran past its time limit of {op.limit:g} s and was killed (raise it with `timeout:` in the "
                "spec or --timeout)",
                op.worker,
            ),
        )
        self._continue(op)

    def _lost_task(self, op: _OpRun, index: int, status: Status, message: str, seconds: float | None = None) -> None:
        """A task that never reported: one result per result name it would have reported, on the case it was running
        (a swept case's own id, dtype and layout), declared by the spec's crash xfails."""
        task = (op.tasks or ())[index]
        seconds = time.monotonic() - op.since if seconds is None else seconds
        case_id, dtype, layout = task.case_id, task.dtype, task.layout
        if op.sweeping is not None:
            case_id, dtype, layout = op.sweeping.case_id, op.sweeping.dtype, op.sweeping.layout
            message = f"{message} (the task of case {task.case_id} was running the op on this case)"
        for name in task.results:
            verdict = declared(
                op.spec, task.implementation, name, dtype, task.device, layout, case_id, Verdict(status, message)
            )
            self._add(
                op,
                case_result(
                    op.spec.name,
                    task.implementation,
                    name,
                    case_id,
                    dtype,
                    task.device,
                    verdict,
                    seconds=seconds,
                    seed=task.seed,
                    repro=repro_command(op.spec, task.implementation, name, task.case_id, self.settings.seed),
                ),
            )
        op.next_index = index + 1
        op.in_flight, op.sweeping = None, None

    def _lost_load(self, op: _OpRun, status: Status, how: str) -> None:
        self._add(op, load_result(op.spec, status, _with_stderr(how, op.worker), time.monotonic() - op.since))
        self._finish(op)

    def _continue(self, op: _OpRun) -> None:
        """After a lost task or a restart: the op's remaining tasks in a fresh worker, unless -x stops here."""
        op.worker.close()
        if op.remaining() and not stops_run(self.settings, op.report.results):
            self._spawn(op)
        else:
            self._finish(op)

    def _finish(self, op: _OpRun) -> None:
        op.worker.close()
        op.report.seconds = time.monotonic() - op.started
        del self.active[op.slot]
        self.reserved.difference_update(part.slot for part in op.waiting)  # its first part never loaded
        op.waiting = []
        if op.parts > 1 and not any(other.report is op.report for other in self.active.values()):
            in_task_order(op.report, op.tasks or ())
        if stops_run(self.settings, op.report.results):
            self.stopped = True


def in_task_order(report: OpReport, tasks: tuple[TaskHeader, ...]) -> None:
    """An op's results as one worker would have reported them (the load result and the skipped results first, then
    task by task), however its parts' results interleaved: a report that does not depend on which worker ran what."""
    position = {(t.implementation, t.case_id, name): i for i, t in enumerate(tasks) for name in t.results}
    report.results.sort(key=lambda r: position.get((r.implementation, r.case_id, r.check), -1))


def _with_stderr(how: str, worker: Worker) -> str:
    tail = worker.stderr_excerpt()
    return f"{how}. Last lines of its stderr:\n{tail}" if tail else f"{how}. It wrote nothing to stderr."


def _worker_env(environ: dict[str, str], jobs: int) -> dict[str, str]:
    env = with_this_opforge(environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_worker(jobs, os.cpu_count()))
    return env


def run_isolated(
    specs: list[OpSpec],
    filters: Filters,
    settings: RunSettings,
    isolation: Isolation,
    run: RunReport,
    events: Events | None = None,
) -> None:
    """Every spec's checks in worker processes (the isolated counterpart of engine.inprocess.run_in_process)."""
    Supervisor(specs, filters, settings, isolation, run, events or Events()).execute()
