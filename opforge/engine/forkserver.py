"""A fork server for an isolated run's workers: one process per run imports torch, torch._dynamo and opforge's
checks (about 2 s of CPU), then forks each worker from that state in milliseconds. An op's first worker, its fresh
worker after a crash, a hang or a CUDA fault, and every other op's worker would each pay those imports again.

The server never loads an op and never touches CUDA or OpenMP's threads: a forked child could not use a CUDA context
made before the fork, and a process that has used OpenMP's threads hangs its forked children. Each worker loads its
op and makes its own context after the fork, as a freshly started worker would (fuzz's worker forks its children
from a loaded op on the same terms).

Protocol over a Unix SEQPACKET socket (the server's stdin), one JSON object per packet: the parent sends
{"job", "env"} with two descriptors (the worker's protocol pipe and its stderr file); the server answers "ready"
once its imports are done, "forked" (the worker's pid) for each request, and "exited" (pid, exit code as
subprocess reports it) when a worker ends. Each worker is the leader of a session of its own, as a worker started
with Popen(start_new_session=True) is, so that killing its process group takes whatever it started.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from typing import IO, Any

from opforge.child import ChildIO, end_session, file_excerpt, start_in_session
from opforge.errors import WorkerInternalError

# Bytes of one request: the job line (filters, settings, paths) and the environment, far under this.
MAX_PACKET = 1 << 20
# How often the server looks for workers that have ended: it reports each within this, and the supervisor polls a
# dying worker every EXIT_POLL (0.05 s) anyway.
REAP_INTERVAL = 0.02
# The server's imports take ~2 s on CI's 2-core VM; a machine under load (or a cold disk) more. Past this the run
# starts its workers as separate processes instead.
READY_TIME_LIMIT = 300.0
# How long a fork request may wait for its answer: a fork takes milliseconds.
FORK_TIME_LIMIT = 60.0
# How long the server may take to end once the run closes its socket (it only has to notice) before it is killed.
EXIT_GRACE = 5.0


# ------------------------------------------------------------------------------------------ the parent's side


class ForkServer:
    """The parent's handle on the server: fork() gives a ForkedWorker; close() ends the server."""

    def __init__(self, environ: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept for the server's life, closed by close())
        server_env = dict(environ)
        # is_available() without initializing CUDA, should anything imported ask it: a forked worker could not use
        # a CUDA context made here. Workers get the run's own environment back.
        server_env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        self.proc = start_in_session(
            "opforge.engine.forkserver", server_env, theirs.fileno(), subprocess.DEVNULL, self.stderr
        )
        theirs.close()
        self.socket = ours
        self.exits: dict[int, int] = {}
        self.last_words = ""  # the end of its stderr, once closed

    def wait_ready(self, limit: float = READY_TIME_LIMIT) -> bool:
        """Whether the server finished its imports within `limit` seconds (False: it died or is stuck there)."""
        try:
            return self._next("ready", limit) is not None
        except WorkerInternalError:
            return False

    def fork(self, job_line: str, env: Mapping[str, str]) -> ForkedWorker:
        read_end, write_end = os.pipe()
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the worker's; closed by ForkedWorker.close())
        try:
            try:
                request = json.dumps({"job": job_line, "env": dict(env)}).encode()
                socket.send_fds(self.socket, [request], [write_end, stderr.fileno()])
            finally:
                os.close(write_end)  # the worker's copy is then the only one: its exit ends the pipe
            answer = self._next("forked", FORK_TIME_LIMIT)
            if answer is None:
                raise WorkerInternalError(f"the fork server did not fork a worker within {FORK_TIME_LIMIT:g} s")
        except BaseException:
            os.close(read_end)
            stderr.close()
            raise
        return ForkedWorker(self, int(answer["pid"]), os.fdopen(read_end, "rb", buffering=0), stderr)

    def exit_code(self, pid: int, block: bool) -> int | None:
        """The worker's exit code once the server has reported it; with `block`, waits for it."""
        while (message := self._read(0.0)) is not None:
            self._keep(message)
        while block and pid not in self.exits:
            self._keep(self._read(None))
        return self.exits.get(pid)

    def close(self) -> None:
        if self.socket.fileno() == -1:
            return
        self.socket.close()  # the server ends when it reads the end of its socket
        end_session(self.proc, EXIT_GRACE)
        self.last_words = self._stderr_tail()
        self.stderr.close()

    def _next(self, event: str, limit: float) -> dict[str, Any] | None:
        """The next message of kind `event` (the exits that come first are kept), or None after `limit` seconds."""
        deadline = time.monotonic() + limit
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._read(remaining)
            if message is not None and message["event"] == event:
                return message
            self._keep(message)
        return None

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message, None if none came within `timeout` seconds (None: wait for one). A worker
        whose end the server can no longer report (it died, or the run closed it after it failed) is an internal
        error: its exit status is lost with it."""
        if self.socket.fileno() == -1:
            raise WorkerInternalError(f"the fork server has ended: {self.last_words}")
        readable, _, _ = select.select([self.socket], [], [], timeout)
        if not readable:
            return None
        packet = self.socket.recv(MAX_PACKET)
        if not packet:
            raise WorkerInternalError(f"the fork server has ended: {self._stderr_tail()}")
        message: dict[str, Any] = json.loads(packet)
        return message

    def _keep(self, message: dict[str, Any] | None) -> None:
        if message is not None and message["event"] == "exited":
            self.exits[int(message["pid"])] = int(message["code"])

    def _stderr_tail(self) -> str:
        return file_excerpt(self.stderr) or "it wrote nothing to stderr"


class ForkedWorker(ChildIO):
    """A worker forked by the server: the same interface as a started one (ChildProcess) for the supervisor."""

    def __init__(self, server: ForkServer, pid: int, stdout: IO[bytes], stderr: IO[bytes]):
        super().__init__(stdout, stderr)
        self.server = server
        self.pid = pid

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid, block=False)

    def wait(self) -> int:
        code = self.server.exit_code(self.pid, block=True)
        assert code is not None  # exit_code(block=True) returns only once it has one
        return code

    def kill(self) -> None:
        with contextlib.suppress(WorkerInternalError):  # with the server gone, its end is unknown: kill it anyway
            if self.poll() is not None:
                return  # reaped: its pid may already name another process
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet the leader of its own session: it is still the server's child
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Ends the worker and whatever it left running in its session."""
        if self.stdout.closed:
            return
        self.kill()
        try:
            self.wait()
        finally:
            self.stdout.close()
            self.stderr.close()


# ------------------------------------------------------------------------------------------ the server's side


def main() -> None:
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # whatever an import prints goes to stderr
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _preload()
    _send(control, {"event": "ready"})
    while True:
        _report_exits(control)
        readable, _, _ = select.select([control], [], [], REAP_INTERVAL)
        if not readable:
            continue
        packet, fds, _, _ = socket.recv_fds(control, MAX_PACKET, 2)
        if not packet:
            return  # the parent closed its end: the run is over
        pid = os.fork()
        if pid == 0:
            _become_worker(control, json.loads(packet), fds)
        for fd in fds:
            os.close(fd)
        _send(control, {"event": "forked", "pid": pid})


# What every worker imports before its op: torch, torch._dynamo (an op's first call imports it) and the checks
# (opforge.engine.worker's imports).
_PRELOADED = (
    "torch._dynamo",
    "opforge.engine.plan",
    "opforge.engine.tasks",
    "opforge.engine.worker",
    "opforge.environment",
    "opforge.loading",
)


def _preload() -> None:
    for module in _PRELOADED:
        importlib.import_module(module)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no worker alive
        if pid == 0:
            return
        _send(control, {"event": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _become_worker(control: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """The forked child: a worker as opforge.engine.worker.main would be, on the descriptors it was sent. Never
    returns."""
    code = 1
    try:
        control.close()
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        protocol, stderr = fds
        os.dup2(stderr, 2)
        os.close(stderr)
        os.environ.clear()
        os.environ.update(request["env"])
        from opforge.engine.worker import serve

        serve(request["job"], protocol)
        code = 0
    except BaseException:  # anything must end this process here, never return into the server's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    control.send(json.dumps(message).encode())


if __name__ == "__main__":
    main()
