"""opcheck: torch.library.opcheck, one result row per sub-test."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks import CheckContext, Outcomes
from opforge.checks.calls import inputs_for, short
from opforge.compare import CheckFailure
from opforge.loading import Target
from opforge.spec import OPCHECK_SUBTESTS


def opcheck(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    inputs = inputs_for(ctx.loaded, case, ctx.base_seed, requires_grad=ctx.loaded.spec.differentiable)
    verdicts = torch.library.opcheck(
        target.overload, inputs.args, inputs.kwargs, test_utils=OPCHECK_SUBTESTS, raise_exception=False
    )
    return {f"opcheck:{name}": _outcome(verdicts.get(name, "SUCCESS")) for name in OPCHECK_SUBTESTS}


def _outcome(verdict) -> CheckFailure | None:
    if verdict == "SUCCESS":
        return None
    return CheckFailure(short(verdict) if isinstance(verdict, BaseException) else str(verdict))
