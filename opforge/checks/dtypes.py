"""dtypes: the op's representative case in every floating, integer and bool dtype (OpInfo's test_dtypes idea): a
claimed dtype must work; an unclaimed one may work (a pass that says so) or raise a clear error, but must never
return silently wrong values."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.compare import Rule, check_result, rule_for, tolerance_for
from opforge.cases.matrix import Case, build_matrix
from opforge.checks.base import Check, CheckContext, Outcomes, representative_cases
from opforge.checks.op_and_reference import (
    against_reference,
    call_reference,
    compare_with_reference,
    compared_with,
    inputs_for,
    judged_nothing,
    mutated_values,
    nothing_judged,
    output_baseline,
    outputs_of,
)
from opforge.core.outcomes import CheckFailure, PassNote, ReferenceFailure
from opforge.spec.model import CASE_DTYPE, OpSpec, ScalarInput, Tolerance

if TYPE_CHECKING:
    import torch

# Every dtype an unclaimed call is tried in. Complex is left out: a real op's reference says nothing about it.
TRIED_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")


# How an op may refuse a dtype: TORCH_CHECK raises RuntimeError (TORCH_CHECK_TYPE TypeError, TORCH_CHECK_VALUE
# ValueError), AT_DISPATCH's "not implemented for 'Int'" is a NotImplementedError.
CLEAR_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError)


# An integer result may round, floor or truncate the real value: any of them is within one unit.
INTEGER_ROUNDING = Tolerance(atol=1.0, rtol=0.0)


def every_dtype_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Per device, the representative contiguous case (first argument values) in each claimed dtype, and in each
    tried one where the case's dtype reaches the op at all (an op whose every tensor input has a dtype of its own,
    indices and lengths, gets the same call in every dtype: nothing to learn from the unclaimed ones)."""
    tried = TRIED_DTYPES if case_dtype_reaches_the_op(loaded.spec) else ()
    return [
        replace(base, dtype=dtype)
        for base in representative_cases(loaded, cases).values()
        for dtype in dict.fromkeys(loaded.spec.dtypes_on(base.device) + tried)
    ]


def case_dtype_reaches_the_op(spec: OpSpec) -> bool:
    """Whether a case's dtype changes the call: a tensor input without a dtype of its own takes it (a samples
    function's tensors all do), and so does a ScalarType argument whose values name case_dtype."""
    return (
        spec.samples is not None
        or any(t.dtype is None for t in spec.tensor_inputs())
        or any(isinstance(s, ScalarInput) and CASE_DTYPE in s.values for s in spec.inputs)
    )


