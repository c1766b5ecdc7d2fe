"""stream (CUDA): the op must run on the caller's current stream, in stream order, and be capturable in a CUDA graph.

Two runs per case:

1. Side streams, as a careful caller uses them: a producer stream sleeps (torch.cuda._sleep, ~50 ms), then writes
   the inputs, which until then hold a sentinel (NaN); the consumer stream waits on the producer
   (`wait_stream`) and runs the op; its outputs are copied on the consumer. A kernel launched on the current stream
   runs after the write. A kernel launched on the legacy default stream (`<<<grid, block>>>` with no stream) does
   not wait: PyTorch's pool streams are created with cudaStreamNonBlocking, which the legacy stream's implicit
   synchronization skips, so it reads the sentinel while the producer still sleeps (pytorch/extension-cpp shipped
   that bug until July 2025, pytorch#157363).
2. CUDA-graph capture of the op, then replay on new input values. A legacy-stream launch during capture fails
   (cudaErrorStreamCaptureImplicit); a kernel that is not captured leaves the replayed outputs stale; a host
   synchronization inside the op fails the capture. A spec that claims `cuda_graphs: false` skips this part
   (with a note on the result).
3. For a differentiable op, CUDA-graph capture of its backward (autograd.grad through a forward run on the capture
   stream), then replay on a new grad_output: training loops capture the backward too (torch.compile's
   reduce-overhead mode, torch.cuda.make_graphed_callables), and a backward's host synchronization or
   legacy-stream launch breaks them as a forward's would. Skipped with the graph part.

The first two are compared with the float64 reference; the replayed backward with the same backward run eagerly
(within the spec's gradient tolerance: the capture, not the numerics, is under test).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.compare import Baseline, check_result, map_tensors, tolerance_for
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes, first_values
from opforge.checks.op_and_reference import (
    against_reference,
    argument,
    call_reference,
    compare_with_reference,
    differentiable_outputs,
    differentiates,
    inputs_for,
    mutated_values,
    op_gradients,
    output_baseline,
    outputs_of,
    seeded_grad_outputs,
    with_arguments,
)
from opforge.core.cuda_spin import spin
from opforge.core.outcomes import CheckFailure, PassNote, short

if TYPE_CHECKING:
    import torch

# How long the producer stream sleeps before it writes the inputs: long enough that a kernel which does not wait
# for it has certainly run first (a kernel launch is ~10 us; the ops under test run in well under a millisecond at
# the spec's shapes), short enough that the check costs little per case. A run whose producer finished before the
# op's launches is repeated with the next, longer wait (a loaded host; _side_stream_run).
PRODUCER_SLEEPS_S = (0.05, 0.2, 0.8)


def stream_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Contiguous, non-empty, first argument values: stream order does not depend on layout or values, and
    an empty tensor launches no kernel."""
    return [
        c
        for c in first_values(loaded, implementation, cases)
        if c.layout == "contiguous" and all(math.prod(s) for _, s in c.shapes)
    ]


