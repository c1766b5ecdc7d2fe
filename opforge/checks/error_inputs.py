"""error_inputs: each invalid call the spec lists must raise its error, with its message."""

from __future__ import annotations

import builtins
from typing import Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import argument_value, sample
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes
from opforge.core.environment import device_unavailable
from opforge.core.outcomes import CheckFailure, CheckSkipped, ReferenceFailure, short
from opforge.spec.model import ErrorInput, OpSpec, ScalarInput


def error_input_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Each invalid call the spec lists, once per device of the run, its unpinned tensors on that device. A device
    that every pinned tensor is on already is left out: the pin would change nothing there (`{y: {device: cuda}}` is
    the mixed-device call on the CPU case, and a valid call on the CUDA one). So is an entry that pins a tensor to a
    device the run leaves out (`--device cpu` on a machine with a GPU): it would use the device the user excluded."""
    run = list(dict.fromkeys(c.device for c in cases))
    spec = loaded.spec
    return [
        _error_case(spec, entry, device)
        for entry in spec.error_inputs
        if not _pins_an_excluded_device(spec, entry, run)
        for device in _unpinned_devices(spec, entry, run)
    ]


def _unpinned_devices(spec: OpSpec, entry: ErrorInput, run: list[str]) -> list[str]:
    """Where the entry's unpinned tensors go: each run device but the one every pinned tensor is on. When that
    leaves none (`--device cuda` and an entry pinning `out` to cuda), the first other device the spec lists and
    this machine has (the CPU): the mixed-device call the entry stands for, the one an unfiltered run makes too;
    dropping it would drop the only call that tests the CUDA kernel's device check."""
    pinned = _pinned_devices(entry)
    devices = [d for d in run if pinned != {d}]
    if devices or not pinned or not pinned <= set(run):
        return devices
    return [d for d in spec.devices if d not in pinned and device_unavailable(d) is None][:1]


def _pinned_devices(entry: ErrorInput) -> set[str]:
    return {t.device for t in entry.tensors if t.device}


def _pins_an_excluded_device(spec: OpSpec, entry: ErrorInput, run: list[str]) -> bool:
    """A pinned device the spec lists and this machine has, but the run's cases are not on: the run's filter left
    it out. (A device that is missing, or that the spec lacks, is reported as a skip with its reason instead.)"""
    return any(d in spec.devices and d not in run and device_unavailable(d) is None for d in _pinned_devices(entry))


def _error_case(spec: OpSpec, entry: ErrorInput, device: str) -> Case:
    tensors = _error_tensors(spec, entry, device)
    scalars = _error_scalars(spec, entry)
    return Case(
        dtype=tensors[0][2] if tensors else spec.dtypes_on(device)[0],
        device=device,
        layout="contiguous",
        shapes=tuple((name, shape) for name, shape, _, _ in tensors),
        values=tuple(scalars.items()),
        values_index=0,
        shape_index=spec.representative_shape_index(),
        label=entry.label,
    )


def _error_tensors(spec: OpSpec, entry: ErrorInput, device: str) -> list[tuple[str, tuple[int, ...], str, str]]:
    """(name, shape, dtype, device) of each tensor argument: the entry's, else the representative valid case's on
    the case's device (an optional tensor its sample leaves None stays None, one of its values)."""
    index = spec.representative_shape_index()
    given = {t.name: t for t in entry.tensors}
    resolved = []
    for t in spec.tensor_inputs():
        override = given.get(t.name)
        shape = override.shape if override and override.shape is not None else t.shapes[index]
        if shape is None:
            continue
        dtype = (override.dtype if override else None) or t.dtype or spec.dtypes_on(device)[0]
        resolved.append((t.name, shape, dtype, (override.device if override else None) or device))
    return resolved


def _unreachable_pin(spec: OpSpec, entry: ErrorInput) -> str | None:
    """Why the entry cannot run here: it pins a tensor to a device the spec does not list, or one that is missing."""
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
    """The entry's values, else the representative valid case's (its sample's, in a sample spec)."""
    values = dict(spec.samples.values[spec.representative_shape_index()]) if spec.samples else {}
    values |= {i.name: i.values[0] for i in spec.inputs if isinstance(i, ScalarInput)}
    values.update(dict(entry.values))
    return values


def error_inputs(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    spec = ctx.loaded.spec
    entry = next(e for e in spec.error_inputs if e.label == case.label)
    unreachable = _unreachable_pin(spec, entry)
    if unreachable:
        raise CheckSkipped(unreachable)
    kwargs = _error_call(ctx.loaded, entry, case, ctx.base_seed)
    expected = getattr(builtins, entry.error)
    wanted = f"{entry.error} with {entry.match!r} in its message"
    try:
        returned = implementation.fn(**kwargs)
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


def _error_call(loaded: LoadedOp, entry: ErrorInput, case: Case, base_seed: int) -> dict[str, Any]:
    import torch

    spec = loaded.spec
    generator = torch.Generator().manual_seed(case.seed(base_seed))
    inputs = {t.name: t for t in spec.tensor_inputs()}
    arguments = {a.name: a for a in loaded.arguments}
    scalars = _error_scalars(spec, entry)
    call: dict[str, Any] = {
        n: argument_value(arguments[n], v, case.dtype) if n in arguments else v for n, v in scalars.items()
    }
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


CHECKS = (
    Check(
        "error_inputs",
        "each invalid call the spec lists raises its error with its message (needs `error_inputs:`)",
        error_input_cases,
        error_inputs,
        claim="error_inputs",
    ),
)
