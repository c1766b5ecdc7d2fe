"""large_index (CUDA, opt-in): a tensor past 2^31 elements, the elements around 2^31 and at the end compared with
the reference. Catches int32 indexing (vLLM #5781 and many more).

Such a kernel usually faults with an illegal memory access past 2^31 (or loops forever when its int index wraps
around): a sticky CUDA error that ruins the process. So the case runs in a child process of its own
(`python -m opforge.checks.large_index JOB`), which writes its verdict to a file; a child that dies or hangs after
it started the op is the op's failure.

The spec gives the large shape of every tensor input (`large_index: {shapes: {x: [2147487747]}}`); the op is
assumed elementwise: output element i depends on element i of each input, so the reference runs on windows only.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from opforge.cases import Case
from opforge.checks import CheckContext, Outcomes
from opforge.compare import CheckFailure, CheckSkipped, ReferenceFailure
from opforge.loading import LoadedOp, Target
from opforge.results import Mismatch
from opforge.spec import INT32_INDEX_LIMIT, ScalarInput

# Elements compared on each side of 2^31, and at the end of the tensor: enough to cover many thread blocks.
WINDOW = 2**20
# The child loads torch and the op (a few seconds), fills GBs and runs the op (milliseconds at H200 bandwidth). On
# an H200 (2026-12-02, torch 2.11+cu130, docs/measurements/h200-ci-gpu-checks-2026-12-02.txt) the whole failing
# run (its 18 correctness rows and the faulting large_index child) took 9.0 s. Past this, the op is taken to hang
# (an int index that wraps around keeps a grid-stride loop going forever); far above 9 s for slower GPUs and a
# cold start.
CHILD_TIMEOUT_S = 240
# Of the row's own time limit, what the parent keeps for itself after the child's: writing the job, reading the
# verdict, and the worker's report, so the child is killed (a verdict) before the worker is (a TIMEOUT row).
ROW_MARGIN_S = 10
# Memory headroom over the inputs and outputs: the allocator's rounding and the windows' copies.
MEMORY_HEADROOM = 1.05
# Lines of the child's stderr kept in a failure message (the CUDA error is near the end).
STDERR_LINES = 6


@dataclass(frozen=True)
class Job:
    """What the child runs: one implementation of a spec on one large case."""

    spec: str
    target: str
    seed: int
    dtype: str
    device: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    values: tuple[tuple[str, Any], ...]
    boundary: int = INT32_INDEX_LIMIT
    window: int = WINDOW
    cuda_arch: str | None = None
    result_path: str = ""


def opted_out(loaded: LoadedOp, large: bool) -> str | None:
    spec = loaded.spec
    if large or (spec.large_index and spec.large_index.enabled):
        return None
    # Only asked of a spec whose checks include large_index, which the spec loader allows only with the section.
    gib = _required_bytes(loaded, spec.large_index.dtype, dict(spec.large_index.shapes)) / 2**30
    return (
        f"opt-in: large_index needs ~{gib:.0f} GiB of GPU memory; run `opforge check --large` or set "
        "large_index.enabled: true in the spec"
    )


def large_index_cases(loaded: LoadedOp, target: Target, cases: list[Case]) -> list[Case]:
    """One case on CUDA (where the matrix has CUDA cases) in the large_index dtype, with the first argument values."""
    large = loaded.spec.large_index
    base = next((c for c in cases if c.device == "cuda" and c.values_index == 0), None)
    if large is None or base is None:
        return []
    return [replace(base, dtype=large.dtype, layout="contiguous", shapes=large.shapes, shape_index=-1)]


def large_index(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    loaded = ctx.loaded
    build = loaded.build.plan.toolchain.cuda_archs if loaded.build else ()
    job = Job(
        spec=str(loaded.spec.path),
        target=target.name,
        seed=case.seed(ctx.base_seed),
        dtype=case.dtype,
        device=case.device,
        shapes=case.shapes,
        values=case.values,
        cuda_arch=";".join(build) or None,
    )
    return {"large_index": run_in_child(job, child_time_limit(ctx.time_limit))}


def child_time_limit(row_limit: float | None) -> float:
    """CHILD_TIMEOUT_S, shortened to fit in the row's time limit (the spec's `timeout:` or --timeout) when that is
    lower; never below half the row's limit."""
    if row_limit is None:
        return CHILD_TIMEOUT_S
    return min(CHILD_TIMEOUT_S, max(row_limit - ROW_MARGIN_S, row_limit / 2))


# ------------------------------------------------------------------------------------------------ the parent


def run_in_child(job: Job, timeout_s: float = CHILD_TIMEOUT_S) -> CheckFailure | None:
    """Run `job` in a fresh Python process; its verdict, or the op's failure if the process died or hung."""
    with tempfile.TemporaryDirectory(prefix="opforge-large-") as tmp:
        job = replace(job, result_path=str(Path(tmp) / "result.jsonl"))
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(asdict(job)))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "opforge.checks.large_index", str(job_path)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=_child_env(),
            )
            returncode, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as exc:
            returncode, stderr = None, exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        records = _records(Path(job.result_path))
    return verdict(records, returncode, stderr, timeout_s)


