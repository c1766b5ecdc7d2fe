"""How a check's verdict on one case travels to the result row: the exceptions and values every check, the engine
and bench's verification share.

A check returns one outcome per result row it owns: None for a pass, a PassNote for a pass with something to report,
or a CheckFailure. It may also raise: CheckFailure (the op did something wrong: FAIL), ReferenceFailure (the spec's
reference or the inputs broke, not the op: ERROR), CheckSkipped (the case cannot run here: SKIP).
"""

from __future__ import annotations

from opforge.results import Mismatch

# Lines of an exception message kept in a result; the rest is noise (C++ stack frames, dispatcher dumps).
MESSAGE_LINES = 6


class CheckFailure(Exception):
    """The op under test did something wrong. Becomes a FAIL result."""

    def __init__(self, message: str, mismatch: Mismatch | None = None):
        super().__init__(message)
        self.message = message
        self.mismatch = mismatch


class PassNote:
    """A pass with something to report (a dtype the spec does not claim that works anyway)."""

    def __init__(self, message: str):
        self.message = message


class ReferenceFailure(Exception):
    """The spec's reference (not the op) failed. Becomes an ERROR result."""


class CheckSkipped(Exception):
    """The check cannot run this case here (no GPU memory for it, a device that is missing). Becomes a SKIP result
    with the message as its reason."""


Outcome = CheckFailure | PassNote | None


def short(exc: BaseException) -> str:
    """An exception as a result shows it: its type and the first lines of its message."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = "\n".join(lines[:MESSAGE_LINES])
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def missing_fake_hint(exc: BaseException) -> str:
    """What to do when an op had no fake (meta) kernel: fake tensors (opcheck, torch.compile, export) raise
    UnsupportedOperatorException or "does not support running with fake tensors", which names neither cause nor
    fix. Empty for any other error."""
    text = f"{type(exc).__name__} {exc}"
    if "UnsupportedOperatorException" not in text and "does not support running with fake tensors" not in text:
        return ""
    return (
        " The op has no fake (meta) kernel, which fake tensors need to know its outputs' shapes without running it: "
        'register one with @torch.library.register_fake("ns::op") in Python (or a Meta kernel in C++), returning '
        "empty tensors of the outputs' shapes, dtypes and strides."
    )
