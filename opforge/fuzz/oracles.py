"""What decides one fuzz example, in the worker: the reference decides the domain, the op may reject a call cleanly,
and then the oracles: the catalog's checks that can judge one example (opforge.checks.base.OneExample), each its
check's own code (its comparison rules, low-precision rule included), in the catalog's order. Today correctness,
devices, determinism, opcheck:test_faketensor (the fake kernel's output metadata) and compile (asked for only);
which apply to a search is opforge.fuzz.search.oracles_for's.

A failure's cause (Judge._cause) tells distinct failures apart: the kind of mismatch, and the special value the
example's fill wrote when the failure needs it.
"""

from __future__ import annotations

import cmath
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.compare import map_tensors
from opforge.cases.matrix import Case, writes_special
from opforge.checks.base import Check, CheckContext
from opforge.checks.catalog import CATALOG
from opforge.checks.op_and_reference import (
    call_reference,
    inputs_for,
    named_leaves,
    output_baseline,
    outputs_of,
    reference_in_op_dtypes,
    split_reference,
)
from opforge.core.outcomes import CheckFailure, ReferenceFailure, short
from opforge.core.results import Mismatch, Status, Verdict
from opforge.engine.tasks import apply_xfail, check_verdicts
from opforge.fuzz.verdict import CRASHED, OUTSIDE_DOMAIN, UNDECIDABLE


class Judge:
    """The oracles of one judging child, over every example it runs: they share one CheckContext, in which the
    compile oracle keeps its compiled function per dtype and device (compiling is seconds, a compiled call
    milliseconds)."""

    def __init__(self, loaded: LoadedOp):
        self.loaded = loaded
        self.native = loaded.implementations[0]
        self.context = CheckContext(loaded, 0)

    def __call__(
        self, case: Case, oracles: tuple[str, ...], took: Callable[[str, float], None] = lambda *_: None
    ) -> Verdict:
        """The example's verdict. `took` hears how long the reference's first call took ("reference", before the
        op runs) and the op's ("op"): the parent times the op's call alone for a hang, and sizes the rest's limit
        by both."""
        started = time.monotonic()
        try:
            inputs = inputs_for(self.loaded, case, 0)
            call_reference(self.loaded, inputs)
        except Exception as exc:  # the reference (or a spec generator) refuses the call: not the op's domain
            message = str(exc) if isinstance(exc, ReferenceFailure) else short(exc)
            return Verdict(Status.DISCARD, message, cause=OUTSIDE_DOMAIN)
        took("reference", time.monotonic() - started)
        started = time.monotonic()
        try:
            outputs_of(self.loaded, self.native, inputs)
            took("op", time.monotonic() - started)
        except CheckFailure as failure:
            raised = failure.__cause__
            if raised is None:  # it returned, with a kernel launch's error left pending
                return Verdict(Status.FAIL, failure.message, oracle="correctness", cause="a pending CUDA launch error")
            if _is_cuda_fault(raised):
                return Verdict(Status.FAIL, f"a CUDA error: {short(raised)}", oracle=CRASHED)
            return Verdict(Status.REJECT, short(raised))
        failed = self._first_failure(case, oracles)
        if failed is None:
            return Verdict(Status.PASS)
        undecided = self._undecidable(case, failed) if failed.oracle == "correctness" else None
        if undecided is not None:
            return undecided
        return _declared(self.loaded, self.native, case, replace(failed, cause=self._cause(case, failed)))

    def _refused(self, case: Case) -> bool:
        """Whether the reference (or a spec generator) refuses the example's call."""
        try:
            call_reference(self.loaded, inputs_for(self.loaded, case, 0))
        except Exception:
            return True
        return False

    def _first_failure(self, case: Case, oracles: tuple[str, ...]) -> Verdict | None:
        for oracle in oracles:
            try:
                verdict = _judge(CATALOG.oracles[oracle], self.context, self.native, case)
            except Exception as exc:  # as `opforge check` makes a check that raises an ERROR result, not a dead worker
                verdict = Verdict(Status.FAIL, f"the {oracle} oracle raised {short(exc)}", oracle=oracle)
            if verdict is not None:
                return verdict
        return None

    def _cause(self, case: Case, failed: Verdict) -> str:
        """The failure's kind, with the special value the example's fill wrote when the failure needs it: the same
        example without it (the spec's values at the same seed) passes that oracle, or the reference refuses it. A
        failure the special value is not needed for keeps the cause it has without it, so that it is the same
        failure as the search's examples without special values (a tail bug met first with a NaN in the tail)."""
        kind = failure_kind(failed.message, failed.mismatch)
        special = special_value(case.fill)
        if not special:
            return kind
        plain = replace(case, fill="")
        without = None if self._refused(plain) else self._first_failure(plain, (failed.oracle,))
        if without is not None:
            return failure_kind(without.message, without.mismatch)
        return f"{kind}, with {special} in an input"

    def _undecidable(self, case: Case, failed: Verdict) -> Verdict | None:
        """A discard where the failing output is an integer or bool one (indices, counts, masks: a tensor, or a
        plain int or bool) that the case's dtype cannot decide: the reference computed in that dtype disagrees with
        the float64 reference there too, or overflows on the way (an intermediate not finite in the dtype where it is
        in float64). nms's box areas of corners near 1.8e19 (the `huge` fill) overflow float32, in the op and in the
        reference alike, and which boxes it keeps is then the overflow's doing, not the op's. A wrong integer output
        where the reference computes in the dtype without overflow and agrees with float64 stays a failure. None:
        not such a case."""
        loaded = self.loaded
        try:
            inputs = inputs_for(loaded, case, 0)
            baseline = output_baseline(loaded, inputs, case.dtype)
            expected = named_leaves(loaded, *split_reference(loaded, call_reference(loaded, inputs)))
        except Exception:  # the correctness oracle has already said what failed
            return None
        failing = [(n, v) for n, v in expected if _is_exact(v) and failed.message.startswith(f"{n}:")]
        for name, value in failing:
            in_dtype = baseline.value(name)
            if in_dtype is not None and not _equal(in_dtype, value):
                why = f"{name}: {baseline.label} disagrees with the float64 reference too"
                return Verdict(
                    Status.DISCARD, f"{why}; the op: {failed.message}", oracle="correctness", cause=UNDECIDABLE
                )
        overflow = _overflow_in_dtype(loaded, inputs) if failing else ""
        if overflow:
            why = f"{failing[0][0]}: the reference computed in {case.dtype} overflows ({overflow})"
            return Verdict(Status.DISCARD, f"{why}; the op: {failed.message}", oracle="correctness", cause=UNDECIDABLE)
        return None


