"""A process opforge runs an op in (the check engine's workers, fuzz's worker): started so that the current
directory cannot shadow opforge or torch, in a session of its own, its stderr kept for the quote after a death, its
protocol read as lines from its stdout. Nothing here imports torch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol

from opforge.core.errors import WorkerInternalError

# Lines of a worker's stderr quoted in a CRASH/TIMEOUT result: faulthandler's account of a fatal signal (the error line,
# a blank, the thread header and the innermost frames) fits in 20, and a longer quote buries the result in a CI log.
STDERR_TAIL_LINES = 20
# Bytes of stderr read back to find those lines: a chatty op (inductor's logs) can write megabytes, and 64 KiB holds
# the last 20 lines of any log whose lines are under ~3 KiB.
STDERR_KEPT_BYTES = 64 * 1024
# Bytes read from a worker's protocol pipe at once: Linux's default pipe capacity, so one read drains a full pipe.
READ_CHUNK = 64 * 1024
# How long loading an op may take in any child (the engine's workers, fuzz's): loading may build it, and a cold build
# of CUDA sources for several architectures takes minutes (~40 s per .cu file and architecture on the 2-core VM, 2-3
# archs per file, several files), so an hour only catches a load that hangs, long before a CI job's own limit would.
LOAD_TIME_LIMIT = 3600.0
# How long a child that is ending (its protocol closed, or its stdin) may take to exit before it is killed. Exiting
# takes milliseconds; CUDA teardown after a fault was the slowest seen (~1-2 s).
EXIT_GRACE = 10.0


def entry_point(module: str) -> list[str]:
    """`python -c` running `module.main()`, so that sys.path[0] is the '' Python adds (the current directory) and can
    be dropped: a checkout's or a spec directory's `opforge/` or `torch.py` in the cwd must not shadow the installed
    ones (PYTHONPATH still comes first). `python -m` would put the cwd first; `python -P` drops it only from 3.11."""
    code = f"import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\nfrom {module} import main\nmain()\n"
    return [sys.executable, "-c", code]


class Process(Protocol):
    """What opforge needs of a started child: subprocess.Popen's pid, returncode, poll() and wait(), or a fork
    server's ForkedProcess's."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Forker(Protocol):
    """A fork server (opforge.engine.forkserver.ForkServer): `module`'s main() in a child forked on the given
    descriptors. Raises WorkerInternalError where it cannot."""

    def spawn(self, module: str, environ: Mapping[str, str], stdin: int, stdout: int, stderr: int) -> Process: ...


class ChildProcess:
    """A child in its own session: Ctrl-C at a terminal reaches the parent only, and kill() takes its whole process
    group (inductor's compile workers, fuzz's forked children). Its protocol is read as lines from its stdout; its
    stderr goes to a file kept until close(), read after it is gone. `environ` is its whole environment
    (with_this_opforge's, at least). Forked by `forker` where one is given and can (it imported torch already), else
    started as a process of its own."""

    def __init__(self, module: str, environ: Mapping[str, str], forker: Forker | None = None):
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept for the child's life, closed by close())
        try:
            pipes = _forked(forker, module, environ, stderr) or _started(module, environ, stderr)
        except BaseException:
            stderr.close()
            raise
        self.proc, self.stdin, self.stdout = pipes
        self.stderr = stderr
        self._buffer = b""

    def fileno(self) -> int:
        return self.stdout.fileno()

    def read_lines(self) -> list[bytes] | None:
        """The complete, non-blank lines readable now (one read: call it when select says so); None at the end of
        the stream."""
        chunk = os.read(self.fileno(), READ_CHUNK)
        if not chunk:
            return None
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def stderr_size(self) -> int:
        return os.fstat(self.stderr.fileno()).st_size

    def stderr_excerpt(self, since: int = 0) -> str:
        return file_excerpt(self.stderr, since)

    def send(self, line: str) -> None:
        self.stdin.write(line.encode() + (b"" if line.endswith("\n") else b"\n"))
        self.stdin.flush()

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        return self.proc.wait()

    def kill(self) -> None:
        kill_session(self.proc)

    def close(self, grace: float = 0.0) -> None:
        """Ends the child (after up to `grace` seconds to exit on its own once its stdin is closed) and whatever it
        left running in its group."""
        if self.stdout.closed:
            return
        with contextlib.suppress(BrokenPipeError):
            self.stdin.close()
        try:
            end_session(self.proc, grace)
        finally:
            self.stdout.close()
            self.stderr.close()


