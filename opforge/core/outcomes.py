"""Outcomes: what a check says about one case, before the engine makes each a verdict and a result (see "Words" in
docs/architecture.md): the exceptions and values every check, the engine and bench's verification share.

A check returns one outcome per result it owns: None for a pass, a PassNote for a pass with something to report,
or a CheckFailure. It may also raise: CheckFailure (the op did something wrong: FAIL), ReferenceFailure (the spec's
reference or the inputs broke, not the op: ERROR), CheckSkipped (the case cannot run here: SKIP).
"""

from __future__ import annotations

import re

from opforge.core.results import Mismatch

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


class PassDetail:
    """A pass with a detail too routine for the summary, for whoever looks closer (`-v`, the JSON report): how many
    graphs torch.compile built for the task."""

    def __init__(self, detail: str):
        self.detail = detail


class ReferenceFailure(Exception):
    """The spec's reference (not the op) failed. Becomes an ERROR result."""


class CheckSkipped(Exception):
    """The check cannot run this case here (no GPU memory for it, a device that is missing). Becomes a SKIP result
    with the message as its reason."""


Outcome = CheckFailure | PassNote | PassDetail | None


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


# How a compiled graph's run-time check of a data-dependent size (an unbacked SymInt, u0, u1, ...) against the lower
# bound its fake kernel declared reads when the real size falls below it: inductor raises the bare expression.
UNBACKED_LOWER_BOUND = re.compile(r"^(u\d+) >= (\d+)$", re.MULTILINE)


def unbacked_size_hint(exc: BaseException) -> str:
    """What a failed run-time check like `u0 >= 2` means: torch.compile trusted the lower bound a fake kernel gave a
    data-dependent output size, and the real output was smaller. Empty for any other error."""
    guard = UNBACKED_LOWER_BOUND.search(str(exc))
    if guard is None:
        return ""
    size, minimum = guard.groups()
    return (
        f": the op's fake kernel gives an output a data-dependent size ({size}, an unbacked SymInt) with a lower bound "
        f"of {minimum}, and the real output was smaller, so the compiled graph's check of it failed. "
        "ctx.create_unbacked_symint() (deprecated) has a minimum of 2: make the size with "
        "torch.library.get_ctx().new_dynamic_size() (minimum 0), passing min= and max= only for bounds the kernel "
        "guarantees for every input. For a fake kernel that is not yours (torchvision's nms), xfail the compile result "
        f"for the cases whose output has fewer than {minimum} elements."
    )
