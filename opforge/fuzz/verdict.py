"""What one fuzz example showed, as the worker sends it and the search reads it (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from opforge.results import Mismatch

PASS, FAIL, KNOWN, REJECT, DISCARD = "pass", "fail", "known", "reject", "discard"
# The oracle of a failure where the op's process died (or its CUDA context did) or stalled.
CRASHED, HUNG = "crash", "hang"

# Why an example was discarded (a discard's `cause`): nothing in it judged the op.
OUTSIDE_DOMAIN = "outside the reference's domain"
TOO_COSTLY = "too costly to judge"
UNDECIDABLE = "beyond what the case's dtype can decide"


@dataclass(frozen=True)
class Verdict:
    """pass; fail (which oracle, why: "crash" and "hang" when the op's process died or stalled); known (a failure
    the spec's xfail declares for that check and case: counted, not searched for again); reject (the op
    refused a call the reference took: a narrower domain, counted, not a failure); discard (nothing judged the op:
    the reference refused the call, it was too costly to judge, or the case's dtype cannot decide it).

    `cause`: of a failure, what went wrong (opforge.fuzz.oracles.Judge._cause: the kind of mismatch, and the special
    value the example's fill wrote when the failure needs it), which tells distinct failures apart; of a discard,
    which of the reasons above."""

    status: str
    oracle: str = ""
    message: str = ""
    mismatch: Mismatch | None = None
    cause: str = ""
