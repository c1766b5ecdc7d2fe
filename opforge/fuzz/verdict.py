"""The words of a fuzz verdict (results.Verdict) that only fuzz says: the oracles of a dead or stalled process, and
why an example was discarded (no torch here)."""

from __future__ import annotations

# The oracle of a failure where the op's process died (or its CUDA context did) or stalled.
CRASHED, HUNG = "crash", "hang"

# Why an example was discarded (a discard's `cause`): nothing in it judged the op.
OUTSIDE_DOMAIN = "outside the reference's domain"
TOO_COSTLY = "too costly to judge"
UNDECIDABLE = "beyond what the case's dtype can decide"
