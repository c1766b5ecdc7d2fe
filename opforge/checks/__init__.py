"""The checks. Each picks the cases it applies to from the spec's matrix and runs one case at a time, returning
one outcome per result row it owns (opcheck owns one row per sub-test).

An outcome is None for a pass, a PassNote for a pass with something to report, or a CheckFailure. An exception
escaping from the reference becomes an ERROR row; anything the op under test raises is that op's failure; a
CheckSkipped becomes a SKIP row with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from opforge.cases import Case
from opforge.compare import CheckFailure, PassNote
from opforge.loading import LoadedOp, Target
from opforge.spec import FLOATING_DTYPES, OPCHECK_SUBTESTS


@dataclass(frozen=True)
class CheckContext:
    loaded: LoadedOp
    base_seed: int
    # The row's time limit in seconds when a parent process enforces one (isolated runs), for a check that must
    # end its own work first (large_index's child process); None in process.
    time_limit: float | None = None


Outcomes = dict[str, CheckFailure | PassNote | None]
Selector = Callable[[LoadedOp, Target, list[Case]], list[Case]]
Runner = Callable[[CheckContext, Target, Case], Outcomes]
# Why a costly check does not run for this op unless asked (None: it runs); given the op and `--large`.
OptIn = Callable[[LoadedOp, bool], "str | None"]


@dataclass(frozen=True)
class Check:
    name: str
    select: Selector
    run: Runner
    # The result rows it produces, when more than its own name.
    rows: tuple[str, ...] = ()
    opted_out: OptIn | None = None

    def row_names(self) -> tuple[str, ...]:
        return self.rows or (self.name,)


def all_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return cases


def first_values(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Registration and compilation do not depend on argument values: the first combination is enough."""
    return [c for c in cases if c.values_index == 0]


def cuda_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.device == "cuda"]


def deterministic_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return [] if loaded.spec.nondeterministic else cases


def floating_nonempty_first_values(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Special values need room: at least 1-D, no zero-size dimension."""

    def has_elements(shape: tuple[int, ...]) -> bool:
        return len(shape) > 0 and all(shape)

    return [
        c
        for c in first_values(loaded, target, cases)
        if c.dtype in FLOATING_DTYPES and c.layout == "contiguous" and all(has_elements(s) for _, s in c.shapes)
    ]


def registered_op_first_values(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return first_values(loaded, target, cases) if target.overload is not None else []


def float64_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """gradcheck runs in float64 whatever dtypes the op claims: one case per device/layout/shape/values point."""
    if not loaded.spec.differentiable:
        return []
    seen: dict[str, Case] = {}
    for case in cases:
        as64 = replace(case, dtype="float64")
        seen.setdefault(as64.id, as64)
    return list(seen.values())


def double_backward_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    return float64_cases(loaded, target, cases) if loaded.spec.double_backward else []


def low_precision_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    if not loaded.spec.differentiable:
        return []
    return [c for c in cases if c.dtype != "float64"]


def all_shapes_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """One case per dtype/device/layout that runs every shape through one compiled function (dynamic shapes)."""
    seen: dict[str, Case] = {}
    for case in first_values(loaded, target, cases):
        merged = replace(case, shapes=(), shape_index=-1)
        seen.setdefault(merged.id, merged)
    return list(seen.values())


def registry() -> dict[str, Check]:
    from opforge.checks import (
        compiled,
        contracts,
        gradients,
        large_index,
        numerics,
        placement,
        registration,
        resources,
        streams,
        transforms,
    )

    checks = [
        Check("correctness", all_cases, numerics.correctness),
        Check("devices", cuda_cases, numerics.devices_agree),
        Check("determinism", deterministic_cases, numerics.determinism),
        Check("special_values", floating_nonempty_first_values, numerics.special_values),
        Check(
            "opcheck",
            registered_op_first_values,
            registration.opcheck,
            rows=tuple(f"opcheck:{t}" for t in OPCHECK_SUBTESTS),
        ),
        Check("gradcheck", float64_cases, gradients.gradcheck),
        Check("gradgradcheck", double_backward_cases, gradients.gradgradcheck),
        Check("grad_lowp", low_precision_cases, numerics.grad_lowp),
        Check("compile", all_shapes_cases, compiled.compile_check),
        Check("dtypes", contracts.every_dtype_cases, contracts.dtypes),
        Check("error_inputs", contracts.error_input_cases, contracts.error_inputs),
        Check("vmap", transforms.vmap_cases, transforms.vmap),
        Check("memory", resources.memory_cases, resources.memory),
        Check("stream", streams.stream_cases, streams.stream),
        Check("large_index", large_index.large_index_cases, large_index.large_index, opted_out=large_index.opted_out),
        Check("multi_gpu", cuda_cases, placement.multi_gpu),
    ]
    return {c.name: c for c in checks}
