"""determinism: two runs on the same inputs, under the same settings, are bitwise identical, outputs and gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.compare import EXACT, check_result
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, OneExample, Outcomes, aligned
from opforge.checks.op_and_reference import (
    argument,
    differentiable_outputs,
    differentiates,
    inputs_for,
    named_leaves,
    op_gradients,
    outputs_of,
    seeded_grad_outputs,
)
from opforge.core.outcomes import CheckFailure
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    import torch


def determinism(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """Two runs on the same inputs under the same settings are bitwise identical: a racy accumulation or an atomicAdd
    shows. A differentiable op's gradients too: a backward is where reductions across rows live (a weight gradient,
    a per-channel sum), and where atomicAdd makes CUDA kernels nondeterministic. Both runs use the same thread count:
    ATen's own float32 GEMM gives other last bits on 1 thread than on 2 (torch.mm at 6x36 @ 36x42: 64 of 252
    elements), and torch promises run-to-run reproducibility, not thread-count invariance."""
    import torch

    loaded = ctx.loaded
    first = _one_run(loaded, implementation, case, ctx.base_seed)
    second = _one_run(loaded, implementation, case, ctx.base_seed)
    if [name for name, _ in first] != [name for name, _ in second]:
        raise CheckFailure(
            f"a second run returned {[name for name, _ in second]}, the first {[name for name, _ in first]}: the "
            "outputs' structure (a list's length) must not change between runs on the same inputs."
        )
    for (name, a), (_, b) in zip(first, second):
        if isinstance(a, torch.Tensor) and not _bitwise_equal(a, b):
            check_result(f"{name} (second run)", b, a, EXACT, a.dtype, case.device, against="the first run")
            raise CheckFailure(f"{name}: a second run differs in its bits (only in NaN payloads or signed zeros).")
    return {"determinism": None}


def _one_run(loaded: LoadedOp, implementation: Implementation, case: Case, base_seed: int) -> list[tuple[str, Any]]:
    """(name, value) of each output, mutated argument and, for an op the spec differentiates, each input's gradient
    for one grad_output seeded by the case: one forward call serves the outputs and the backward."""
    import torch

    with_gradients = differentiates(loaded, case)
    inputs = inputs_for(loaded, case, base_seed, requires_grad=with_gradients)
    outputs = outputs_of(loaded, implementation, inputs)
    mutated = {n: argument(inputs, loaded, n) for n in loaded.mutated_arguments}
    named = [(n, v.detach() if isinstance(v, torch.Tensor) else v) for n, v in named_leaves(loaded, outputs, mutated)]
    return named + (_gradients(loaded, implementation, case, base_seed, inputs, outputs) if with_gradients else [])


def _gradients(
    loaded: LoadedOp,
    implementation: Implementation,
    case: Case,
    base_seed: int,
    inputs: CaseInputs,
    outputs: tuple[Any, ...],
) -> list[tuple[str, Any]]:
    """(grad[name], gradient) of each input that requires grad, through the differentiable outputs."""
    names = [n for n in inputs.tensor_names if argument(inputs, loaded, n).requires_grad]
    differentiable = differentiable_outputs(outputs)
    if not names or not differentiable:
        return []
    wrt = [argument(inputs, loaded, n) for n in names]
    grads = op_gradients(implementation, differentiable, wrt, seeded_grad_outputs(differentiable, case, base_seed))
    return [(f"grad[{n}]", g) for n, g in zip(names, grads) if g is not None]


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
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


def deterministic_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Every case, unless the spec claims `deterministic: false` (atomics, sampling)."""
    return aligned(cases) if _claims_otherwise(loaded.spec, "") is None else []


def _claims_otherwise(spec: OpSpec, device: str) -> str | None:
    return None if spec.deterministic else "the spec claims deterministic: false"


CHECKS = (
    Check(
        "determinism",
        "two runs on the same inputs give the same bits (outputs and gradients)",
        deterministic_cases,
        determinism,
        one_example=OneExample(unless=_claims_otherwise),
    ),
)
