"""determinism: two runs on the same inputs are bitwise identical, outputs and gradients (on CPU the second on one
thread)."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, aligned
from opforge.checks.calls import (
    argument,
    differentiable_outputs,
    inputs_for,
    op_gradients,
    output_names,
    outputs_of,
    seeded_grad_outputs,
)
from opforge.compare import EXACT, check_result
from opforge.loading import LoadedOp, Target
from opforge.outcomes import CheckFailure
from opforge.spec.model import FLOATING_DTYPES


def determinism(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Two runs on the same inputs are bitwise identical; on CPU the second runs on one thread, so results that
    depend on how work is split across threads (a reduction's order, a racy accumulation) are caught too. A
    differentiable op's gradients too: a backward is where reductions across rows live (a weight gradient, a
    per-channel sum), and where atomicAdd makes CUDA kernels nondeterministic."""
    import torch

    loaded = ctx.loaded

    def run() -> list:
        values = _outputs_and_mutations(loaded, target, inputs_for(loaded, case, ctx.base_seed))
        return values + _gradients(loaded, target, case, ctx.base_seed)

    first = run()
    threads = torch.get_num_threads()
    try:
        if case.device == "cpu":
            torch.set_num_threads(1)
        second = run()
    finally:
        torch.set_num_threads(threads)
    for (name, a), (_, b) in zip(first, second):
        if isinstance(a, torch.Tensor) and not _bitwise_equal(a, b):
            check_result(f"{name} (second run)", b, a, EXACT, a.dtype, case.device, against="the first run")
            raise CheckFailure(f"{name}: a second run differs in its bits (only in NaN payloads or signed zeros).")
    return {"determinism": None}


def _outputs_and_mutations(loaded, target, inputs) -> list:
    named = list(zip(output_names(loaded), outputs_of(loaded, target, inputs)))
    return named + [(f"{n} (mutated)", argument(inputs, loaded, n)) for n in loaded.mutated_arguments]


def _gradients(loaded: LoadedOp, target: Target, case: Case, base_seed: int) -> list:
    """(grad[name], gradient) of each input the spec differentiates, for one grad_output seeded by the case; none for
    an op that is not differentiable or mutates its arguments (autograd refuses in-place writes to leaves)."""
    if not loaded.spec.differentiable or loaded.mutated_arguments or case.dtype not in FLOATING_DTYPES:
        return []
    inputs = inputs_for(loaded, case, base_seed, requires_grad=True)
    names = [n for n in inputs.tensor_names if argument(inputs, loaded, n).requires_grad]
    outputs = differentiable_outputs(outputs_of(loaded, target, inputs))
    if not names or not outputs:
        return []
    wrt = [argument(inputs, loaded, n) for n in names]
    grads = op_gradients(target, outputs, wrt, seeded_grad_outputs(outputs, case, base_seed))
    return [(f"grad[{n}]", g) for n, g in zip(names, grads) if g is not None]


def _bitwise_equal(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
            width = {4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def deterministic_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Every case, unless the spec declares the op nondeterministic (atomics, sampling)."""
    return [] if loaded.spec.nondeterministic else aligned(cases)


CHECKS = (
    Check(
        "determinism",
        "two runs on the same inputs give the same bits (outputs and gradients), whatever the thread count",
        deterministic_cases,
        determinism,
    ),
)