def stream(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    ordered = _on_side_streams(ctx, implementation, case)
    # The capture runs even when no side-stream run could be judged: an op that synchronizes with the host inside
    # its call (which a capture refuses) also finishes the producer before the look after its launches.
    if ctx.loaded.spec.cuda_graphs:
        _in_cuda_graph(ctx, implementation, case)
        if differentiates(ctx.loaded, case):
            _backward_in_cuda_graph(ctx, implementation, case)
    if not ordered:
        raise RuntimeError(
            f"stream: the producer stream had written the inputs before the op was launched, {len(PRODUCER_SLEEPS_S)} "
            f"times (waits of up to {PRODUCER_SLEEPS_S[-1]} s): expected the op's launches inside the wait, got a host "
            "too busy to make them in time, so stream order was not tested. Rerun with fewer parallel jobs (-j)."
        )
    return {"stream": None if ctx.loaded.spec.cuda_graphs else PassNote(GRAPHS_SKIPPED)}


# The note a spec claiming `cuda_graphs: false` gets on its stream results.
GRAPHS_SKIPPED = (
    "CUDA-graph capture not checked: the spec claims claims.cuda_graphs: false (the op synchronizes with the host, so "
    "code that captures CUDA graphs cannot call it)"
)


def _on_side_streams(ctx: CheckContext, implementation: Implementation, case: Case) -> bool:
    """Whether a side-stream run could be judged (and then was: a wrong one raises CheckFailure)."""
    loaded = ctx.loaded
    inputs, baseline, expected = _with_expected(ctx, case, ctx.base_seed)
    ready = {name: argument(inputs, loaded, name) for name in inputs.tensor_names}
    for sleep in PRODUCER_SLEEPS_S:
        run = _side_stream_run(loaded, implementation, inputs, ready, sleep)
        if run is not None:
            break
    else:
        return False
    seen, seen_mutated = run
    _compare(
        loaded,
        case,
        seen,
        seen_mutated,
        expected,
        baseline,
        "on a side stream, inputs written by another stream just before it ran",
        lambda: STREAM_ORDER_HINT if _right_on_current_stream(ctx, implementation, case) else WRONG_ON_CURRENT_STREAM,
    )
    return True


def _side_stream_run(
    loaded: LoadedOp, implementation: Implementation, inputs: CaseInputs, ready: dict[str, Any], sleep: float
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The op's outputs and mutated arguments, run on a consumer stream whose inputs a producer stream writes after
    `sleep` seconds. None when the producer had finished before the op was launched (the host was descheduled for
    longer than the wait: seen on an H200 under `pytest -n 8`): the op then read written inputs whatever stream it
    used, and the run proves nothing. An op that may synchronize with the host (claims.cuda_graphs: false) waits
    for the producer inside its call, so for it the producer is looked at before the call; for the others once the
    call returned and before its kernels are waited for (the wait idles every stream), which covers every launch
    the call made."""
    import torch

    pending = {name: _sentinel_like(t) for name, t in ready.items()}
    torch.cuda.synchronize()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(producer):
        spin(sleep)
        for name, t in pending.items():
            t.copy_(ready[name])
    consumer.wait_stream(producer)
    with torch.cuda.stream(consumer):
        args, kwargs = with_arguments(loaded, inputs, pending)
        busy_at = [not producer.query()]
        # No host synchronization inside the call: busy once it returned means busy at every launch.
        after_launch = (lambda: busy_at.append(not producer.query())) if loaded.spec.cuda_graphs else None
        got = outputs_of(loaded, implementation, _replaced(inputs, args, kwargs), after_launch)
        producer_busy = busy_at[-1]
        # Read on the consumer, as the caller's next op would. Every tensor stays referenced until the synchronize
        # below, so none needs record_stream.
        seen = tuple(map_tensors(lambda o: o.clone(), o) for o in got)
        seen_mutated = {name: pending[name].clone() for name in loaded.mutated_arguments}
    torch.cuda.synchronize()
    return (seen, seen_mutated) if producer_busy else None


STREAM_ORDER_HINT = (
    "The op does not run in the caller's stream order: launch every kernel on at::cuda::getCurrentCUDAStream() (a "
    "<<<grid, block>>> launch without a stream uses the legacy default stream)."
)
# A side-stream run that fails because the op is wrong wherever it runs is not a stream-order bug.
WRONG_ON_CURRENT_STREAM = (
    "The op is wrong on the current stream too, with its inputs ready: this is not (only) a stream bug. Fix what the "
    "correctness check reports on CUDA first."
)


def _right_on_current_stream(ctx: CheckContext, implementation: Implementation, case: Case) -> bool:
    """Whether the case's outputs match the reference when the op runs plainly on the current stream."""
    import torch

    loaded = ctx.loaded
    inputs, baseline, expected = _with_expected(ctx, case, ctx.base_seed)
    got = outputs_of(loaded, implementation, inputs)
    torch.cuda.synchronize()
    mismatch = _mismatch(loaded, case, got, mutated_values(loaded, inputs), expected, baseline, "on the current stream")
    return mismatch is None


def _with_expected(ctx: CheckContext, case: Case, seed: int) -> tuple[CaseInputs, Baseline, tuple[Any, ...]]:
    """The case's inputs drawn with `seed`, the baseline its outputs are judged against, and the reference's result."""
    inputs = inputs_for(ctx.loaded, case, seed)
    return inputs, output_baseline(ctx.loaded, inputs, case.dtype), call_reference(ctx.loaded, inputs)


def _in_cuda_graph(ctx: CheckContext, implementation: Implementation, case: Case) -> None:
    """Warm up, capture with the case's inputs, then replay on other values (those of base seed + 1)."""
    import torch

    loaded = ctx.loaded
    captured_inputs = inputs_for(loaded, case, ctx.base_seed)
    replay_inputs, baseline, expected = _with_expected(ctx, case, ctx.base_seed + 1)
    fresh = {name: argument(replay_inputs, loaded, name).clone() for name in replay_inputs.tensor_names}
    # Lazy initialization (handles, workspaces) must not happen during capture: one call first, on a side stream
    # as torch.cuda.graphs asks.
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        outputs_of(loaded, implementation, captured_inputs)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    got = _captured(
        graph,
        lambda: outputs_of(loaded, implementation, captured_inputs),
        implementation.name,
        "A kernel launched on the legacy default stream (<<<grid, block>>> without a stream) cannot be captured; "
        "launch on at::cuda::getCurrentCUDAStream(). Host synchronization (.item(), .cpu(), a data-dependent size) "
        "cannot be captured either, and code that captures CUDA graphs (torch.compile's reduce-overhead mode, vLLM, "
        "training loops) cannot call the op: keep it out of the op, or, where it must stay, declare "
        "`claims: {cuda_graphs: false}` in the spec.",
    )
    for name, value in fresh.items():
        argument(captured_inputs, loaded, name).copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    _compare(
        loaded,
        case,
        got,
        mutated_values(loaded, captured_inputs),
        expected,
        baseline,
        "CUDA-graph replay on new inputs",
        lambda: "A kernel that is not on the current stream is not captured, and its outputs are stale on replay.",
    )


def _captured(
    graph: torch.cuda.CUDAGraph,
    call: Callable[[], Any],
    what: str,
    advice: str,
    stream: torch.cuda.Stream | None = None,
) -> Any:
    """call()'s result, captured into `graph` on `stream` (None: a side stream of torch's); a capture that fails is
    the op's failure, with `advice`."""
    import torch

    try:
        with torch.cuda.graph(graph, stream=stream):
            return call()
    except Exception as exc:
        _clear_stale_launch_error()
        message = exc.message if isinstance(exc, CheckFailure) else short(exc)
        raise CheckFailure(f"CUDA-graph capture of {what} failed: {message}. {advice}") from exc


def _backward_in_cuda_graph(ctx: CheckContext, implementation: Implementation, case: Case) -> None:
    """Run the forward on a side stream (the backward's kernels then go to it: autograd runs each backward op on its
    forward's stream), capture autograd.grad on that stream, replay it on a new grad_output, and compare with the
    same backward run eagerly."""
    import torch

    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = [n for n in inputs.tensor_names if argument(inputs, loaded, n).requires_grad]
    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        outputs = differentiable_outputs(outputs_of(loaded, implementation, inputs))
    if not names or not outputs:
        return
    wrt = [argument(inputs, loaded, n) for n in names]
    captured_grads = seeded_grad_outputs(outputs, case, ctx.base_seed)
    replay_grads = seeded_grad_outputs(outputs, case, ctx.base_seed + 1)

    def backward(grad_outputs: list[Any]) -> tuple[Any, ...]:
        return op_gradients(implementation, outputs, wrt, grad_outputs, retain_graph=True)

    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        expected = backward(replay_grads)
        backward(captured_grads)  # warm-up: lazy initialization stays out of the capture
    graph = torch.cuda.CUDAGraph()
    got = _captured(
        graph,
        lambda: backward(captured_grads),
        f"{implementation.name}'s backward",
        "Training loops capture the backward too (torch.compile's reduce-overhead mode, "
        "torch.cuda.make_graphed_callables): keep host synchronization (.item(), .cpu(), a data-dependent size) out "
        "of the backward formula and its kernels, and launch them on at::cuda::getCurrentCUDAStream(); where it must "
        "stay, claim `claims: {cuda_graphs: false}` in the spec.",
        stream=capture_stream,
    )
    for buffer, values in zip(captured_grads, replay_grads):
        buffer.copy_(values)
    graph.replay()
    torch.cuda.synchronize()
    tolerance = tolerance_for(loaded.spec, case.dtype, grad=True)
    for name, g, e in zip(names, got, expected):
        if e is not None:
            check_result(
                f"grad[{name}] (backward replayed from a CUDA graph on a new grad_output)",
                g,
                e,
                tolerance,
                e.dtype,
                case.device,
                against="the same backward run eagerly",
            )


def _compare(
    loaded: LoadedOp,
    case: Case,
    got: tuple[Any, ...],
    mutated_now: dict[str, Any],
    reference_result: tuple[Any, ...],
    baseline: Baseline,
    how: str,
    hint: Callable[[], str],
) -> None:
    """Fails with the worst mismatch and hint() (asked only on a failure: it may run the op again)."""
    failure = _mismatch(loaded, case, got, mutated_now, reference_result, baseline, how)
    if failure is not None:
        raise CheckFailure(f"{failure.message} {hint()}", failure.mismatch)


def _mismatch(
    loaded: LoadedOp,
    case: Case,
    got: tuple[Any, ...],
    mutated_now: dict[str, Any],
    reference_result: tuple[Any, ...],
    baseline: Baseline,
    how: str,
) -> CheckFailure | None:
    compared = against_reference(loaded, got, mutated_now, reference_result)
    try:
        compare_with_reference(loaded, case.dtype, case.device, compared, baseline, label=f" ({how})")
    except CheckFailure as failure:
        return failure
    return None


def _sentinel_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor with t's layout holding a value the op would never turn into the reference's: NaN, or the dtype's
    largest value for integers."""
    import torch

    fill = (
        float("nan")
        if t.is_floating_point() or t.is_complex()
        else (True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
    )
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).fill_(fill)


def _replaced(inputs: CaseInputs, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CaseInputs:
    from dataclasses import replace

    return replace(inputs, args=args, kwargs=kwargs)


def _clear_stale_launch_error() -> None:
    """A failed launch during capture leaves its error in CUDA's per-thread last-error slot when the op did not check
    it (no C10_CUDA_KERNEL_LAUNCH_CHECK); the next ATen kernel's launch check would then raise it in an unrelated
    check. Launching a kernel and checking it consumes the stale error."""
    import torch

    for _ in range(2):
        try:
            torch.empty(1, device="cuda").fill_(0)
            torch.cuda.synchronize()
            return
        except RuntimeError:
            continue


CHECKS = (
    Check(
        "stream",
        "the caller's stream order (inputs written on a side stream) and CUDA-graph capture",
        stream_cases,
        stream,
        devices=("cuda",),
    ),
)
