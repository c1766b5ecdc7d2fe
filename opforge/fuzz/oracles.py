"""What decides one fuzz example, in the worker: the reference decides the domain, the op may reject a call cleanly,
and then the oracles, the same code `opforge check` runs (its comparison rules, low-precision rule included):

- correctness: outputs, their dtype and shape, mutated and untouched arguments against the float64 reference;
- fake: the fake kernel's output metadata (shape, dtype, strides) against the real output (opcheck's
  test_faketensor);
- determinism: two runs of the same call alike, bit for bit (unless the spec claims otherwise);
- devices: the CUDA result against the CPU result of the same call (on a GPU, for a spec that runs on both).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from opforge.cases import Case, writes_special
from opforge.checks.base import CheckContext
from opforge.checks.calls import call_reference, inputs_for, outputs_of
from opforge.checks.catalog import CATALOG
from opforge.checks.opcheck import outcome
from opforge.engine.tasks import check_verdicts
from opforge.fuzz.verdict import DISCARD, FAIL, KNOWN, PASS, REJECT, Verdict
from opforge.loading import Implementation, LoadedOp
from opforge.outcomes import CheckFailure, short
from opforge.results import Status

ORACLES = ("correctness", "fake", "determinism", "devices")


def judge(
    loaded: LoadedOp, case: Case, oracles: tuple[str, ...], took: Callable[[str, float], None] = lambda *_: None
) -> Verdict:
    """The example's verdict. `took` hears how long the reference's first call took ("reference", before the op
    runs) and the op's ("op"): the parent times the op's call alone for a hang, and sizes the rest's limit by both."""
    native = loaded.implementations[0]
    started = time.monotonic()
    try:
        inputs = inputs_for(loaded, case, 0)
        call_reference(loaded, inputs)
    except Exception as exc:  # the reference (or a spec generator) refuses the call: not the op's domain
        return Verdict(DISCARD, message=short(exc))
    took("reference", time.monotonic() - started)
    started = time.monotonic()
    try:
        outputs_of(loaded, native, inputs)
        took("op", time.monotonic() - started)
    except CheckFailure as failure:
        raised = failure.__cause__
        if raised is None:  # it returned, with a kernel launch's error left pending
            return Verdict(FAIL, "correctness", failure.message)
        if _is_cuda_fault(raised):
            return Verdict(FAIL, "crash", f"a CUDA error: {short(raised)}")
        return Verdict(REJECT, message=short(raised))
    context = CheckContext(loaded, 0)
    for oracle in oracles:
        try:
            verdict = _ORACLES[oracle](context, native, case)
        except Exception as exc:  # as `opforge check` makes a check that raises an ERROR row, not a dead worker
            verdict = Verdict(FAIL, oracle, f"the {oracle} oracle raised {short(exc)}")
        if verdict is not None:
            return _declared(loaded, native, case, verdict)
    return Verdict(PASS)


# The check (or opcheck sub-test) an xfail names for each oracle's failures.
_XFAIL_CHECKS = {"fake": "opcheck:test_faketensor"}


def _declared(loaded: LoadedOp, implementation: Implementation, case: Case, verdict: Verdict) -> Verdict:
    """A failure the spec's xfail entries declare for this check and case becomes `known`: `opforge check` would
    report it as XFAIL, so fuzz must not report it as new (torchvision's upstream bugs, say). An example with a
    special value in an input (NAME=one|row|all:S) is also what the special_values check's entries declare (roi_pool
    skipping NaN). Crashes and hangs are never declared, as in `opforge check`."""
    checks = [_XFAIL_CHECKS.get(verdict.oracle, verdict.oracle)]
    if writes_special(case.fill):  # what the special_values check's xfails declare
        checks.append("special_values")
    spec = loaded.spec
    matrix_id = replace(case, fill="").id  # the ids xfail globs are written against have no fill
    xfail = next(
        (
            x
            for check in checks
            if (x := spec.xfail_for(implementation.name, check, case.dtype, case.device, case.layout, matrix_id))
        ),
        None,
    )
    if xfail is None:
        return verdict
    return replace(verdict, status=KNOWN, message=f"expected failure ({xfail.reason}): {verdict.message}")


def _is_cuda_fault(exc: BaseException) -> bool:
    text = str(exc)
    return "CUDA error" in text or "device-side assert" in text or type(exc).__name__ == "AcceleratorError"


def _from_check(name: str, oracle: str) -> Callable[[CheckContext, Implementation, Case], Verdict | None]:
    def run(context: CheckContext, implementation: Implementation, case: Case) -> Verdict | None:
        check = CATALOG.get(name)
        for verdict in check_verdicts(check, lambda: check.run(context, implementation, case)).values():
            if verdict.status in (Status.FAIL, Status.ERROR):
                return Verdict(FAIL, oracle, verdict.message, verdict.mismatch)
        return None

    return run


def _fake(context: CheckContext, implementation: Implementation, case: Case) -> Verdict | None:
    import torch

    if implementation.overload is None:
        return None
    inputs = inputs_for(context.loaded, case, 0)
    verdicts = torch.library.opcheck(
        implementation.overload, inputs.args, inputs.kwargs, test_utils=("test_faketensor",), raise_exception=False
    )
    failure = outcome(verdicts.get("test_faketensor", "SUCCESS"), inputs)
    return Verdict(FAIL, "fake", failure.message) if isinstance(failure, CheckFailure) else None


_ORACLES: dict[str, Callable[[CheckContext, Implementation, Case], Verdict | None]] = {
    "correctness": _from_check("correctness", "correctness"),
    "fake": _fake,
    "determinism": _from_check("determinism", "determinism"),
    "devices": _from_check("devices", "devices"),
}
