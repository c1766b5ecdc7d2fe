"""A fork server for the processes opforge runs ops in (the check engine's workers, fuzz's worker): one process
imports torch, torch._dynamo and opforge's checks (about 2 s of CPU), then forks each of them from that state in
milliseconds. Each would otherwise pay those imports again: an op's first worker, its fresh worker after a crash, a
hang or a CUDA fault, every other op's worker, every fuzz search's worker.

One server per environment, shared by every run of this process (shared_server): the CLI's one run, and the test
suite's or a notebook's many. It lives until the process ends, or until a run finds it dead or misbehaving.

The server never loads an op and never touches CUDA or OpenMP's threads: a forked child could not use a CUDA context
made before the fork, and a process that has used OpenMP's threads hangs its forked children. Each child loads its
op and makes its own context after the fork, as a freshly started process would.

The messages of opforge.core.protocol over a Unix SEQPACKET socket (the server's stdin), one per packet: the
parent sends a Fork with three descriptors (the child's stdin, stdout and stderr), which the child runs
`module.main()` on, as a process started with child.start_in_session would; the server answers ServerReady once
its imports are done, Forked (the child's pid) for each request, and Exited (pid, exit code as subprocess reports
it) when a child ends. Each child is the leader of a session of its own, so that killing its process group takes
whatever it started.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
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
from typing import TypeVar

from opforge.core.child import EXIT_GRACE, end_session, file_excerpt, start_in_session
from opforge.core.errors import WorkerInternalError
from opforge.core.protocol import Exited, Fork, Forked, Message, ServerReady, decode, encode

_M = TypeVar("_M", bound=Message)

# Bytes of one request: the module, the environment and the working directory, far under this.
MAX_PACKET = 1 << 20
# The server's imports take ~2 s on CI's 2-core VM; a machine under load (or a cold disk) more. Past this the run
# starts its children as processes of their own instead.
READY_TIME_LIMIT = 300.0
# How long a fork request may wait for its answer: a fork takes milliseconds.
FORK_TIME_LIMIT = 60.0
# Variables that may change between the runs of one process and that nothing the server imports reads: pytest's
# name of the running test, and how a terminal renders (a run's CliRunner sets NO_COLOR). A server is shared only
# by runs whose environments are otherwise equal: torch, dynamo and inductor read many variables when imported.
PER_RUN_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES"})
# Servers kept at once, the least recently used closed first. Two: a run with -j 2 gives its workers
# OMP_NUM_THREADS, which OpenMP reads when the server imports torch, so a test suite that runs -j 1 and -j 2 keeps
# one server for each (each holds ~300 MB resident: torch and dynamo imported).
MAX_SHARED_SERVERS = 2


def forks_children() -> bool:
    """Whether children are forked from a fork server (Linux: Unix sockets that carry descriptors, and fork after
    torch's import, as fuzz's worker does) rather than each started as a process of its own."""
    return sys.platform == "linux"


_Environment = frozenset[tuple[str, str]]
# The servers of this process by environment, least recently used first.
_shared: dict[_Environment, ForkServer] = {}


def shared_server(environ: Mapping[str, str]) -> ForkServer | None:
    """This process's ready fork server for children whose environment is `environ`, started and waited for on
    first use; None where forking is not available or the server did not start (children then start as processes
    of their own)."""
    if not forks_children():
        return None
    key = frozenset((name, value) for name, value in environ.items() if name not in PER_RUN_VARIABLES)
    server = _shared.pop(key, None)
    if server is not None and not server.alive():
        server.close()
        server = None
    if server is None:
        server = ForkServer(dict(key))
        if not server.wait_ready():
            server.close()
            return None
    _shared[key] = server
    while len(_shared) > MAX_SHARED_SERVERS:
        _shared.pop(next(iter(_shared))).close()
    return server


@atexit.register
def close_shared_servers() -> None:
    while _shared:
        _shared.popitem()[1].close()


def _forget_servers() -> None:
    """In a process forked from this one, which does not own the servers: closing them at its exit would kill the
    ones this process still uses."""
    _shared.clear()


os.register_at_fork(after_in_child=_forget_servers)


# ------------------------------------------------------------------------------------------ the parent's side


class ForkServer:
    """The parent's handle on a server: spawn() forks a child (a ForkedProcess); close() ends the server. One
    thread at a time."""

    def __init__(self, environ: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept for the server's life, closed by close())
        server_env = dict(environ)
        # is_available() without initializing CUDA, should anything imported ask it: a forked child could not use
        # a CUDA context made here. Children get their own environment.
        server_env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        self.proc = start_in_session(
            "opforge.engine.forkserver", server_env, theirs.fileno(), subprocess.DEVNULL, self.stderr
        )
        theirs.close()
        self.socket = ours
        self.exits: dict[int, int] = {}  # reported, not yet asked for
        self.last_words = ""  # the end of its stderr, once closed

    def wait_ready(self, limit: float = READY_TIME_LIMIT) -> bool:
        """Whether the server finished its imports within `limit` seconds (False: it died or is stuck there)."""
        try:
            return self._next(ServerReady, limit) is not None
        except WorkerInternalError:
            return False

    def alive(self) -> bool:
        return self.socket.fileno() != -1 and self.proc.poll() is None

    def spawn(self, module: str, environ: Mapping[str, str], stdin: int, stdout: int, stderr: int) -> ForkedProcess:
        """`module`'s main() in a child forked on these descriptors (copies: the caller closes its own), in the
        current working directory, with `environ` as its whole environment. WorkerInternalError where the server
        cannot fork it (it has died, or did not answer)."""
        request = Fork(module, dict(environ), _working_directory())
        try:
            socket.send_fds(self.socket, [encode(request).encode()], [stdin, stdout, stderr])
        except OSError as exc:
            raise WorkerInternalError(f"the fork server has ended ({exc}): {self._stderr_tail()}") from exc
        answer = self._next(Forked, FORK_TIME_LIMIT)
        if answer is None:
            self.close()  # stuck: later requests fail at once, and shared_server starts a new one
            raise WorkerInternalError(f"the fork server did not fork a child within {FORK_TIME_LIMIT:g} s")
        pid = answer.pid
        self.exits.pop(pid, None)  # an earlier child's, which had this pid and ended before this one was forked
        return ForkedProcess(self, pid)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code once the server has reported it, waiting up to `timeout` seconds (None: until it
        does); None if it has not ended by then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exits:
            message = self._read(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if message is None:
                return None
            self._keep(message)
        return self.exits.pop(pid)

    def close(self) -> None:
        if self.socket.fileno() == -1:
            return
        self.socket.close()  # the server ends when it reads the end of its socket
        end_session(self.proc, EXIT_GRACE)
        self.last_words = self._stderr_tail()
        self.stderr.close()

    def _next(self, kind: type[_M], limit: float) -> _M | None:
        """The next message of type `kind` (the exits that come first are kept), or None after `limit` seconds."""
        deadline = time.monotonic() + limit
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._read(remaining)
            if isinstance(message, kind):
                return message
            self._keep(message)
        return None

    def _read(self, timeout: float | None) -> Message | None:
        """The server's next message, None if none came within `timeout` seconds (None: wait for one). A child
        whose end the server can no longer report (it died, or was closed after it failed) is an internal error:
        its exit status is lost with it."""
        if self.socket.fileno() == -1:
            raise WorkerInternalError(f"the fork server has ended: {self.last_words}")
        readable, _, _ = select.select([self.socket], [], [], timeout)
        if not readable:
            return None
        packet = self.socket.recv(MAX_PACKET)
        if not packet:
            raise WorkerInternalError(f"the fork server has ended: {self._stderr_tail()}")
        return decode(packet)

    def _keep(self, message: Message | None) -> None:
        if isinstance(message, Exited):
            self.exits[message.pid] = message.code

    def _stderr_tail(self) -> str:
        return file_excerpt(self.stderr) or "it wrote nothing to stderr"


class ForkedProcess:
    """A child forked by a server, as much of subprocess.Popen as opforge.core.child uses: its pid, poll(), wait(); its
    exit status comes from the server, which reaps it."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0.0)
        return self.returncode