def dtypes(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    if case.dtype in loaded.spec.dtypes_on(case.device):
        try:
            judged = _as_correctness_compares(loaded, implementation, case, inputs)
        except CheckFailure as failure:
            raise CheckFailure(f"{case.dtype} is claimed, but {failure.message}", failure.mismatch) from failure
        if not judged:
            return {"dtypes": PassNote(f"{case.dtype} runs; its values are not compared: {nothing_judged(loaded)}")}
        return {"dtypes": compared_with(loaded)}
    try:
        returned = outputs_of(loaded, implementation, inputs)
    except CheckFailure as failure:
        error = failure.__cause__
        if isinstance(error, CLEAR_ERRORS) and str(error).strip():
            return {"dtypes": None}  # rejected with a message: what an op should do with a dtype it does not support
        raise CheckFailure(
            f"{case.dtype} is not claimed and the op fails on it without a clear error "
            f"({failure.message}). Reject it with TORCH_CHECK and a message."
        ) from error
    try:
        judged = _compare_unclaimed(loaded, implementation, case, returned, inputs)
    except CheckFailure as failure:
        raise CheckFailure(
            f"{case.dtype} is not claimed, and instead of rejecting it the op returns wrong values: {failure.message}",
            failure.mismatch,
        ) from None
    kinds = ", ".join(str(v.dtype).removeprefix("torch.") for v in returned if hasattr(v, "dtype")) or "nothing"
    if not judged:
        return {
            "dtypes": PassNote(
                f"{case.dtype} on {case.device} is not claimed, but runs (returns {kinds}); its values are not "
                f"compared: {nothing_judged(loaded)}"
            )
        }
    return {"dtypes": PassNote(_unclaimed_note(ctx, implementation, case, kinds))}


def _unclaimed_note(ctx: CheckContext, implementation: Implementation, case: Case, kinds: str) -> str:
    """What an unclaimed dtype that works on the representative case does on every other case of the spec: "works"
    only when it is right on all of them (a claim would then hold); else how close it came."""
    cases = every_case_in(ctx.loaded, case.dtype, case.device)
    failures = [(c, failure) for c in cases if (failure := _failure_on(ctx, implementation, c)) is not None]
    unclaimed = f"{case.dtype} on {case.device} is not claimed"
    if not failures:
        return (
            f"{unclaimed}, but works on all {len(cases)} cases of the spec (returns {kinds}): claim it in the "
            "spec's dtypes, or reject it with a clear error"
        )
    first, failure = failures[0]
    return (
        f"{unclaimed}; it works on the representative case but fails {len(failures)} of the spec's {len(cases)} "
        f"cases in it (first: {first.id}: {failure.rstrip('.')}): reject it with a clear error, or fix it before "
        "claiming it"
    )


def every_case_in(loaded: LoadedOp, dtype: str, device: str) -> list[Case]:
    """The spec's matrix on `device`, every case moved to `dtype` (claimed or not)."""
    claimed = loaded.spec.dtypes_on(device)[:1]
    return list(
        {c.id: c for c in (replace(c, dtype=dtype) for c in build_matrix(loaded.spec, claimed, (device,)))}.values()
    )


def _failure_on(ctx: CheckContext, implementation: Implementation, case: Case) -> str | None:
    """Why the op is not right on `case`, in a dtype it does not claim (None: it is)."""
    ctx.on_sweep(case)
    try:
        inputs = inputs_for(ctx.loaded, case, ctx.base_seed)
        _compare_unclaimed(ctx.loaded, implementation, case, outputs_of(ctx.loaded, implementation, inputs), inputs)
    except CheckFailure as failure:
        return failure.message
    except ReferenceFailure as failure:
        return str(failure)
    return None


def _as_correctness_compares(loaded: LoadedOp, implementation: Implementation, case: Case, inputs: CaseInputs) -> bool:
    """A claimed dtype is held to what the correctness check asks of it: the reference gets the inputs as the matrix
    makes them (an integer op's integers stay integers, and its result keeps their dtype). False when that judged
    nothing (judged_nothing: the call is the op's own reference call)."""
    baseline = output_baseline(loaded, inputs, case.dtype)
    got = outputs_of(loaded, implementation, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    if judged_nothing(loaded, implementation, inputs):
        return False
    compare_with_reference(loaded, case.dtype, case.device, compared, baseline)
    return True


def _compare_unclaimed(
    loaded: LoadedOp, implementation: Implementation, case: Case, got: tuple[Any, ...], inputs: CaseInputs
) -> bool:
    """Outputs and mutated arguments of a call in a dtype the op does not claim vs the float64 reference, cast the
    way the op's result is: an integer result to within one unit, a bool exactly, a floating one within its dtype's
    tolerance (the reference is written for real values: an integer input reaches it as float64; the op itself, a
    spec's reference where it has none, gets them as the op got them). False when that judged nothing
    (judged_nothing)."""
    import torch

    floating = getattr(torch, case.dtype).is_floating_point
    baseline = output_baseline(loaded, inputs, case.dtype) if floating else None
    real = inputs if loaded.self_reference is not None else _real_valued_reference(loaded, inputs)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, real))
    if judged_nothing(loaded, implementation, real):
        return False
    for name, g, e in compared:
        if not isinstance(g, torch.Tensor) or not isinstance(e, torch.Tensor):
            check_result(name, g, e, tolerance_for(loaded.spec, case.dtype), None, case.device)
            continue
        # The low-precision baseline is the reference in the case's dtype: only for a result in that dtype.
        same_dtype = baseline if g.dtype == getattr(torch, case.dtype) else None
        check_result(
            name,
            g,
            _as_the_op_would(e, g.dtype),
            _rule(loaded, g.dtype),
            g.dtype,
            case.device,
            against=loaded.reference_label,
            baseline=same_dtype,
        )
    return True


def _real_valued_reference(loaded: LoadedOp, inputs: CaseInputs) -> CaseInputs:
    """The reference is written for float64: an input in the dtype under test reaches it as float64 holding the same
    values when that dtype is an integer or bool. An input whose dtype the spec pins (an int64 index, a bool mask)
    reaches it as always."""
    import torch

    follows_case = {t.name for t in loaded.spec.tensor_inputs() if t.dtype is None}
    names = [a.name for a in loaded.arguments]

    def real(name: str, v: Any) -> Any:
        is_integral = isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex())
        return v.to(torch.float64) if is_integral and name in follows_case else v

    return replace(
        inputs,
        reference_args=tuple(real(names[i], a) for i, a in enumerate(inputs.reference_args)),
        reference_kwargs={k: real(k, v) for k, v in inputs.reference_kwargs.items()},
    )


def _as_the_op_would(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The real-valued reference as the op's result dtype holds it: a bool as nonzero, an integer truncated and,
    past the dtype's range, wrapped as torch's own integer arithmetic wraps (torch.cumsum of int8 lengths summing
    past 127 wraps too; seen on round3::complete_cumsum in int8, 256 off the float64 reference)."""
    import torch

    if dtype == torch.bool:
        return (expected != 0).to(torch.float64)
    if dtype.is_floating_point or dtype.is_complex:
        return expected
    info = torch.iinfo(dtype)
    span = float(info.max) - float(info.min) + 1
    whole = expected.trunc()
    outside = (whole < info.min) | (whole > info.max)
    return torch.where(outside, torch.remainder(whole - info.min, span) + info.min, whole)


def _rule(loaded: LoadedOp, dtype: torch.dtype) -> Rule:
    import torch

    if dtype == torch.bool:
        return Rule(Tolerance(atol=0.0, rtol=0.0), lowp=False)
    if not (dtype.is_floating_point or dtype.is_complex):
        return Rule(INTEGER_ROUNDING, lowp=False)
    return rule_for(loaded.spec, str(dtype).removeprefix("torch."))


CHECKS = (
    Check(
        "dtypes",
        "claimed dtypes work; unclaimed ones are rejected with a clear error or work, never silently wrong",
        every_dtype_cases,
        dtypes,
        visits_unclaimed_dtypes=True,
    ),
)
