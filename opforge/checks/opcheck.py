"""opcheck: torch.library.opcheck, one result per sub-test."""

from __future__ import annotations

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, OneExample, Outcomes, aligned, first_values
from opforge.checks.op_and_reference import inputs_for
from opforge.core.outcomes import CheckFailure, Outcome, PassNote, missing_fake_hint, short

SUBTESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


FAKE = "opcheck:test_faketensor"


def opcheck(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    # registered_op_first_values gives this check no case of an implementation without a registered operator.
    return _subtests(ctx, implementation, case, SUBTESTS, requires_grad=ctx.loaded.spec.differentiable)


def faketensor(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """test_faketensor alone, on inputs that do not require grad: the fake kernel's output metadata (shape, dtype,
    strides) against the real output, what `opforge fuzz` judges one example by (the other sub-tests say nothing
    more on another shape: the schema and autograd registration, and AOT dispatch costs seconds). An implementation
    without a registered operator has no fake kernel to test: a pass."""
    if implementation.overload is None:
        return {FAKE: None}
    return _subtests(ctx, implementation, case, ("test_faketensor",), requires_grad=False)


def _subtests(
    ctx: CheckContext, implementation: Implementation, case: Case, subtests: tuple[str, ...], requires_grad: bool
) -> Outcomes:
    import torch

    assert implementation.overload is not None
    inputs = inputs_for(ctx.loaded, case, ctx.base_seed, requires_grad=requires_grad)
    verdicts = torch.library.opcheck(
        implementation.overload, inputs.args, inputs.kwargs, test_utils=subtests, raise_exception=False
    )
    return {f"opcheck:{name}": outcome(verdicts.get(name, "SUCCESS"), inputs) for name in subtests}


def outcome(verdict: object, inputs: CaseInputs) -> Outcome:
    if verdict == "SUCCESS":
        return None
    if isinstance(verdict, BaseException):
        if _cannot_clone_empty(verdict, inputs):
            return PassNote(CLONE_BUG_NOTE)
        return CheckFailure(short(verdict) + missing_fake_hint(verdict))
    return CheckFailure(str(verdict))


# torch's opcheck copies each input through torch._dynamo.utils.clone_input, which sizes the copy's storage as
# 32 + sum((size - 1) * stride), wrong for an empty tensor: negative for (0, 0, 31, 0), 25 GB for (1954, 2432, 668, 0)
# (torch 2.13, CPU: "can't allocate memory"), 78.6 GiB for float64 (928, 0, 3373, 3373) (torch 2.11, H100: CUDA's
# OutOfMemoryError), so opcheck fails before the op runs. Found by `opforge fuzz` on leaky_swish and, on the GPU, on
# affine_leaky_swish; the op is not at fault.
CLONE_BUG_NOTE = (
    "opcheck could not copy an empty input (a torch bug in clone_input sizes its storage from the other dims), so "
    "it did not test this case"
)

# An empty input needs no storage; a copy estimate past this is clone_input's bug, not a real need. Far above any
# input opforge makes (fuzz's --max-numel default, 2^20 elements, is 8 MiB in float64) and far below what fails to
# allocate (25 GB and 78.6 GiB seen above).
_CLONE_ESTIMATE_SUSPECT_BYTES = 2**30

_ALLOCATION_FAILURES = ("negative dimension", "can't allocate memory", "out of memory")


def _cannot_clone_empty(error: BaseException, inputs: CaseInputs) -> bool:
    """Whether opcheck's failure is clone_input's: an allocation failed and an empty input's copy estimate is
    negative or huge. An op that itself fails to allocate on an empty input still fails."""
    text = str(error).lower()
    if not any(failure in text for failure in _ALLOCATION_FAILURES):
        return False
    return any(_clone_estimate_is_bogus(a) for a in (*inputs.args, *inputs.kwargs.values()))


def _clone_estimate_is_bogus(value: object) -> bool:
    import torch

    if not isinstance(value, torch.Tensor) or value.numel() != 0:
        return False
    elements = 32 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride(), strict=True))
    return elements < 0 or elements * value.element_size() > _CLONE_ESTIMATE_SUSPECT_BYTES


def registered_op_first_values(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """opcheck needs a registered operator (a plain Python implementation has none) and does not depend on values."""
    return first_values(loaded, implementation, aligned(cases)) if implementation.overload is not None else []


CHECKS = (
    Check(
        "opcheck",
        "registration: schema, autograd registration, fake kernel, AOT dispatch (torch.library.opcheck)",
        registered_op_first_values,
        opcheck,
        results=tuple(f"opcheck:{t}" for t in SUBTESTS),
        one_example=OneExample(results=(FAKE,), run=faketensor),
    ),
)