def _overflow_in_dtype(loaded: LoadedOp, inputs: CaseInputs) -> str:
    """The first step of the reference that has more elements not finite when it computes in the op's dtypes than
    in float64 (an overflow, or an underflow divided by), as "aten.mul.Tensor in step 3"; "" when there is none, or
    the two runs take different steps."""
    try:
        wide = _non_finite_steps(loaded, inputs.reference_args, inputs.reference_kwargs)
        narrow = _non_finite_steps(loaded, *reference_in_op_dtypes(loaded, inputs))
    except Exception:  # a reference that does not run in the dtype: nothing to blame on it
        return ""
    if [step for step, _ in wide] != [step for step, _ in narrow]:
        return ""
    return next(
        (f"{step} in step {i + 1}" for i, ((step, w), (_, n)) in enumerate(zip(wide, narrow)) if n > w),
        "",
    )


def _non_finite_steps(loaded: LoadedOp, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, int]]:
    """Each aten call of one reference run on copies of the arguments, with how many elements of its floating
    outputs are not finite."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    steps: list[tuple[str, int]] = []

    class Counting(TorchDispatchMode):
        # Typed, TorchDispatchMode's __init__ is not; called by its own name, which untyped_calls_exclude knows.
        def __init__(self) -> None:
            TorchDispatchMode.__init__(self)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            floating = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            steps.append((str(func), sum(int((~torch.isfinite(t)).sum()) for t in floating)))
            return out

    copy = functools.partial(map_tensors, lambda t: t.detach().clone())
    with torch.no_grad(), Counting():
        loaded.reference(*copy(args), **{k: copy(v) for k, v in kwargs.items()})
    return steps


def failure_kind(message: str, mismatch: Mismatch | None) -> str:
    """What kind of wrong a failure is, in words free of the example's numbers (so that the same bug at another
    size or seed is the same failure): from the worst mismatching element where there is one, else from the
    message's wording."""
    if mismatch is not None:
        return _value_kind(mismatch.got, mismatch.expected)
    lowered = message.lower()
    return next((kind for fragment, kind in _MESSAGE_KINDS if fragment in lowered), "another failure")