_Pipes = tuple[Process, IO[bytes], IO[bytes]]


def _forked(forker: Forker | None, module: str, environ: Mapping[str, str], stderr: IO[bytes]) -> _Pipes | None:
    """A child forked on two new pipes (its stdin and stdout) and `stderr`, and the parent's ends of the pipes; None
    without a forker, or where it has died or does not answer (the child then starts as a process of its own)."""
    if forker is None:
        return None
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    try:
        proc = forker.spawn(module, environ, stdin_read, stdout_write, stderr.fileno())
    except BaseException as exc:
        os.close(stdin_write)
        os.close(stdout_read)
        if isinstance(exc, WorkerInternalError):
            return None
        raise
    finally:
        os.close(stdin_read)  # the child has its own copies: its end of stdout closes with it
        os.close(stdout_write)
    return proc, os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb", buffering=0)


def _started(module: str, environ: Mapping[str, str], stderr: IO[bytes]) -> _Pipes:
    proc = start_in_session(module, environ, subprocess.PIPE, subprocess.PIPE, stderr)
    assert proc.stdin is not None and proc.stdout is not None  # both asked for as PIPE
    return proc, proc.stdin, proc.stdout


def start_in_session(
    module: str, environ: Mapping[str, str], stdin: int | IO[bytes], stdout: int | IO[bytes], stderr: IO[bytes]
) -> subprocess.Popen[bytes]:
    """`module`'s main() (entry_point) in a session of its own: Ctrl-C at a terminal reaches the parent only, and
    end_session's kill takes whatever it started. `environ` is its whole environment."""
    return subprocess.Popen(
        entry_point(module), stdin=stdin, stdout=stdout, stderr=stderr, env=dict(environ), start_new_session=True
    )


def end_session(proc: Process, grace: float) -> None:
    """Ends a child started by start_in_session or forked by a fork server, after up to `grace` seconds to exit on
    its own, and whatever it left running in its process group."""
    try:
        if grace and proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
    finally:
        kill_session(proc)
        proc.wait()


def kill_session(proc: Process) -> None:
    """Kills the child's process group: the child and whatever it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        # No such group: ended and reaped, or a forked child that has not yet made its own session (a started one
        # leads its group before Popen returns). Only the latter may be killed by pid: a reaped one's may be reused.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


def file_excerpt(file: IO[bytes], since: int = 0) -> str:
    """stderr_excerpt of what a child wrote to `file` after `since` bytes (at most the last STDERR_KEPT_BYTES); the
    file is left positioned at its end."""
    return stderr_excerpt(file_tail(file, since))


def file_tail(file: IO[bytes], since: int = 0) -> str:
    """What a child wrote to `file` after `since` bytes, at most its last STDERR_KEPT_BYTES (a child that logs
    without end must not fill the parent's memory); the file is left positioned at its end."""
    file.seek(max(since, os.fstat(file.fileno()).st_size - STDERR_KEPT_BYTES))
    text = file.read().decode("utf-8", "replace")
    file.seek(0, os.SEEK_END)
    return text


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"{signal.Signals(-returncode).name} (signal {-returncode})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def stderr_excerpt(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last lines of a worker's stderr; for a fatal signal, Python's own account of it instead (faulthandler's
    "Fatal Python error" and the innermost frames, which come first), without the list of extension modules."""
    all_lines = text.rstrip().splitlines()
    fatal = next((i for i in range(len(all_lines) - 1, -1, -1) if all_lines[i].startswith("Fatal Python error")), None)
    if fatal is None:
        return "\n".join(all_lines[-lines:])
    report = [line for line in all_lines[fatal:] if line.strip()]
    report = [line for line in report if not line.startswith(("Extension modules:", "(total:"))]
    return "\n".join(report[:lines])


def with_this_opforge(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a worker process that imports this opforge, wherever it came from (an install, a checkout, a
    test's sys.path)."""
    env = dict(environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env
