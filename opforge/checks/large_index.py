"""large_index (CUDA, opt-in): a tensor past 2^31 elements, the elements around 2^31 and at the end compared with
the reference. Catches int32 indexing (vLLM #5781 and many more).

Such a kernel usually faults with an illegal memory access past 2^31 (or loops forever when its int index wraps
around): a sticky CUDA error that ruins the process. So the case runs in a child process of its own
(opforge.engine.large_index_child, started as the engine's workers are: opforge.child), which speaks the protocol
of every child (opforge.core.protocol: a LargeIndexJob on its stdin, Running and its Outcome back); a child that
dies or hangs after it started the op is the op's failure.

The spec gives the large shape of every tensor input (`large_index: {shapes: {x: [2147487747]}}`); the op is
assumed elementwise: output element i depends on element i of each input, so the reference runs on windows only.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import time
from dataclasses import dataclass, replace

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, CheckOption, OptIn, Outcomes, SpecBeforeSections, SpecSection
from opforge.core.child import ChildProcess, describe_exit, file_tail, with_this_opforge
from opforge.core.outcomes import CheckFailure, CheckSkipped, ReferenceFailure
from opforge.core.protocol import LargeIndexJob, Message, Outcome, Running, decode_stream
from opforge.core.results import Status
from opforge.spec.model import KNOWN_DTYPES, TensorInput
from opforge.spec.reader import Reader, one_of, read_bool, read_shape

# int32 indexing breaks past this many elements: a large_index shape must exceed it.
INT32_INDEX_LIMIT = 2**31

# Elements compared on each side of 2^31, and at the end of the tensor: enough to cover many thread blocks.
WINDOW = 2**20
# The child loads torch and the op (a few seconds), fills GBs and runs the op (milliseconds at H200 bandwidth). On
# an H200 (2026-12-02, torch 2.11+cu130, docs/measurements/h200-ci-gpu-checks-2026-12-02.txt) the whole failing
# run (its 18 correctness results and the faulting large_index child) took 9.0 s. Past this, the op is taken to hang
# (an int index that wraps around keeps a grid-stride loop going forever); far above 9 s for slower GPUs and a
# cold start.
CHILD_TIMEOUT_S = 240
# Of the task's own time limit, what the parent keeps for itself after the child's: writing the job, reading the
# verdict, and the worker's report, so the child is killed (a verdict) before the worker is (a TIMEOUT result).
TASK_MARGIN_S = 10
# Memory headroom over the inputs and outputs: the allocator's rounding and the windows' copies.
MEMORY_HEADROOM = 1.05
# Lines of the child's stderr kept in a failure message (the CUDA error is near the end).
STDERR_LINES = 6


def unless_asked(loaded: LoadedOp) -> str | None:
    """Why large_index does not run unless asked: the GBs it takes, unless the spec enables it."""
    claim = loaded.spec.section("large_index")
    # Asked only of a spec whose checks include large_index, which the spec loader allows only with the section.
    if claim is None or claim.enabled:
        return None
    gib = required_bytes(loaded, claim.dtype, dict(claim.shapes)) / 2**30
    return (
        f"opt-in: large_index needs ~{gib:.0f} GiB of GPU memory; run `opforge check --large` or set "
        "large_index.enabled: true in the spec"
    )


def large_index_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One case on CUDA (where the matrix has CUDA cases) in the large_index dtype, with the first argument values."""
    large = loaded.spec.section("large_index")
    base = next((c for c in cases if c.device == "cuda" and c.values_index == 0), None)
    if large is None or base is None:
        return []
    return [replace(base, dtype=large.dtype, layout="contiguous", shapes=large.shapes, shape_index=-1)]


