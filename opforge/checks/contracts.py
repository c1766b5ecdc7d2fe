"""dtypes and error_inputs: what the op accepts and what it rejects, against what the spec says.

dtypes runs the spec's representative case in every floating, integer and bool dtype (OpInfo's test_dtypes idea):
a claimed dtype must work; an unclaimed one may work (a pass that says so) or raise a clear error, but must never
return silently wrong values. error_inputs makes each invalid call the spec lists and expects its error.
"""

from __future__ import annotations

import builtins
from dataclasses import replace
from typing import Any

from opforge.cases import Case, CaseInputs, sample
from opforge.checks import CheckContext, Outcomes
from opforge.checks.calls import (
    against_reference,
    call_reference,
    compared_dtype,
    inputs_for,
    mutated_values,
    outputs_of,
    short,
)
from opforge.compare import CheckFailure, CheckSkipped, PassNote, ReferenceFailure, check_result, tolerance_for
from opforge.loading import LoadedOp, Target
from opforge.spec import ErrorInput, OpSpec, ScalarInput, Tolerance

# Every dtype an unclaimed call is tried in. Complex is left out: a real op's reference says nothing about it.
TRIED_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")
# How an op may refuse a dtype: TORCH_CHECK raises RuntimeError (TORCH_CHECK_TYPE TypeError, TORCH_CHECK_VALUE
# ValueError), AT_DISPATCH's "not implemented for 'Int'" is a NotImplementedError.
CLEAR_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError)
# An integer result may round, floor or truncate the real value: any of them is within one unit.
INTEGER_ROUNDING = Tolerance(atol=1.0, rtol=0.0)


def representative_shape_index(spec: OpSpec) -> int:
    """The first shape pairing where every tensor is at least 1-D and non-empty (0-d and empty tensors say little
    about values), else the first."""
    tensors = spec.tensor_inputs()
    n_shapes = len(tensors[0].shapes) if tensors else 1
    for i in range(n_shapes):
        if all(t.shapes[i] and all(t.shapes[i]) for t in tensors):
            return i
    return 0


# --------------------------------------------------------------------------------------------------- dtypes


def every_dtype_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Per device, the representative contiguous case (first argument values) in each claimed and tried dtype."""
    spec = loaded.spec
    wanted = representative_shape_index(spec)
    dtypes = tuple(dict.fromkeys(spec.dtypes + TRIED_DTYPES))
    selected = []
    for device in dict.fromkeys(c.device for c in cases):
        base = next(
            (
                c
                for c in cases
                if c.device == device and c.layout == "contiguous" and c.values_index == 0 and c.shape_index == wanted
            ),
            None,
        )
        if base is not None:
            selected += [replace(base, dtype=dtype) for dtype in dtypes]
    return selected


def dtypes(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    if case.dtype in loaded.spec.dtypes:
        try:
            _compare_with_reference(loaded, case, outputs_of(loaded, target, inputs), inputs, claimed=True)
        except CheckFailure as failure:
            raise CheckFailure(f"{case.dtype} is claimed, but {failure.message}", failure.mismatch) from failure
        return {"dtypes": None}
    try:
        returned = outputs_of(loaded, target, inputs)
    except CheckFailure as failure:
        error = failure.__cause__
        if isinstance(error, CLEAR_ERRORS) and str(error).strip():
            return {"dtypes": None}  # rejected with a message: what an op should do with a dtype it does not support
        raise CheckFailure(
            f"{case.dtype} is not claimed and the op fails on it without a clear error "
            f"({failure.message}). Reject it with TORCH_CHECK and a message."
        ) from error
    _compare_with_reference(loaded, case, returned, inputs, claimed=False)
    kinds = ", ".join(str(v.dtype).removeprefix("torch.") for v in returned if hasattr(v, "dtype")) or "nothing"
    return {
        "dtypes": PassNote(
            f"{case.dtype} on {case.device} is not claimed, but works (returns {kinds}): claim "
            "it in the spec's dtypes, or reject it with a clear error"
        )
    }


def _compare_with_reference(loaded: LoadedOp, case: Case, got: tuple, inputs: CaseInputs, claimed: bool) -> None:
    """Outputs and mutated arguments vs the float64 reference, cast the way the op's result is: an integer result
    to within one unit, a bool exactly, a floating one within its dtype's tolerance."""
    import torch

    what = "" if claimed else f"{case.dtype} is not claimed, and instead of rejecting it the op returns wrong values: "
    compared = against_reference(
        loaded, got, mutated_values(loaded, inputs), call_reference(loaded, _real_valued_reference(loaded, inputs))
    )
    for name, g, e in compared:
        if not isinstance(g, torch.Tensor) or not isinstance(e, torch.Tensor):
            check_result(name, g, e, tolerance_for(loaded.spec, case.dtype), None, case.device)
            continue
        dtype = compared_dtype(case.dtype, name, g, e) if claimed else g.dtype
        try:
            check_result(name, g, _as_the_op_would(e, g.dtype), _tolerance(loaded, g.dtype), dtype, case.device)
        except CheckFailure as failure:
            raise CheckFailure(what + failure.message, failure.mismatch) from None


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


def _as_the_op_would(expected, dtype):
    import torch

    if dtype == torch.bool:
        return (expected != 0).to(torch.float64)
    return expected if dtype.is_floating_point or dtype.is_complex else expected.trunc()


def _tolerance(loaded: LoadedOp, dtype) -> Tolerance:
    import torch

    if dtype == torch.bool:
        return Tolerance(atol=0.0, rtol=0.0)
    if not (dtype.is_floating_point or dtype.is_complex):
        return INTEGER_ROUNDING
    return tolerance_for(loaded.spec, str(dtype).removeprefix("torch."))


