"""The child process of the large_index check (opforge.checks.large_index): load the op, run it once on inputs past
2^31 elements, compare windows of the output with the reference, and send the verdict. It speaks the protocol of
every child (opforge.core.protocol) as the engine's workers do: its LargeIndexJob on stdin, Running (before the
op runs) and its Outcome on a duplicate of the original stdout, fd 1 then pointing at stderr so that the op's own
prints never reach the protocol. A fault here ends this process, not the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opforge.building.op import LoadedOp
from opforge.cases.arguments import argument_value
from opforge.checks.large_index import required_bytes
from opforge.core.outcomes import CheckFailure, CheckSkipped, ReferenceFailure, short
from opforge.core.protocol import LargeIndexJob, Message, Outcome, Running, send
from opforge.core.results import Status, Verdict
from opforge.spec.model import ScalarInput, Tolerance

if TYPE_CHECKING:
    import torch


def child_main(job: LargeIndexJob, say: Callable[[Message], None]) -> int:
    import torch

    try:
        verdict = _child_run(job, say)
    except CheckSkipped as exc:
        verdict = Verdict(Status.SKIP, str(exc))
    except CheckFailure as failure:
        verdict = Verdict(Status.FAIL, failure.message, failure.mismatch)
    except ReferenceFailure as exc:
        verdict = Verdict(Status.ERROR, str(exc))
    except torch.OutOfMemoryError as exc:
        verdict = Verdict(
            Status.SKIP,
            f"out of memory on {job.device} outside the op (its inputs past 2^31 elements, their windows): "
            f"{_summary(exc)}",
        )
    except Exception as exc:  # a bug outside the op (loading, the windows, the reference): not the op's failure
        verdict = Verdict(Status.ERROR, f"the large_index child process failed: {_summary(exc)}")
    say(Outcome(verdict))
    return 0


def _summary(exc: Exception) -> str:
    """The exception and where it was raised, for a verdict without a traceback."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return short(exc) + where


def _child_run(job: LargeIndexJob, say: Callable[[Message], None]) -> Verdict:
    import torch

    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    try:
        loaded = load_checked(load_spec(job.spec), job.cuda_arch)
    except Exception as exc:
        raise ReferenceFailure(f"could not load the spec in the child process: {exc}") from exc
    implementation = next(t for t in loaded.implementations if t.name == job.implementation)
    shapes = dict(job.shapes)
    _check_memory(loaded, job, shapes)
    kwargs = _large_inputs(loaded, job, shapes)
    before = _windows(job, kwargs)
    say(Running())
    try:
        returned = implementation.fn(**kwargs)
        if job.device == "cuda":
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        raise CheckSkipped(
            f"out of memory on {job.device} while the op ran on a tensor past 2^31 elements (it "
            f"needs more than the inputs and outputs): {short(exc)}"
        ) from exc
    except Exception as exc:
        raise CheckFailure(
            f"{implementation.name} raised {short(exc)} on a tensor past 2^31 elements, where an int32 index "
            "or size overflows (an illegal memory access is the usual sign). Index with int64_t."
        ) from exc
    _compare_windows(loaded, job, returned, kwargs, before)
    return Verdict(Status.PASS)


