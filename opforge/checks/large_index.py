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
# The child loads torch and the op (a few seconds), fills GBs and runs the op (milliseconds at H200 bandwidth):
# well under a minute when healthy (an estimate: not yet timed on a GPU). Past this, the op is taken to hang (an int
# index that wraps around keeps a grid-stride loop going forever).
CHILD_TIMEOUT_S = 240
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
    gib = _required_bytes(loaded, spec.large_index.dtype, dict(spec.large_index.shapes)) / 2**30 \
        if spec.large_index else 0
    return (f"opt-in: large_index needs ~{gib:.0f} GiB of GPU memory; run `opforge check --large` or set "
            "large_index.enabled: true in the spec")


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
    job = Job(spec=str(loaded.spec.path), target=target.name, seed=case.seed(ctx.base_seed), dtype=case.dtype,
              device=case.device, shapes=case.shapes, values=case.values, cuda_arch=";".join(build) or None)
    return {"large_index": run_in_child(job)}


# ------------------------------------------------------------------------------------------------ the parent


def run_in_child(job: Job, timeout_s: float = CHILD_TIMEOUT_S) -> CheckFailure | None:
    """Run `job` in a fresh Python process; its verdict, or the op's failure if the process died or hung."""
    with tempfile.TemporaryDirectory(prefix="opforge-large-") as tmp:
        job = replace(job, result_path=str(Path(tmp) / "result.jsonl"))
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(asdict(job)))
        try:
            done = subprocess.run([sys.executable, "-m", "opforge.checks.large_index", str(job_path)],
                                  capture_output=True, text=True, timeout=timeout_s, env=_child_env())
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


def verdict(records: list[dict[str, Any]], returncode: int | None, stderr: str, timeout_s: float) \
        -> CheckFailure | None:
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
        return CheckFailure(final["message"], Mismatch(**{**mismatch, "index": tuple(mismatch["index"])})
                            if mismatch else None)
    tail = "\n".join(line for line in stderr.splitlines() if line.strip())[-2000:].splitlines()[-STDERR_LINES:]
    how = f"did not finish within {timeout_s:g} s" if returncode is None else _death(returncode)
    if not any(r.get("stage") == "running" for r in records):
        raise ReferenceFailure(f"the large_index child process {how} before it ran the op:\n" + "\n".join(tail))
    return CheckFailure(f"the op {how} on a tensor past 2^31 elements (in a child process of its own, so the run "
                        "goes on). An int32 index or size overflows there: index with int64_t.\n" + "\n".join(tail))


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

    n = _numel(next(iter(shapes.values())))
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    outputs = len(loaded.overload._schema.returns)
    return int((len(shapes) + outputs) * n * element * MEMORY_HEADROOM)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


# ------------------------------------------------------------------------------------------------- the child


def child_main(job_path: str) -> int:
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
        record = {"verdict": "fail", "message": failure.message,
                  "mismatch": asdict(failure.mismatch) if failure.mismatch else None}
    except ReferenceFailure as exc:
        record = {"verdict": "error", "message": str(exc)}
    write(record)
    return 0


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
    except Exception as exc:
        raise CheckFailure(f"{target.name} raised {short(exc)} on a tensor past 2^31 elements") from exc
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
        raise CheckSkipped(f"not enough memory on {job.device}: large_index needs ~{needed / 2**30:.1f} GiB, "
                           f"{free / 2**30:.1f} GiB are free")


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
    spans = sorted({(max(0, job.boundary - job.window), min(n, job.boundary + job.window)),
                    (max(0, n - job.window), n)})
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

    from opforge.checks.calls import expected_dtype, output_names, split_reference
    from opforge.compare import as_tuple, tolerance_for, worst_mismatch

    got = as_tuple(returned) if loaded.overload._schema.returns else ()
    tol = tolerance_for(loaded.spec, job.dtype)
    shape = tuple(next(iter(dict(job.shapes).values())))
    for (lo, hi), window in before.items():
        reference_args = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in window.items()}
        try:
            result = loaded.reference(**{**dict(kwargs), **reference_args})
        except Exception as exc:
            raise ReferenceFailure(f"the reference raised {exc} on elements {lo}..{hi}") from exc
        outputs, new_values = split_reference(loaded, as_tuple(result) if result is not None else ())
        compared = [(name, g, e) for name, g, e in zip(output_names(loaded), got, outputs)] + [
            (f"{name} (mutated)", kwargs[name], e) for name, e in new_values.items()]
        for name, g, e in compared:
            part = g.reshape(-1)[lo:hi]
            if part.dtype != expected_dtype(job.dtype, e):
                raise CheckFailure(f"{name}: expected dtype {expected_dtype(job.dtype, e)}, got {part.dtype}.")
            mismatch = worst_mismatch(name, part, e.reshape(-1), tol)
            if mismatch is not None:
                at = int(mismatch.index[0]) + lo if mismatch.index else lo
                index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), shape))
                raise CheckFailure(
                    f"{name}: {mismatch.mismatched} of {mismatch.total} elements in {lo}..{hi - 1} (around index "
                    f"{job.boundary} and at the end) differ from the reference: an int32 index or size overflows. "
                    "Index with int64_t.", replace(mismatch, index=index))


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
