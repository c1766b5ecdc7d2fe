"""Errors a user can act on. Each renders as "what: expected X, got Y. Do Z."."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The exit codes of every command: this is their one definition (README.md and docs/ci.md list them).
EXIT_OK = 0
EXIT_FAILED = 1  # a check failed, errored, crashed, timed out, or an xfail passed
EXIT_USAGE = 2  # bad usage or a bad spec
EXIT_BUILD = 3  # a C++/CUDA build failed
EXIT_INTERNAL = 4  # a bug in opforge
# Nothing was checked (or, for bench, timed): every case skipped, or none selected. Never a pass: a CI gate whose
# filters or machine leave nothing to run must not turn green. pytest's code for "no tests ran".
EXIT_NOTHING_RAN = 5
# 128 + SIGINT, as a shell reports a process stopped by Ctrl-C (SIGTERM is turned into the same stop).
EXIT_INTERRUPTED = 130


class OpforgeError(Exception):
    """Base of every error opforge reports to a user without a traceback."""

    exit_code = EXIT_USAGE


@dataclass
class SpecError(OpforgeError):
    """A spec file is malformed or disagrees with the registered op."""

    path: Path
    line: int | None
    key: str
    expected: str
    got: str
    hint: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        key = f" {self.key}" if self.key else ""
        return f"{where}:{key}: expected {self.expected}, got {self.got}. {self.hint}"


@dataclass
class UsageError(OpforgeError):
    what: str
    expected: str
    got: str
    hint: str

    def __str__(self) -> str:
        return f"{self.what}: expected {self.expected}, got {self.got}. {self.hint}"


@dataclass
class BuildError(OpforgeError):
    """A C++/CUDA source failed to compile or link."""

    name: str
    log_path: Path
    first_errors: list[str]

    exit_code = EXIT_BUILD

    def __str__(self) -> str:
        lines = "\n".join(self.first_errors)
        return (
            f"building {self.name}: expected the sources to compile, got:\n{lines}\n"
            f"Fix the first error above; the full log is {self.log_path}."
        )


@dataclass
class NothingToBuild(OpforgeError):
    """Every source of an op is CUDA and this machine cannot build CUDA."""

    name: str
    skipped: tuple[Path, ...]
    reason: str

    exit_code = EXIT_BUILD

    def __str__(self) -> str:
        names = ", ".join(p.name for p in self.skipped)
        return (
            f"building {self.name}: expected at least one source this machine can build, got only CUDA sources "
            f"({names}), and {self.reason}. Build on a machine with a CUDA toolkit and a CUDA build of torch, or add "
            "the op's C++ (CPU) sources to load.sources."
        )


class WorkerInternalError(Exception):
    """A bug in opforge surfaced inside a worker process. The message is one line; the worker's traceback is kept
    apart, for --debug only."""

    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message)
        self.worker_traceback = worker_traceback
