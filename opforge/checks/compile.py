"""compile: torch.compile(fullgraph=True, dynamic=True) with inductor on every shape, against eager and, where
they differ, against the reference. One compiled function per implementation, dtype and device serves all its tasks
(shapes and layouts) in a run, as a model's call site would; each result says with -v how many graphs it built."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, OneExample, Outcomes, aligned, first_values
from opforge.checks.op_and_reference import (
    RunOutputs,
    agreement,
    call_reference,
    inputs_for,
    mutated_values,
    op_outputs,
    output_baseline,
    outputs_of,
)
from opforge.core.outcomes import CheckFailure, PassDetail, missing_fake_hint, short, unbacked_size_hint

# Dynamo keeps at most `recompile_limit` graphs (8) per function, a limit meant for one call site of a model. Here
# one function serves every task (shape and layout) of an implementation, dtype and device: leaky_swish's float32 tasks
# build 6 + 3 + 3 + 1 graphs on it (its shapes differ in rank or hold a 0, its layouts in strides, so none is reused,
# but without a dynamo reset per task its compile tasks took 10.0 s instead of 11.4, 2-core VM, torch 2.13). Each call
# builds at most one graph (fullgraph=True), so a task raises the limit by its number of calls and never meets it.


@dataclass
class _Compiled:
    """One torch.compile'd function reused by every task of its key, and the graphs built for it so far."""

    function: Callable[..., Any]
    graphs: int = 0


def compile_check(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """The compiled op against eager on the case: equal within the dtype's tolerance, or each as close to the float64
    reference as correctness asks (inductor computes a bfloat16 op's math in float32, closer to the reference than
    eager's bfloat16 steps)."""
    from torch._dynamo.utils import counters

    compiled = _compiled_for(ctx, implementation, case)
    loaded = ctx.loaded
    graphs_before = counters["stats"]["unique_graphs"]
    with current_code_only(), _room_for(compiled.graphs + 1):
        try:
            # Each side gets inputs of its own (the same values): an op that writes its arguments must be compared on
            # what each call wrote, not on tensors the other call wrote again.
            eager_inputs, compiled_inputs = (inputs_for(loaded, case, ctx.base_seed) for _ in range(2))
            baseline = output_baseline(loaded, eager_inputs, case.dtype)
            eager = outputs_of(loaded, implementation, eager_inputs)
            try:
                returned = compiled.function(*compiled_inputs.args, **compiled_inputs.kwargs)
            except Exception as exc:
                raise CheckFailure(
                    f"torch.compile(fullgraph=True) of {implementation.name} failed: {short(exc)}"
                    + missing_fake_hint(exc)
                    + unbacked_size_hint(exc)
                ) from exc
            agreement(
                loaded,
                case.dtype,
                RunOutputs(
                    "compiled", case.device, op_outputs(loaded, returned), mutated_values(loaded, compiled_inputs)
                ),
                RunOutputs("eager", case.device, eager, mutated_values(loaded, eager_inputs)),
                lambda: call_reference(loaded, eager_inputs),
                baseline,
            )
        finally:
            built = counters["stats"]["unique_graphs"] - graphs_before
            compiled.graphs += built
    return {"compile": PassDetail(f"{_count(built, 'graph')} built; {_count(compiled.graphs, 'graph')} in all")}


def _compiled_for(ctx: CheckContext, implementation: Implementation, case: Case) -> _Compiled:
    import torch

    key = ("compile", implementation.name, case.dtype, case.device)
    if key not in ctx.shared:
        function = torch.compile(_own_caller(implementation), fullgraph=True, dynamic=True, backend="inductor")
        ctx.shared[key] = _Compiled(function)
    compiled: _Compiled = ctx.shared[key]
    return compiled


def _own_caller(implementation: Implementation) -> Callable[..., Any]:
    """A function calling the implementation, with a code object of its own: dynamo keeps graphs and counts its limit
    per code object, so each key's function neither reuses another's graphs nor uses up its limit."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return implementation.fn(*args, **kwargs)

    code = call.__code__.replace(co_name=f"compiled_{implementation.name}")
    return types.FunctionType(code, call.__globals__, code.co_name, call.__defaults__, call.__closure__)


@contextmanager
def _room_for(graphs: int) -> Iterator[None]:
    import torch._dynamo.config as dynamo_config

    limit = max(graphs, dynamo_config.recompile_limit)
    with dynamo_config.patch(
        recompile_limit=limit, accumulated_recompile_limit=max(limit, dynamo_config.accumulated_recompile_limit)
    ):
        yield


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@contextmanager
def current_code_only() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache are keyed without the Python code of an op's fake kernel:
    after a fake is fixed, a second run would load the graph compiled with the broken one (seen: the compile result
    still failing until the cache was cleared). Both are off while opforge compiles; the caches of generated
    kernels, keyed by their code, stay on."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


# What compile adds to a fuzz example's time limit (asked for only: compiling takes seconds): a child's first example
# of a dtype and device compiles the op (inductor, dynamic shapes), and an example whose sizes or strides break the
# compiled graph's guards compiles again. `opforge check`'s compile rows run under its 300 s row limit; in fuzz one
# compile took up to that.
COMPILE_TIME_LIMIT = 300.0


def compile_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Every shape of every dtype/device/layout, first argument values: one compiled function per implementation,
    dtype and device sees them all (dynamic shapes), and a failure names its shape (a `case:` glob can xfail it)."""
    return first_values(loaded, implementation, aligned(cases))


CHECKS = (
    Check(
        "compile",
        "torch.compile(fullgraph=True, dynamic=True) with inductor over every shape, against eager and the reference",
        compile_cases,
        compile_check,
        shares_work=lambda case: (case.dtype, case.device),
        one_example=OneExample(asked_only=True, extra_seconds=COMPILE_TIME_LIMIT),
    ),
)