def _check_memory(loaded: LoadedOp, job: LargeIndexJob, shapes: dict[str, tuple[int, ...]]) -> None:
    import torch

    needed = required_bytes(loaded, job.dtype, shapes)
    if job.device == "cuda":
        free = torch.cuda.mem_get_info()[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > free:
        raise CheckSkipped(
            f"not enough memory on {job.device}: large_index needs ~{needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB are free"
        )


def _large_inputs(loaded: LoadedOp, job: LargeIndexJob, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Uniform values in each input's [low, high], drawn on the device (a float64 copy would not fit)."""
    import torch

    generator = torch.Generator(device=job.device).manual_seed(job.seed)
    kwargs: dict[str, Any] = dict(job.values)
    for t in loaded.spec.tensor_inputs():
        dtype = getattr(torch, t.dtype or job.dtype)
        value = torch.empty(shapes[t.name], dtype=dtype, device=job.device)
        if dtype.is_floating_point:
            value.uniform_(t.low, t.high, generator=generator)
        else:
            value.random_(int(t.low), int(t.high) + 1, generator=generator)
        kwargs[t.name] = value
    for s in loaded.spec.inputs:
        if isinstance(s, ScalarInput):
            kwargs.setdefault(s.name, s.values[0])
    arguments = {a.name: a for a in loaded.arguments}
    return {n: argument_value(arguments[n], v, job.dtype) if n in arguments else v for n, v in kwargs.items()}


def _window_bounds(job: LargeIndexJob, n: int) -> list[tuple[int, int]]:
    """[boundary - window, boundary + window) and the last `window` elements, merged where they overlap."""
    spans = sorted(
        {(max(0, job.boundary - job.window), min(n, job.boundary + job.window)), (max(0, n - job.window), n)}
    )
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _windows(job: LargeIndexJob, kwargs: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """Each window of each tensor argument, copied to the CPU before the op runs (mutated arguments change)."""
    import torch

    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    n = next(iter(tensors.values())).numel()
    return {(lo, hi): {k: v.reshape(-1)[lo:hi].cpu() for k, v in tensors.items()} for lo, hi in _window_bounds(job, n)}


def _compare_windows(
    loaded: LoadedOp,
    job: LargeIndexJob,
    returned: Any,
    kwargs: dict[str, Any],
    before: dict[tuple[int, int], dict[str, Any]],
) -> None:
    import torch

    from opforge.cases.compare import tolerance_for
    from opforge.checks.op_and_reference import against_reference, compared_dtype, op_outputs, reference_values

    got = op_outputs(loaded, returned)
    mutated = {name: kwargs[name] for name in loaded.mutated_arguments}
    tol = tolerance_for(loaded.spec, job.dtype)
    shape = tuple(next(iter(dict(job.shapes).values())))
    for (lo, hi), window in before.items():
        reference_args = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in window.items()}
        try:
            result = loaded.reference(**{**dict(kwargs), **reference_args})
        except Exception as exc:
            raise ReferenceFailure(f"the reference raised {exc} on elements {lo}..{hi}") from exc
        for name, g, e in against_reference(loaded, got, mutated, reference_values(loaded, result)):
            _require_large(name, g, shape, compared_dtype(job.dtype, name, g, e))
            _compare_window(name, g.reshape(-1)[lo:hi], e.reshape(-1), job, lo, shape, tol)


def _require_large(name: str, value: object, shape: tuple[int, ...], dtype: torch.dtype | None) -> None:
    """The whole output must be there before a window of it is compared: a short one would give empty windows."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise CheckFailure(f"{name}: expected a Tensor, got {type(value).__name__}. Return a tensor.")
    if tuple(value.shape) != shape:
        raise CheckFailure(
            f"{name}: expected shape {shape} (the inputs' shape; large_index assumes an elementwise "
            f"op), got {tuple(value.shape)}. Size outputs from the inputs with int64 sizes."
        )
    if value.dtype != dtype:
        raise CheckFailure(
            f"{name}: expected dtype {dtype}, got {value.dtype} on a tensor past 2^31 elements. "
            "Allocate the output with the input's options."
        )


def _compare_window(
    name: str,
    part: torch.Tensor,
    expected: torch.Tensor,
    job: LargeIndexJob,
    lo: int,
    shape: tuple[int, ...],
    tol: Tolerance,
) -> None:
    import torch

    from opforge.cases.compare import worst_mismatch

    mismatch = worst_mismatch(name, part, expected, tol)
    if mismatch is None:
        return
    at = int(mismatch.index[0]) + lo if mismatch.index else lo
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), shape))
    raise CheckFailure(
        f"{name}: {mismatch.mismatched} of {mismatch.total} elements in {lo}..{lo + part.numel() - 1} (around index "
        f"{job.boundary} and at the end) differ from the reference: an int32 index or size overflows. "
        "Index with int64_t.",
        replace(mismatch, index=index),
    )


def main() -> None:
    """What child.entry_point runs: the job on stdin, the protocol on a duplicate of stdout (fd 1 is then stderr)."""
    job_line = sys.stdin.readline()
    channel = os.dup(1)
    os.dup2(2, 1)
    sys.exit(child_main(LargeIndexJob.from_line(job_line), lambda message: send(channel, message)))


if __name__ == "__main__":
    main()