def _working_directory() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:  # removed under this process: the child stays where the server is
        return None


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
    # A child's end wakes the loop (a byte on this pipe), which otherwise sleeps until a request comes: a server
    # kept for a whole test session costs no CPU while idle.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    _send(control, ServerReady())
    while True:
        _report_exits(control)
        readable, _, _ = select.select([control.fileno(), wake_read], [], [])
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        if control.fileno() not in readable:
            continue
        packet, fds, _, _ = socket.recv_fds(control, MAX_PACKET, 3)
        if not packet:
            return  # the parent closed its end: this process's runs are over
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice, by the child too
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _become_child(packet, fds, [control.fileno(), wake_read, wake_write])
        for fd in fds:
            os.close(fd)
        _send(control, Forked(pid))


# What every child imports before its op: torch, torch._dynamo (an op's first call imports it), the checks
# (opforge.engine.worker's imports) and fuzz's oracles.
_PRELOADED = (
    "torch._dynamo",
    "opforge.engine.plan",
    "opforge.engine.tasks",
    "opforge.engine.worker",
    "opforge.core.environment",
    "opforge.building.op",
    "opforge.fuzz.worker",
    "opforge.fuzz.oracles",
)


def _preload() -> None:
    for module in _PRELOADED:
        importlib.import_module(module)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child alive
        if pid == 0:
            return
        _send(control, Exited(pid, os.waitstatus_to_exitcode(status)))


def _become_child(packet: bytes, fds: list[int], servers: list[int]) -> None:
    """The forked child: `module.main()` on the descriptors it was sent, as a process started with
    child.start_in_session would run it. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in servers:
            os.close(fd)
        os.setsid()
        for signum in (signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        request = decode(packet)  # a request this server cannot read ends the child, its traceback on its stderr
        if not isinstance(request, Fork):
            raise TypeError(f"the fork server was sent a {request.kind!r} message where a fork request was expected")
        os.environ.clear()
        os.environ.update(request.env)
        if request.cwd is not None:
            os.chdir(request.cwd)
        importlib.import_module(request.module).main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # anything must end this process here, never return into the server's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _send(control: socket.socket, message: Message) -> None:
    control.send(encode(message).encode())


if __name__ == "__main__":
    main()
