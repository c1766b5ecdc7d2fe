"""compile: torch.compile(fullgraph=True, dynamic=True) with inductor over every shape, against eager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opforge.cases import Case, at_point, case_applies, crossed_values
from opforge.checks.base import Check, CheckContext, Outcomes, aligned, first_values
from opforge.checks.calls import inputs_for, mutated_values, outputs_of, paired
from opforge.compare import as_tuple, check_result, tolerance_for
from opforge.loading import Implementation, LoadedOp
from opforge.outcomes import CheckFailure, missing_fake_hint, short, unbacked_size_hint


def compile_check(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    import torch

    torch._dynamo.reset()  # a fresh cache, so earlier cases' graphs neither help nor hit the recompile limit

    def call(*args: Any, **kwargs: Any) -> Any:
        return implementation.fn(*args, **kwargs)

    compiled = torch.compile(call, fullgraph=True, dynamic=True, backend="inductor")
    loaded = ctx.loaded
    tol = tolerance_for(loaded.spec, case.dtype)
    with current_code_only():
        for shaped in _shaped_cases(ctx, case):
            # Each side gets inputs of its own (the same values): an op that writes its arguments must be compared
            # on what each call wrote, not on tensors the other call wrote again.
            eager_inputs, compiled_inputs = (inputs_for(loaded, shaped, ctx.base_seed) for _ in range(2))
            eager = outputs_of(loaded, implementation, eager_inputs)
            try:
                returned = compiled(*compiled_inputs.args, **compiled_inputs.kwargs)
            except Exception as exc:
                raise CheckFailure(
                    f"torch.compile(fullgraph=True) of {implementation.name} failed on {shaped.id}: {short(exc)}"
                    + missing_fake_hint(exc)
                    + unbacked_size_hint(exc)
                ) from exc
            got = as_tuple(returned) if loaded.overload._schema.returns else ()
            compared = paired(
                loaded, got, mutated_values(loaded, compiled_inputs), eager, mutated_values(loaded, eager_inputs)
            )
            for name, g, e in compared:
                check_result(f"{name} (compiled, {shaped.id})", g, e, tol, e.dtype, case.device, against="eager")
    return {"compile": None}


def _shaped_cases(ctx: CheckContext, case: Case) -> list[Case]:
    """The merged case once per shape pairing the layout applies to: one compiled function sees every shape."""
    spec = ctx.loaded.spec
    points = (at_point(spec, case, shape_index) for shape_index in range(spec.shape_count))
    return [point for point in points if case_applies(spec, case.layout, point.shapes)]


@contextmanager
def current_code_only() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache are keyed without the Python code of an op's fake kernel:
    after a fake is fixed, a second run would load the graph compiled with the broken one (seen: the compile row
    still failing until the cache was cleared). Both are off while opforge compiles; the caches of generated
    kernels, keyed by their code, stay on."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


def all_shapes_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One case per dtype/device/layout that runs every shape through one compiled function (dynamic shapes)."""
    seen: dict[str, Case] = {}
    for case in first_values(loaded, implementation, aligned(cases)):
        merged = replace(case, shapes=(), shape_index=-1, values=crossed_values(loaded.spec, case))
        seen.setdefault(merged.id, merged)
    return list(seen.values())


CHECKS = (
    Check(
        "compile",
        "torch.compile(fullgraph=True, dynamic=True) with inductor over every shape, against eager",
        all_shapes_cases,
        compile_check,
    ),
)
