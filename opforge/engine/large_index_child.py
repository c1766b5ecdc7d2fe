"""The child process of the large_index check (opforge.checks.large_index): load the op, run it once on inputs past
2^31 elements, compare windows of the output with the reference, and write the verdict to the job's result file.
Its one argument is the job file (started by child.entry_point; `python -m` runs it too): a fault here ends this
process, not the run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from opforge.building.op import LoadedOp
from opforge.cases.arguments import argument_value
from opforge.checks.large_index import Job, required_bytes
from opforge.core.outcomes import CheckFailure, CheckSkipped, ReferenceFailure, short
from opforge.core.results import Status
from opforge.spec.model import ScalarInput, Tolerance


def child_main(job_path: str) -> int:
    import torch

    job = Job(**json.loads(Path(job_path).read_text()))
    job = replace(job, shapes=tuple((n, tuple(s)) for n, s in job.shapes), values=tuple(map(tuple, job.values)))
    result = Path(job.result_path)

    def write(record: dict[str, Any]) -> None:
        with result.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    try:
        record = _child_run(job, write)
    except CheckSkipped as exc:
        record = {"verdict": Status.SKIP.value, "message": str(exc)}
    except CheckFailure as failure:
        record = {
            "verdict": Status.FAIL.value,
            "message": failure.message,
            "mismatch": asdict(failure.mismatch) if failure.mismatch else None,
        }
    except ReferenceFailure as exc:
        record = {"verdict": Status.ERROR.value, "message": str(exc)}
    except torch.OutOfMemoryError as exc:
        record = {
            "verdict": Status.SKIP.value,
            "message": f"out of memory on {job.device} outside the op (its inputs past 2^31 "
            f"elements, their windows): {_summary(exc)}",
        }
    except Exception as exc:  # a bug outside the op (loading, the windows, the reference): not the op's failure
        record = {"verdict": Status.ERROR.value, "message": f"the large_index child process failed: {_summary(exc)}"}
    write(record)
    return 0


def _summary(exc: Exception) -> str:
    """The exception and where it was raised, for a verdict without a traceback."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return short(exc) + where


def _child_run(job: Job, write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    import torch

    from opforge.building.op import load_op
    from opforge.loading.spec import load_spec

    try:
        loaded = load_op(load_spec(job.spec), job.cuda_arch)
    except Exception as exc:
        raise ReferenceFailure(f"could not load the spec in the child process: {exc}") from exc
    implementation = next(t for t in loaded.implementations if t.name == job.implementation)
    shapes = dict(job.shapes)
    _check_memory(loaded, job, shapes)
    kwargs = _large_inputs(loaded, job, shapes)
    before = _windows(job, kwargs)
    write({"stage": "running"})
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
    return {"verdict": Status.PASS.value}


def _check_memory(loaded: LoadedOp, job: Job, shapes: dict[str, tuple[int, ...]]) -> None:
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


def _large_inputs(loaded: LoadedOp, job: Job, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
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


def _window_bounds(job: Job, n: int) -> list[tuple[int, int]]:
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


def _windows(job: Job, kwargs: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """Each window of each tensor argument, copied to the CPU before the op runs (mutated arguments change)."""
    import torch

    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    n = next(iter(tensors.values())).numel()
    return {(lo, hi): {k: v.reshape(-1)[lo:hi].cpu() for k, v in tensors.items()} for lo, hi in _window_bounds(job, n)}


def _compare_windows(
    loaded: LoadedOp,
    job: Job,
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


def _require_large(name: str, value: Any, shape: tuple[int, ...], dtype: Any) -> None:
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
    name: str, part: Any, expected: Any, job: Job, lo: int, shape: tuple[int, ...], tol: Tolerance
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
    """What child.entry_point runs: the job file's path is the one argument."""
    sys.exit(child_main(sys.argv[1]))


if __name__ == "__main__":
    main()
