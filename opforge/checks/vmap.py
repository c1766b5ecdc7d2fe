"""vmap: torch.vmap over a new leading batch dimension against a Python loop over the batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs, in_layout
from opforge.cases.compare import check_result, tolerance_for
from opforge.cases.matrix import Case, input_layout
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
from opforge.checks.op_and_reference import argument, inputs_for, named_leaves, op_outputs, outputs_of, with_arguments
from opforge.core.outcomes import CheckFailure, short

if TYPE_CHECKING:
    import torch

# Batch size: more than one slice so a rule that mixes or reorders slices shows, and odd so no pairing hides it.
BATCH = 3
# Layouts a batched tensor can take on: channels_last is 4-D only, and a batched 4-D tensor is 5-D.
BATCHABLE_LAYOUTS = ("contiguous", "transposed", "strided")


def vmap_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Every case with the first argument values (refuse_mutating_op refuses the claim for an op that mutates
    arguments: vmap of an in-place op is a different contract)."""
    return [c for c in first_values(loaded, implementation, cases) if c.layout in BATCHABLE_LAYOUTS]


def vmap(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """Slice k of the batch has the inputs the case would have under base seed + k: different values per slice."""
    import torch

    loaded = ctx.loaded
    slices = [inputs_for(loaded, case, ctx.base_seed + k) for k in range(BATCH)]
    names = slices[0].tensor_names
    looped = [outputs_of(loaded, implementation, inputs) for inputs in slices]
    batched_inputs = [_batched(loaded, slices, name, case) for name in names]

    def call(*tensors: torch.Tensor) -> Any:
        args, kwargs = with_arguments(loaded, slices[0], dict(zip(names, tensors)))
        return implementation.fn(*args, **kwargs)

    try:
        batched = op_outputs(loaded, torch.vmap(call)(*batched_inputs))
    except Exception as exc:
        raise CheckFailure(
            f"torch.vmap of {implementation.name}: expected it to run batched, got {short(exc)}. Register a "
            "batching rule (torch.library.register_vmap) that returns out_dims for every output."
        ) from exc
    tol = tolerance_for(loaded.spec, case.dtype)
    per_slice = [dict(named_leaves(loaded, outputs, {})) for outputs in looped]
    for name, got in named_leaves(loaded, batched, {}):
        expected = _stacked(name, [leaves.get(name) for leaves in per_slice])
        check_result(
            f"{name} (vmap vs loop over {BATCH} slices)",
            got,
            expected,
            tol,
            getattr(expected, "dtype", None),
            case.device,
            against=f"the op called on each of the {BATCH} slices",
        )
    return {"vmap": None}


def _stacked(name: str, values: list[Any]) -> Any:
    """One output's values over the slices, stacked along a new dim 0 (a value that is no tensor: the first slice's,
    which every slice must share)."""
    import torch

    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values)
    if any(v != values[0] for v in values):
        raise CheckFailure(f"{name}: the op called on each slice returned {values}: no batched output can match.")
    return values[0]


def _batched(loaded: LoadedOp, slices: list[CaseInputs], name: str, case: Case) -> torch.Tensor:
    """The slices of one input stacked along a new dim 0, in the layout the input has in the case (a transposed
    case stays transposed in its last two dims)."""
    import torch

    stacked = torch.stack([argument(inputs, loaded, name) for inputs in slices])
    layout = input_layout(loaded.spec, name, case.layout, dict(case.shapes)[name])
    return in_layout(stacked.to(torch.float64), layout, stacked.dtype, case.device)


def refuse_mutating_op(loaded: LoadedOp) -> None:
    """The vmap check compares with a loop over slices of fresh inputs; an op that writes its arguments would need
    the batched writes compared too, which it does not do: refuse the claim rather than check nothing."""
    mutated = loaded.mutated_arguments
    if loaded.spec.vmap and mutated:
        raise loaded.spec.error(
            "vmap",
            "claims.vmap: true only for an op that mutates none of its arguments",
            f"claims.vmap: true on an op that mutates {', '.join(mutated)}",
            "Drop `vmap: true` from claims: opforge checks vmap of functional ops only.",
        )


CHECKS = (
    Check(
        "vmap",
        "torch.vmap over a new batch dimension against a loop over the batch (needs `claims: {vmap: true}`)",
        vmap_cases,
        vmap,
        claim="vmap",
        validate=refuse_mutating_op,
    ),
)
