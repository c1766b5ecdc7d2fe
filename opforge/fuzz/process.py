"""The parent's side of the fuzz worker (opforge.fuzz.worker): start it, hand it one example at a time, and turn
a child that died or hung in an example into that example's failure. Nothing here imports torch."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from opforge.checks.catalog import CATALOG
from opforge.core.child import (
    EXIT_GRACE,
    LOAD_TIME_LIMIT,
    ChildProcess,
    describe_exit,
    file_tail,
    with_this_opforge,
)
from opforge.core.errors import OpforgeError, WorkerInternalError
from opforge.core.protocol import (
    Died,
    ExampleStart,
    FuzzExample,
    FuzzJob,
    Judged,
    LoadError,
    Message,
    ProtocolError,
    Ready,
    Space,
    Timed,
    decode,
)
from opforge.core.results import Status, Verdict
from opforge.engine.forkserver import shared_server
from opforge.fuzz.verdict import CRASHED, HUNG, TOO_COSTLY
from opforge.spec.model import Regression

_M = TypeVar("_M", bound=Message)

# A fork of the loaded worker answers "ready" in ~0.1 s here; a machine under load gets more.
READY_TIME_LIMIT = 60.0
# An example whose reference and first op call take more than this share of the example's limit is too costly to
# judge (a discard, not a hang): torchvision's roi_align on 3,200 rois of 1,910 transposed channels (36.7 M outputs)
# took 4.6 s in its float64 reference and 17 s in the op here, and its oracles 80 s more.
COSTLY_SHARE = 1 / 3
# How many more calls of the reference and the op together the oracles may make after the first: correctness (the
# op, the reference, the baseline in the dtype and Baseline.spread's five float64 runs), fake, determinism's two,
# devices' two, compile's eager call; on a failure, the same oracle again without the example's special value (its
# cause) and, for correctness, the reference and its baseline once more (an integer output the dtype cannot decide).
# The rest of the example may take the limit plus that many times the first calls' time.
ORACLE_CALLS = 26
# A child past the oracles' limit is asked for its Python stack (faulthandler, on SIGUSR1) before it is killed;
# this is how long its account may take to reach its stderr (written at once from the signal handler, even in C code).
STACK_WAIT_S = 0.5
# A stack inside the comparison or a call of the reference, and inside no call of the op: the example is still
# being judged (an oracle's reference run, an allowance rerunning it), which is no hang of the op. A spec without
# `reference:` has the op itself as its reference (self_reference.py), so its reference runs are calls of the op.
JUDGING_FRAMES = ("opforge/cases/compare.py", "in call_reference")
OP_CALL_FRAMES = ("in call_implementation", "opforge/building/self_reference.py")


class LoadFailed(OpforgeError):
    """The op did not load in the worker (a spec, import or build error): the worker's own message and code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class FuzzWorker(ChildProcess):
    """One worker process for one op, forked from this process's fork server where there is one. `run(example)`
    returns its verdict; a child that dies or outlasts `time_limit` in it is a failure ("crash" or "hang") and the
    next example gets a fresh child."""

    def __init__(self, spec_path: Path, cuda_arch: str | None, time_limit: float):
        environ = with_this_opforge(os.environ)
        super().__init__("opforge.fuzz.worker", environ, shared_server(environ))
        self.time_limit = time_limit
        # The case id of the example run last (ExampleStart), for the xfail entries that declare its crash.
        self.case_id = ""
        self._pending: deque[bytes] = deque()
        self.send(FuzzJob(str(spec_path), cuda_arch).to_line())
        loaded = self._next(LOAD_TIME_LIMIT, "loading the op")
        if isinstance(loaded, LoadError):
            self._load_failed(loaded)
        self.space: dict[str, Any] = self._expect(loaded, Space).space
        self.child = self._ready()

    def run(self, example: Regression, oracles: tuple[str, ...]) -> Verdict:
        mark = self.stderr_size()  # before the child can write (and crash)
        self.send(FuzzExample(asdict(example), oracles).to_line())
        started = self._next(READY_TIME_LIMIT, "an example's start")
        if isinstance(started, Died):
            raise WorkerInternalError(f"the fuzz worker's child died before an example: {started.how}")
        self.case_id = self._expect(started, ExampleStart).case_id
        answer = self._timed_answer(oracles)
        if isinstance(answer, Verdict):
            return answer
        if isinstance(answer, Died):
            tail = self._stderr_since(mark)
            self.child = self._ready()
            died = f"the op's process died: {answer.how}" + (f"; stderr: {tail}" if tail else "")
            return Verdict(Status.FAIL, died, oracle=CRASHED)
        judged = self._expect(answer, Judged)
        if judged.restart:
            self._until_died()
            self.child = self._ready()
        return judged.verdict

    def close(self, grace: float = EXIT_GRACE) -> None:
        super().close(grace)

    # --------------------------------------------------------------------------------------------------- inside

    def _load_failed(self, error: LoadError) -> None:
        tail = self._stderr_since(0) if error.died else ""
        self.close()  # raised from __init__ too, where no caller holds the worker to close it
        raise LoadFailed(error.message + (f"; stderr: {tail}" if tail else ""), error.exit_code)

    def _ready(self) -> int:
        ready = self._next(READY_TIME_LIMIT, "a fresh child")
        if isinstance(ready, LoadError):  # it loads the op again, which the planning child loaded
            self._load_failed(ready)
        return self._expect(ready, Ready).pid

    def _expect(self, message: Message, kind: type[_M]) -> _M:
        """`message` where the protocol says a `kind` comes next; anything else is the worker's bug."""
        if not isinstance(message, kind):
            raise ProtocolError(f"the fuzz worker sent {message.kind!r} where {kind.kind!r} was expected: {message}")
        return message

    def _timed_answer(self, oracles: tuple[str, ...]) -> Message | Verdict:
        """The child's last event on an example, each phase under its own limit: the first reference call (past a
        share of the limit the example is too costly), the op's first call (past the limit it hangs), the oracles
        (the limit plus ORACLE_CALLS times the first calls' time). An example stopped on the way is its Verdict."""
        costly = self.time_limit * COSTLY_SHARE
        answer = self._within(costly)
        if answer is None:
            return self._abandoned(Status.DISCARD, f"the reference ran past {costly:g} s")
        if not (isinstance(answer, Timed) and answer.phase == "reference"):  # refused by the reference, or died
            return answer
        reference_seconds = answer.seconds
        answer = self._within(self.time_limit)
        if answer is None:
            return self._abandoned(Status.FAIL, f"the op ran past the {self.time_limit:g} s limit of one call")
        if not (isinstance(answer, Timed) and answer.phase == "op"):  # the op refused the call, or its process died
            return answer
        cost = reference_seconds + answer.seconds
        if cost > costly:
            return self._abandoned(Status.DISCARD, f"the reference and one call of the op took {cost:.3g} s")
        limit = self.time_limit + ORACLE_CALLS * cost + _extra_seconds(oracles)
        answer = self._within(limit)
        if answer is not None:
            return answer
        # This limit covers the judging too (the comparison's allowances run the reference again): the child's stack
        # tells an example still being judged from an op that hangs.
        if self._judging():
            return self._abandoned(Status.DISCARD, f"judging the example ran past the oracles' {limit:.3g} s limit")
        return self._abandoned(
            Status.FAIL,
            f"the example's oracles ran past their {limit:.3g} s limit in a later call of the op (the reference and "
            f"the op's first call took {cost:.3g} s)",
        )

    def _judging(self) -> bool:
        """Whether the child, asked for its stack, is judging (still_judging)."""
        mark = self.stderr_size()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, signal.SIGUSR1)
        time.sleep(STACK_WAIT_S)
        return still_judging(file_tail(self.stderr, mark))

    def _within(self, limit: float) -> Message | None:
        """The child's next event, or None when it sent none within `limit` seconds."""
        try:
            return self._next(limit, "")
        except TimeoutError:
            return None

    def _abandoned(self, status: Status, why: str) -> Verdict:
        """The example stopped where it was (its child killed, a fresh one ready): a hang, or too costly to judge."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, signal.SIGKILL)
        self._until_died()
        self.child = self._ready()
        if status == Status.FAIL:
            return Verdict(Status.FAIL, why, oracle=HUNG)
        return Verdict(Status.DISCARD, f"{why}: too costly to judge", cause=TOO_COSTLY)

    def _until_died(self) -> None:
        while not isinstance(self._next(READY_TIME_LIMIT, "a killed child's end"), Died):
            pass

    def _next(self, limit: float, waiting_for: str) -> Message:
        """The next event, within `limit` seconds: TimeoutError past it (when waiting for an example's verdict),
        else the worker's own failure as an internal error."""
        deadline = time.monotonic() + limit
        while not self._pending:
            readable, _, _ = select.select([self], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                if not waiting_for:
                    raise TimeoutError
                raise WorkerInternalError(f"the fuzz worker sent nothing for {limit:g} s while {waiting_for}")
            lines = self.read_lines()
            if lines is None:
                raise WorkerInternalError(
                    f"the fuzz worker ended ({describe_exit(self.proc.wait(timeout=5))}): "
                    f"{self._stderr_since(0) or 'no output'}"
                )
            self._pending.extend(lines)
        return decode(self._pending.popleft())

    def _stderr_since(self, mark: int) -> str:
        # What `opforge check` quotes of a dead worker (faulthandler's account of a fatal signal, else the last
        # lines: a traceback's exception), on one line.
        return " | ".join(line.strip() for line in self.stderr_excerpt(mark).splitlines() if line.strip())


def still_judging(stack: str) -> bool:
    """Whether a child's stack (faulthandler's account) is inside the comparison or a reference call, and inside no
    call of the op."""
    return any(f in stack for f in JUDGING_FRAMES) and not any(f in stack for f in OP_CALL_FRAMES)


def _extra_seconds(oracles: tuple[str, ...]) -> float:
    """What the oracles add to an example's limit beyond their calls of the op (OneExample.extra_seconds: compile's
    compiling)."""
    judging = [CATALOG.oracles[name].one_example for name in oracles]
    return sum(one.extra_seconds for one in judging if one is not None)
