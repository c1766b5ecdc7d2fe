"""opcheck: torch.library.opcheck, one result per sub-test."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks.base import Check, CheckContext, Outcomes, aligned, first_values
from opforge.checks.calls import inputs_for
from opforge.loading import Implementation, LoadedOp
from opforge.outcomes import CheckFailure, missing_fake_hint, short

SUBTESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    import torch

    # registered_op_first_values gives this check no case of an implementation without a registered operator.
    assert implementation.overload is not None
    inputs = inputs_for(ctx.loaded, case, ctx.base_seed, requires_grad=ctx.loaded.spec.differentiable)
    verdicts = torch.library.opcheck(
        implementation.overload, inputs.args, inputs.kwargs, test_utils=SUBTESTS, raise_exception=False
    )
    return {f"opcheck:{name}": _outcome(verdicts.get(name, "SUCCESS")) for name in SUBTESTS}


def _outcome(verdict: object) -> CheckFailure | None:
    if verdict == "SUCCESS":
        return None
    if isinstance(verdict, BaseException):
        return CheckFailure(short(verdict) + missing_fake_hint(verdict))
    return CheckFailure(str(verdict))


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