# --------------------------------------------------------------------------------------------- error_inputs


def error_input_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """Each invalid call the spec lists, once per device of the run, its unpinned tensors on that device. A device
    that every pinned tensor is on already is left out: the pin would change nothing there (`{y: {device: cuda}}` is
    the mixed-device call on the CPU case, and a valid call on the CUDA one). So is an entry that pins a tensor to a
    device the run leaves out (`--device cpu` on a machine with a GPU): it would use the device the user excluded."""
    run = list(dict.fromkeys(c.device for c in cases))
    return [
        _error_case(loaded.spec, entry, device)
        for entry in loaded.spec.error_inputs
        for device in run
        if _pinned_devices(entry) != {device} and not _pins_an_excluded_device(loaded.spec, entry, run)
    ]


def _pinned_devices(entry: ErrorInput) -> set[str]:
    return {t.device for t in entry.tensors if t.device}


def _pins_an_excluded_device(spec: OpSpec, entry: ErrorInput, run: list[str]) -> bool:
    """A pinned device the spec lists and this machine has, but the run's cases are not on: the run's filter left
    it out. (A device that is missing, or that the spec lacks, is reported as a skip with its reason instead.)"""
    from opforge.runner import device_unavailable  # here: the runner imports the checks

    return any(d in spec.devices and d not in run and device_unavailable(d) is None for d in _pinned_devices(entry))


def _error_case(spec: OpSpec, entry: ErrorInput, device: str) -> Case:
    tensors = _error_tensors(spec, entry, device)
    scalars = _error_scalars(spec, entry)
    return Case(
        dtype=tensors[0][2] if tensors else spec.dtypes[0],
        device=device,
        layout="contiguous",
        shapes=tuple((name, shape) for name, shape, _, _ in tensors),
        values=tuple(scalars.items()),
        values_index=0,
        shape_index=representative_shape_index(spec),
        label=entry.label,
    )


def _error_tensors(spec: OpSpec, entry: ErrorInput, device: str) -> list[tuple[str, tuple[int, ...], str, str]]:
    """(name, shape, dtype, device) of each tensor argument: the entry's, else the representative valid case's on
    the case's device."""
    index = representative_shape_index(spec)
    given = {t.name: t for t in entry.tensors}
    resolved = []
    for t in spec.tensor_inputs():
        override = given.get(t.name)
        shape = override.shape if override and override.shape is not None else t.shapes[index]
        dtype = (override.dtype if override else None) or t.dtype or spec.dtypes[0]
        resolved.append((t.name, shape, dtype, (override.device if override else None) or device))
    return resolved


def _unreachable_pin(spec: OpSpec, entry: ErrorInput) -> str | None:
    """Why the entry cannot run here: it pins a tensor to a device the spec does not list, or one that is missing."""
    from opforge.runner import device_unavailable  # here: the runner imports the checks

    for t in entry.tensors:
        if t.device and t.device not in spec.devices:
            return (
                f"{entry.description}: puts {t.name} on {t.device}, which the spec's devices "
                f"({', '.join(spec.devices)}) do not include. Add {t.device} to devices to run this call."
            )
        reason = t.device and device_unavailable(t.device)
        if reason:
            return f"{entry.description}: puts {t.name} on {t.device}: {reason}"
    return None


def _error_scalars(spec: OpSpec, entry: ErrorInput) -> dict[str, Any]:
    values = {i.name: i.values[0] for i in spec.inputs if isinstance(i, ScalarInput)}
    values.update(dict(entry.values))
    return values


def error_inputs(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    spec = ctx.loaded.spec
    entry = next(e for e in spec.error_inputs if e.label == case.label)
    unreachable = _unreachable_pin(spec, entry)
    if unreachable:
        raise CheckSkipped(unreachable)
    kwargs = _error_call(spec, entry, case, ctx.base_seed)
    expected = getattr(builtins, entry.error)
    wanted = f"{entry.error} with {entry.match!r} in its message"
    try:
        returned = target.fn(**kwargs)
    except Exception as exc:
        if not isinstance(exc, expected):
            raise CheckFailure(f"{entry.description}: expected {wanted}, got {short(exc)}") from exc
        if entry.match not in str(exc):
            raise CheckFailure(
                f"{entry.description}: raised {type(exc).__name__} as expected, but its message lacks "
                f"{entry.match!r}: {short(exc)}"
            ) from exc
        return {"error_inputs": None}
    raise CheckFailure(
        f"{entry.description}: the op accepted this invalid call and returned {_describe(returned)}; "
        f"expected {wanted}. Check the arguments (TORCH_CHECK) before computing."
    )


def _error_call(spec: OpSpec, entry: ErrorInput, case: Case, base_seed: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(case.seed(base_seed))
    inputs = {t.name: t for t in spec.tensor_inputs()}
    call: dict[str, Any] = dict(_error_scalars(spec, entry))
    try:
        for name, shape, dtype, device in _error_tensors(spec, entry, case.device):
            values = sample(inputs[name], shape, dtype, generator)
            call[name] = values.to(getattr(torch, dtype)).to(device)
    except Exception as exc:
        raise ReferenceFailure(f"could not make the inputs of {entry.description!r}: {short(exc)}") from exc
    return call


def _describe(returned: Any) -> str:
    values = returned if isinstance(returned, (tuple, list)) else (returned,)
    return ", ".join(
        f"a {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')} tensor" if hasattr(v, "shape") else repr(v)
        for v in values
    )
