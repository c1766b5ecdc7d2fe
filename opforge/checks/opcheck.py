"""opcheck: torch.library.opcheck, one result per sub-test."""

from __future__ import annotations

from opforge.cases import Case, CaseInputs
from opforge.checks.base import Check, CheckContext, Outcomes, aligned, first_values
from opforge.checks.calls import inputs_for
from opforge.loading import Implementation, LoadedOp
from opforge.outcomes import CheckFailure, Outcome, PassNote, missing_fake_hint, short

SUBTESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    import torch

    # registered_op_first_values gives this check no case of an implementation without a registered operator.
    assert implementation.overload is not None
    inputs = inputs_for(ctx.loaded, case, ctx.base_seed, requires_grad=ctx.loaded.spec.differentiable)
    verdicts = torch.library.opcheck(
        implementation.overload, inputs.args, inputs.kwargs, test_utils=SUBTESTS, raise_exception=False
    )
    return {f"opcheck:{name}": outcome(verdicts.get(name, "SUCCESS"), inputs) for name in SUBTESTS}


def outcome(verdict: object, inputs: CaseInputs) -> Outcome:
    if verdict == "SUCCESS":
        return None
    if isinstance(verdict, BaseException):
        if _cannot_clone_empty(verdict, inputs):
            return PassNote(CLONE_BUG_NOTE)
        return CheckFailure(short(verdict) + missing_fake_hint(verdict))
    return CheckFailure(str(verdict))


# torch's opcheck copies each input through torch._dynamo.utils.clone_input, which sizes the copy's storage as
# 1 + sum((size - 1) * stride), wrong for an empty tensor: negative for (0, 0, 31, 0), 25 GB for (1954, 2432, 668, 0)
# (torch 2.13), so opcheck fails before the op runs. Found by `opforge fuzz` on leaky_swish; the op is not at fault.
CLONE_BUG_NOTE = (
    "opcheck could not copy an empty input (a torch bug in clone_input sizes its storage from the other dims), so "
    "it did not test this case"
)


def _cannot_clone_empty(error: BaseException, inputs: CaseInputs) -> bool:
    import torch

    tensors = (*inputs.args, *inputs.kwargs.values())
    empty = any(isinstance(a, torch.Tensor) and a.numel() == 0 and a.dim() > 1 for a in tensors)
    text = str(error)
    return empty and ("negative dimension" in text or "can't allocate memory" in text)


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
    ),
)
