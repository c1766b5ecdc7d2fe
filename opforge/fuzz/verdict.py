"""What one fuzz example showed, as the worker sends it and the search reads it (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from opforge.results import Mismatch

PASS, FAIL, KNOWN, REJECT, DISCARD = "pass", "fail", "known", "reject", "discard"


@dataclass(frozen=True)
class Verdict:
    """pass; fail (which oracle, why: "crash" and "hang" when the op's process died or stalled); known (a failure
    the spec's xfail declares for that check and case: counted, not searched for again); reject (the op
    refused a call the reference took: a narrower domain, counted, not a failure); discard (the reference refused
    it: outside the op's domain)."""

    status: str
    oracle: str = ""
    message: str = ""
    mismatch: Mismatch | None = None
