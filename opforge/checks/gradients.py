"""gradcheck and gradgradcheck in float64, with the worst gradient mismatch against the reference on failure."""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks import CheckContext, Outcomes
from opforge.checks.calls import argument, call_reference, inputs_for, short, split_reference
from opforge.compare import CheckFailure, ReferenceFailure, as_tuple, tolerance_for, worst_mismatch
from opforge.loading import Target

# Above this many elements across the differentiated inputs, gradcheck's exact mode builds an n x n Jacobian one
# perturbation at a time; fast mode checks random projections of it instead (torch's own recommendation).
EXACT_JACOBIAN_MAX_ELEMENTS = 512


def gradcheck(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    return {"gradcheck": _run(ctx, target, case, torch.autograd.gradcheck)}


def gradgradcheck(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    import torch

    return {"gradgradcheck": _run(ctx, target, case, torch.autograd.gradgradcheck)}


def _run(ctx: CheckContext, target: Target, case: Case, checker) -> CheckFailure | None:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = [n for n in inputs.tensor_names if argument(inputs, loaded, n).requires_grad]
    if not names:
        raise ReferenceFailure("no tensor input has requires_grad: true in the spec, so there is no gradient to check")
    wrt = tuple(argument(inputs, loaded, n) for n in names)
    if sum(t.numel() for t in wrt) == 0:
        return None  # nothing to differentiate; the empty case is covered by correctness and opcheck

    def fn(*tensors):
        args, kwargs = _substitute(loaded, inputs, dict(zip(names, tensors)))
        return target.fn(*args, **kwargs)

    fast = sum(t.numel() for t in wrt) > EXACT_JACOBIAN_MAX_ELEMENTS
    try:
        checker(fn, wrt, fast_mode=fast, raise_exception=True)
    except Exception as exc:
        return CheckFailure(f"{checker.__name__} failed: {short(exc)}", _gradient_mismatch(ctx, target, case, names))
    return None


def _substitute(loaded, inputs, replacements):
    arg_names = [a.name for a in loaded.arguments]
    args = tuple(replacements.get(arg_names[i], v) for i, v in enumerate(inputs.args))
    kwargs = {k: replacements.get(k, v) for k, v in inputs.kwargs.items()}
    return args, kwargs


def _gradient_mismatch(ctx, target, case, names):
    """Where the op's vector-Jacobian product departs most from the reference's, to show next to the verdict."""
    import torch

    loaded = ctx.loaded
    try:
        inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
        outs = [o for o in as_tuple(target.fn(*inputs.args, **inputs.kwargs)) if o.requires_grad]
        ref_outs, _ = split_reference(loaded, call_reference(loaded, inputs))
        generator = torch.Generator().manual_seed(case.seed(ctx.base_seed) + 1)
        grad_outs = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outs]
        got = torch.autograd.grad(outs, [argument(inputs, loaded, n) for n in names], grad_outs, allow_unused=True)
        expected = torch.autograd.grad(list(ref_outs[: len(outs)]),
                                       [argument(inputs, loaded, n, reference=True) for n in names],
                                       [g.cpu() for g in grad_outs], allow_unused=True)
    except Exception:
        return None  # the verdict stands on its own; this is only a pointer to where
    tol = tolerance_for(loaded.spec, "float64", grad=True)
    for name, g, e in zip(names, got, expected):
        if g is not None and e is not None:
            mismatch = worst_mismatch(f"grad[{name}]", g, e, tol)
            if mismatch:
                return mismatch
    return None
