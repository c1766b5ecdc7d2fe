"""memory: calling the op again and again must not grow what stays allocated.

On CUDA the caching allocator counts every byte a live tensor holds (`torch.cuda.memory_allocated`), whoever holds
it, Python or C++. On CPU ATen keeps no such count (its allocator reports only to the profiler, which missed
retained tensors when tried), so the CPU measure is the number of live torch.Tensor objects the garbage collector
can see: it catches an op that keeps Python references to tensors (a cache, a list, a global), not C++ code that
holds on to at::Tensors.
"""

from __future__ import annotations

import gc
import itertools

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes, representative_cases
from opforge.checks.op_and_reference import inputs_for, outputs_of
from opforge.core.outcomes import CheckFailure

# Calls before measuring, so lazily created state (a kernel cache, an allocator's first block) is not counted.
WARMUP_CALLS = 2
# Calls per measured window. A leak grows in both of two consecutive windows; a one-off allocation does not.
CALLS_PER_WINDOW = 8


def memory_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One case per device: the representative contiguous case in the first dtype. A full scan of the garbage
    collector's objects costs ~0.1 s on CPU, and a leak does not depend on the dtype."""
    return list(representative_cases(loaded, cases).values())


def memory(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    measure, unit = (
        (_cuda_allocated_bytes, "bytes stayed allocated")
        if case.device == "cuda"
        else (_live_tensors, "tensors stayed alive")
    )

    def call() -> None:
        outputs_of(loaded, implementation, inputs)  # and drop what it returned

    for _ in range(WARMUP_CALLS):
        call()
    marks = [measure()]
    for _ in range(2):
        for _ in range(CALLS_PER_WINDOW):
            call()
        marks.append(measure())
    growth = [after - before for before, after in itertools.pairwise(marks)]
    if all(g > 0 for g in growth):
        raise CheckFailure(
            f"{growth[0]} then {growth[1]} {unit} over two windows of {CALLS_PER_WINDOW} calls whose results were "
            f"dropped ({growth[1] / CALLS_PER_WINDOW:g} per call): the op keeps what it allocates (a cache, a list, "
            "a global). Free it, or bound the cache."
        )
    return {"memory": None}


def _cuda_allocated_bytes() -> int:
    import torch

    torch.cuda.synchronize()
    gc.collect()
    return torch.cuda.memory_allocated()


def _live_tensors() -> int:
    import torch

    gc.collect()
    # type() rather than isinstance: isinstance reads __class__, which some lazily imported modules intercept.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


CHECKS = (
    Check(
        "memory",
        "calling the op again and again does not grow what stays allocated (a cache, a list, a global)",
        memory_cases,
        memory,
    ),
)