# The first fragment a failure message holds (lowercase) names its kind: compare.check_result's, check_plain_value's
# and paired_leaves' wording (a plain value that differs: "n: expected 3, got 4."), the checks', and torch's
# fake-tensor comparison's (opcheck's test_faketensor: "Stride mismatch", "Shapes ... are not equal", "Dtypes ...").
_MESSAGE_KINDS = (
    ("oracle raised", "the oracle raised"),
    ("stride", "wrong strides"),
    ("storage offset", "a wrong storage offset"),
    ("shape", "a wrong shape"),
    ("dtype", "a wrong dtype"),
    ("device", "a wrong device"),
    ("expected a tensor", "not a tensor"),
    ("modified input", "an input written that the schema does not declare mutable"),
    ("value(s)", "a wrong number of outputs"),
    ("expected none", "a value where None was expected"),
    ("got none", "None where a value was expected"),
    ("raised", "raised"),
    ("failed on", "raised"),
    ("list", "a list of the wrong length"),
    ("expected", "a wrong value"),
)


def _value_kind(got: float | complex, expected: float | complex) -> str:
    if cmath.isnan(expected) and not cmath.isnan(got):
        return "a number where NaN was expected"
    if cmath.isnan(got):
        return "NaN where a number was expected"
    if cmath.isinf(expected) and cmath.isinf(got):
        return "the wrong infinity"
    if cmath.isinf(expected):
        return "a finite value where an infinity was expected"
    if cmath.isinf(got):
        return "an infinity where a finite value was expected"
    return "a value beyond tolerance"


def special_value(fill: str) -> str:
    """The special value a fill writes into an input (`x=one:nan@3` -> nan), "" for a rule over sampled values."""
    if not writes_special(fill):
        return ""
    return fill.rpartition("=")[2].partition(":")[2].partition("@")[0]


def _is_exact(value: Any) -> bool:
    """An integer or bool value, compared exactly: a tensor of such a dtype, or a plain int or bool."""
    import torch

    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex())
    return isinstance(value, int)


def _equal(a: Any, b: Any) -> bool:
    import torch

    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return bool(a == b)
    return tuple(a.shape) == tuple(b.shape) and bool(a.detach().cpu().eq(b.detach().cpu()).all())


def _declared(loaded: LoadedOp, implementation: Implementation, case: Case, verdict: Verdict) -> Verdict:
    """A failure the spec's xfail entries declare for this check and case becomes `known`: `opforge check` would
    report it as XFAIL, so fuzz must not report it as new (torchvision's upstream bugs, say). The engine's own
    matcher decides (opforge.engine.tasks.declared), on the case id without the example's fill (what xfail globs are
    written against). An example with a special value in an input (NAME=one|row|all:S) is also what the
    special_values check's entries declare (roi_pool skipping NaN). A crash or hang is declared by the spec's
    `crash: true` entries, which the search applies (opforge.fuzz.search.declared_crash)."""
    checks = [verdict.oracle]
    if writes_special(case.fill):  # what the special_values check's xfails declare
        checks.append("special_values")
    matrix_case = replace(case, fill="")
    for check in checks:
        known = apply_xfail(loaded.spec, implementation.name, check, matrix_case, verdict)
        if known.status == Status.XFAIL:
            return known
    return verdict


def _is_cuda_fault(exc: BaseException) -> bool:
    text = str(exc)
    return "CUDA error" in text or "device-side assert" in text or type(exc).__name__ == "AcceleratorError"


def _judge(check: Check, context: CheckContext, implementation: Implementation, case: Case) -> Verdict | None:
    """Check `check`'s verdict on one example (its OneExample run, else its own), through the engine's own outcome
    mapping: its first failed or errored result is the oracle's failure; None when they all pass or skip."""
    assert check.one_example is not None and check.oracle is not None
    run = check.one_example.run or check.run
    judged = replace(check, results=check.judged_results())
    for verdict in check_verdicts(judged, lambda: run(context, implementation, case)).values():
        if verdict.status in (Status.FAIL, Status.ERROR):
            return replace(verdict, status=Status.FAIL, oracle=check.oracle)
    return None