def _child_env() -> dict[str, str]:
    # The child imports opforge from where the parent did, installed or not.
    root = str(Path(__file__).resolve().parent.parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verdict(
    records: list[dict[str, Any]], returncode: int | None, stderr: str, timeout_s: float
) -> CheckFailure | None:
    """The outcome from what the child wrote (its stages, then its verdict) and how it ended."""
    final = next((r for r in reversed(records) if "verdict" in r), None)
    if final is not None:
        if final["verdict"] == "pass":
            return None
        if final["verdict"] == "skip":
            raise CheckSkipped(final["message"])
        if final["verdict"] == "error":
            raise ReferenceFailure(final["message"])
        mismatch = final.get("mismatch")
        return CheckFailure(
            final["message"], Mismatch(**{**mismatch, "index": tuple(mismatch["index"])}) if mismatch else None
        )
    tail = "\n".join(line for line in stderr.splitlines() if line.strip())[-2000:].splitlines()[-STDERR_LINES:]
    how = f"did not finish within {timeout_s:g} s" if returncode is None else _death(returncode)
    if not any(r.get("stage") == "running" for r in records):
        raise ReferenceFailure(f"the large_index child process {how} before it ran the op:\n" + "\n".join(tail))
    return CheckFailure(
        f"the op {how} on a tensor past 2^31 elements (in a child process of its own, so the run "
        "goes on). An int32 index or size overflows there. Index with int64_t.\n" + "\n".join(tail)
    )


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed the process with {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed the process with signal {-returncode}"
    return f"ended the process with exit code {returncode}"


def _required_bytes(loaded: LoadedOp, dtype: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Inputs, plus one output per returned tensor, each the size of an input (the elementwise assumption)."""
    import torch

    n = math.prod(next(iter(shapes.values())))
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    outputs = len(loaded.overload._schema.returns)
    return int((len(shapes) + outputs) * n * element * MEMORY_HEADROOM)


# ------------------------------------------------------------------------------------------------- the child


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
        record = {"verdict": "skip", "message": str(exc)}
    except CheckFailure as failure:
        record = {
            "verdict": "fail",
            "message": failure.message,
            "mismatch": asdict(failure.mismatch) if failure.mismatch else None,
        }
    except ReferenceFailure as exc:
        record = {"verdict": "error", "message": str(exc)}
    except torch.OutOfMemoryError as exc:
        record = {
            "verdict": "skip",
            "message": f"out of memory on {job.device} outside the op (its inputs past 2^31 "
            f"elements, their windows): {_summary(exc)}",
        }
    except Exception as exc:  # a bug outside the op (loading, the windows, the reference): not the op's failure
        record = {"verdict": "error", "message": f"the large_index child process failed: {_summary(exc)}"}
    write(record)
    return 0


def _summary(exc: Exception) -> str:
    """The exception and where it was raised, for a verdict without a traceback."""
    import traceback

    from opforge.checks.calls import short

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return short(exc) + where


def _child_run(job: Job, write) -> dict[str, Any]:
    import torch

    from opforge.checks.calls import short
    from opforge.loading import load_op
    from opforge.spec import load_spec

    try:
        loaded = load_op(load_spec(job.spec), job.cuda_arch)
    except Exception as exc:
        raise ReferenceFailure(f"could not load the spec in the child process: {exc}") from exc
    target = next(t for t in loaded.targets if t.name == job.target)
    shapes = dict(job.shapes)
    _check_memory(loaded, job, shapes)
    kwargs = _large_inputs(loaded, job, shapes)
    before = _windows(job, kwargs)
    write({"stage": "running"})
    try:
        returned = target.fn(**kwargs)
        if job.device == "cuda":
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        raise CheckSkipped(
            f"out of memory on {job.device} while the op ran on a tensor past 2^31 elements (it "
            f"needs more than the inputs and outputs): {short(exc)}"
        ) from exc
    except Exception as exc:
        raise CheckFailure(
            f"{target.name} raised {short(exc)} on a tensor past 2^31 elements, where an int32 index "
            "or size overflows (an illegal memory access is the usual sign). Index with int64_t."
        ) from exc
    _compare_windows(loaded, job, returned, kwargs, before)
    return {"verdict": "pass"}


def _check_memory(loaded: LoadedOp, job: Job, shapes: dict[str, tuple[int, ...]]) -> None:
    import torch

    needed = _required_bytes(loaded, job.dtype, shapes)
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
    return kwargs


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


def _compare_windows(loaded: LoadedOp, job: Job, returned: Any, kwargs: dict[str, Any], before) -> None:
    import torch

    from opforge.checks.calls import against_reference, compared_dtype
    from opforge.compare import as_tuple, tolerance_for

    got = as_tuple(returned) if loaded.overload._schema.returns else ()
    mutated = {name: kwargs[name] for name in loaded.mutated_arguments}
    tol = tolerance_for(loaded.spec, job.dtype)
    shape = tuple(next(iter(dict(job.shapes).values())))
    for (lo, hi), window in before.items():
        reference_args = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in window.items()}
        try:
            result = loaded.reference(**{**dict(kwargs), **reference_args})
        except Exception as exc:
            raise ReferenceFailure(f"the reference raised {exc} on elements {lo}..{hi}") from exc
        for name, g, e in against_reference(loaded, got, mutated, as_tuple(result) if result is not None else ()):
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


def _compare_window(name: str, part: Any, expected: Any, job: Job, lo: int, shape: tuple[int, ...], tol) -> None:
    import torch

    from opforge.compare import worst_mismatch

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


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
