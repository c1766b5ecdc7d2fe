"""Errors a user can act on. Each renders as "what: expected X, got Y. Do Z."."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class OpforgeError(Exception):
    """Base of every error opforge reports to a user without a traceback."""

    exit_code = 2


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

    exit_code = 3

    def __str__(self) -> str:
        lines = "\n".join(self.first_errors)
        return (
            f"building {self.name}: expected the sources to compile, got:\n{lines}\n"
            f"Fix the first error above; the full log is {self.log_path}."
        )