def large_index(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    loaded = ctx.loaded
    build = loaded.build.plan.toolchain.cuda_archs if loaded.build else ()
    job = LargeIndexJob(
        spec=str(loaded.spec.path),
        implementation=implementation.name,
        seed=case.seed(ctx.base_seed),
        dtype=case.dtype,
        device=case.device,
        shapes=case.shapes,
        values=case.values,
        boundary=INT32_INDEX_LIMIT,
        window=WINDOW,
        cuda_arch=";".join(build) or None,
    )
    return {"large_index": run_in_child(job, child_time_limit(ctx.time_limit))}


def child_time_limit(task_limit: float | None) -> float:
    """CHILD_TIMEOUT_S, shortened to fit in the task's time limit (the spec's `timeout:` or --timeout) when that is
    lower; never below half the task's limit."""
    if task_limit is None:
        return CHILD_TIMEOUT_S
    return min(CHILD_TIMEOUT_S, max(task_limit - TASK_MARGIN_S, task_limit / 2))


# ------------------------------------------------------------------------------------------------ the parent


def run_in_child(job: LargeIndexJob, timeout_s: float = CHILD_TIMEOUT_S) -> CheckFailure | None:
    """Run `job` in a fresh Python process; its verdict, or the op's failure if the process died or hung."""
    child = ChildProcess("opforge.engine.large_index_child", with_this_opforge(os.environ))
    try:
        child.send(job.to_line())
        child.stdin.close()
        said, returncode = _until_end(child, time.monotonic() + timeout_s)
        stderr = file_tail(child.stderr)
    finally:
        child.close()
    messages, cut = decode_stream(said)
    return verdict(messages, returncode, stderr, timeout_s, cut)


def _until_end(child: ChildProcess, deadline: float) -> tuple[bytes, int | None]:
    """Everything the child said, and its exit code once it ended (None: it was killed at the deadline)."""
    said = b""
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([child], [], [], left)
        if not readable:
            break
        chunk = os.read(child.fileno(), 1 << 16)
        if not chunk:  # it closed its channel: it is ending
            try:
                return said, child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # it hangs on its way out
                break
        said += chunk
    child.kill()
    return said, None


def verdict(
    messages: list[Message], returncode: int | None, stderr: str, timeout_s: float, cut: str = ""
) -> CheckFailure | None:
    """The outcome from what the child said (Running, then its Outcome) and how it ended; `cut`: the start of a
    message it died in the middle of."""
    final = next((m.verdict for m in reversed(messages) if isinstance(m, Outcome)), None)
    if final is not None:
        if final.status == Status.PASS:
            return None
        if final.status == Status.SKIP:
            raise CheckSkipped(final.message)
        if final.status == Status.ERROR:
            raise ReferenceFailure(final.message)
        return CheckFailure(final.message, final.mismatch)
    lines = [line for line in stderr.splitlines() if line.strip()]
    if cut.strip():
        lines.append(f"(it died in the middle of a message to opforge: {cut.strip()[:200]})")
    tail = "\n".join(lines)[-2000:].splitlines()[-STDERR_LINES:]
    how = f"did not finish within {timeout_s:g} s" if returncode is None else f"ended with {describe_exit(returncode)}"
    if not any(isinstance(m, Running) for m in messages):
        raise ReferenceFailure(f"the large_index child process {how} before it ran the op:\n" + "\n".join(tail))
    return CheckFailure(
        f"the op {how} on a tensor past 2^31 elements (in a child process of its own, so the run "
        "goes on). An int32 index or size overflows there. Index with int64_t.\n" + "\n".join(tail)
    )


def required_bytes(loaded: LoadedOp, dtype: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Inputs, plus one output per returned tensor, each the size of an input (the elementwise assumption)."""
    import torch

    n = math.prod(next(iter(shapes.values())))
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    outputs = len(loaded.overload._schema.returns)
    return int((len(shapes) + outputs) * n * element * MEMORY_HEADROOM)


@dataclass(frozen=True)
class LargeIndex:
    """The spec's `large_index:` section: shapes past 2^31 elements (an elementwise op is assumed: output element i
    depends on element i of each input). It costs GBs, so it runs only with `enabled: true` or `--large`."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str = "float16"
    enabled: bool = False


def read_large_index(r: Reader, spec: SpecBeforeSections) -> LargeIndex:
    node = r.child("large_index")
    g = Reader(r.path, node, "large_index", ("shapes", "dtype", "enabled"), required=("shapes",))
    dtype = g.get("dtype", one_of(KNOWN_DTYPES), "float16")
    if dtype not in spec.dtypes:
        raise g.fail(
            g.child("dtype") if g.has("dtype") else node,
            "large_index.dtype",
            f"one of the spec's dtypes ({', '.join(spec.dtypes)})",
            repr(dtype),
            "Pick a claimed dtype; the smallest (float16, bfloat16) needs the least memory.",
        )
    shapes_node = g.child("shapes")
    tensors = [i.name for i in spec.inputs if isinstance(i, TensorInput)]
    s = Reader(r.path, shapes_node, "large_index.shapes", tuple(tensors), required=tuple(tensors))
    shapes = tuple((name, s.get(name, read_shape)) for name in tensors)
    if len({shape for _, shape in shapes}) != 1:
        raise s.fail(
            shapes_node,
            "large_index.shapes",
            "the same shape for every tensor input (the check compares "
            "element i of the output with element i of each input)",
            ", ".join(f"{n}: {list(sh)}" for n, sh in shapes),
            "Give every tensor input one shape.",
        )
    numel = math.prod(shapes[0][1])
    if numel <= INT32_INDEX_LIMIT:
        raise s.fail(
            shapes_node,
            "large_index.shapes",
            f"more than 2^31 = {INT32_INDEX_LIMIT} elements",
            f"{numel}",
            "Use e.g. [2147487747] (2^31 + 4099: past the limit, no multiple of a vector width).",
        )
    return LargeIndex(shapes=shapes, dtype=dtype, enabled=g.get("enabled", read_bool, False))


LARGE = CheckOption("large", "Also run large_index (tensors past 2^31 elements: GBs of GPU memory).")

CHECKS = (
    Check(
        "large_index",
        "a tensor past 2^31 elements: int32 indexing (opt-in: --large; GBs of GPU memory; needs `large_index:`)",
        large_index_cases,
        large_index,
        claim="large_index",
        devices=("cuda",),
        opt_in=OptIn(lambda opt_ins: bool(opt_ins.get(LARGE.name)), unless_asked),
        rerun_flags=(LARGE.flag,),
        options=(LARGE,),
        section=SpecSection("large_index", read_large_index),
    ),
)
