"""`--shard K/N`: a stable split of a run's work across N CI jobs, whose reports `opforge merge-reports` joins.

The unit is what must run together: for `check`, one (op, implementation, check, case) task with all its results;
for `bench`, one (op, mode, dtype, device, size) point with all its contenders (their speedups are over each
other). Each unit goes to the shard its key hashes to (CRC-32, the same on every machine and Python), so the split
needs no coordination, stays put when other tasks are added, and spreads a spec's cases over all jobs. It balances
task counts, not seconds: a job that gets more of the slow tasks (compile, opcheck) finishes later.
"""

from __future__ import annotations

import re
import zlib

from opforge.core.errors import UsageError

Shard = tuple[int, int]  # (K, N): the K-th of N shards, K from 1


def parse_shard(text: str) -> Shard:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise UsageError(
            "--shard",
            "K/N with 1 <= K <= N",
            repr(text),
            "Pass e.g. --shard 2/4 for the second of four jobs (a CI matrix index from 1).",
        )
    return int(match[1]), int(match[2])


def owns(shard: Shard | None, key: str) -> bool:
    """Whether this shard runs the unit of work named `key` (every shard does when there is no split)."""
    if shard is None:
        return True
    index, count = shard
    return zlib.crc32(key.encode()) % count == index - 1


def shard_text(shard: Shard | None) -> str | None:
    """How a report records its shard ("2/4"); shard_of_text reads it back."""
    return None if shard is None else f"{shard[0]}/{shard[1]}"


def shard_of_text(text: str | None) -> Shard | None:
    return None if text is None else parse_shard(text)
