"""correctness and grad_lowp: the op's values and gradients against the float64 reference."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks import CheckContext, Outcomes
from opforge.checks.calls import (
    against_reference,
    argument,
    call_reference,
    compared_dtype,
    differentiated,
    inputs_for,
    mutated_values,
    on_device,
    output_names,
    outputs_of,
    paired,
    vector_jacobian_products,
)
from opforge.compare import EXACT, CheckFailure, check_result, tolerance_for
from opforge.loading import Target


def correctness(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Outputs and mutated arguments vs the reference; dtype, shape and device too; unmutated inputs untouched."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    mutated = set(loaded.mutated_arguments)
    before = {name: argument(inputs, loaded, name).clone() for name in inputs.tensor_names if name not in mutated}
    got = outputs_of(loaded, target, inputs)
    tol = tolerance_for(loaded.spec, case.dtype)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    for name, g, e in compared:
        check_result(name, g, e, tol, compared_dtype(case.dtype, name, g, e), case.device)
    for name, original in before.items():
        value = argument(inputs, loaded, name)
        if not value.equal(original) and not (value.isnan() & original.isnan()).any():
            raise CheckFailure(
                f"{target.name} modified input {name} in place, but the schema does not declare it "
                f"mutable. Declare it as Tensor(a!) {name} or stop writing to it."
            )
    return {"correctness": None}


def devices_agree(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """The CUDA result against the CPU result of the same implementation on the same input values.

    Catches a CUDA kernel that computes something else than the CPU one (extension-cpp's add kernel multiplied
    for a year while opcheck passed), independently of how close either is to the reference.
    """
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    on_cpu = on_device(inputs, "cpu")
    got, want = outputs_of(loaded, target, inputs), outputs_of(loaded, target, on_cpu)
    tol = tolerance_for(loaded.spec, case.dtype)
    compared = paired(loaded, got, mutated_values(loaded, inputs), want, mutated_values(loaded, on_cpu))
    for name, g, w in compared:
        check_result(f"{name} (cuda vs cpu)", g, w, tol, w.dtype, case.device, against="the CPU result")
    return {"devices": None}


def determinism(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Two runs on the same inputs are bitwise identical; on CPU the second runs on one thread, so results that
    depend on how work is split across threads (a reduction's order, a racy accumulation) are caught too."""
    import torch

    loaded = ctx.loaded
    first = _outputs_and_mutations(loaded, target, inputs_for(loaded, case, ctx.base_seed))
    threads = torch.get_num_threads()
    try:
        if case.device == "cpu":
            torch.set_num_threads(1)
        second = _outputs_and_mutations(loaded, target, inputs_for(loaded, case, ctx.base_seed))
    finally:
        torch.set_num_threads(threads)
    for (name, a), (_, b) in zip(first, second):
        if isinstance(a, torch.Tensor) and not _bitwise_equal(a, b):
            check_result(f"{name} (second run)", b, a, EXACT, a.dtype, case.device, against="the first run")
            raise CheckFailure(f"{name}: a second run differs in its bits (only in NaN payloads or signed zeros).")
    return {"determinism": None}


def special_values(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """NaN, +-inf, -0.0, the dtype's largest value and subnormals written into every floating input (at the same
    flat positions, so paired inputs meet special values of each other) must come out as the reference's do,
    rounded to the dtype: a kernel that clamps, flushes or swallows NaN fails."""
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed)
    for name in inputs.tensor_names:
        value, ref = argument(inputs, loaded, name), argument(inputs, loaded, name, reference=True)
        if value.is_floating_point():
            specials = _special_values(value.dtype)[: value.numel()]
            value.view(-1)[: len(specials)] = specials.to(value.dtype)
            ref.view(-1)[: len(specials)] = specials.to(value.dtype).to(ref.dtype)
    got = outputs_of(loaded, target, inputs)
    tol = tolerance_for(loaded.spec, case.dtype)
    for name, g, e in against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs)):
        dtype = compared_dtype(case.dtype, name, g, e)
        # What the dtype can hold: 1.1 * max is inf in it.
        check_result(f"{name} (special values)", g, e.to(dtype).to(e.dtype), tol, dtype, case.device)
    return {"special_values": None}


def _special_values(dtype):
    import torch

    info = torch.finfo(dtype)
    subnormal = info.smallest_normal / 4
    return torch.tensor(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            -0.0,
            0.0,
            subnormal,
            -subnormal,
            info.max,
            -info.max,
            info.smallest_normal,
        ],
        dtype=torch.float64,
    )


def _outputs_and_mutations(loaded, target, inputs) -> list:
    named = list(zip(output_names(loaded), outputs_of(loaded, target, inputs)))
    return named + [(f"{n} (mutated)", argument(inputs, loaded, n)) for n in loaded.mutated_arguments]


def _bitwise_equal(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
            width = {4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def grad_lowp(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Gradients computed in the case's dtype vs autograd through the float64 reference (same grad_output)."""
    import torch

    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = differentiated(loaded, inputs)
    grads, ref_grads = vector_jacobian_products(loaded, target, case, ctx.base_seed, inputs, names)
    tol = tolerance_for(loaded.spec, case.dtype, grad=True)
    for name, g, e in zip(names, grads, ref_grads):
        t = argument(inputs, loaded, name)
        if g is None:
            raise CheckFailure(f"grad[{name}]: expected a gradient, got None. Return it from the backward formula.")
        check_result(
            f"grad[{name}]",
            g,
            e if e is not None else torch.zeros_like(g, dtype=torch.float64),
            tol,
            t.dtype,
            case.device,
        )
    return {"grad_lowp": None}
