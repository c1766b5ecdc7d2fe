"""gradcheck and gradgradcheck: gradients against finite differences, in float64, or for an op that does not claim
float64 in its most precise claimed dtype with a step and tolerances suited to it; the worst gradient mismatch
shown on failure is the worst entry of the Jacobian gradcheck names, or where that is too large to compute, the
worst element of the vector-Jacobian product against the reference's."""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.cases.compare import as_tuple, tolerance_for, worst_mismatch
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes, aligned
from opforge.checks.op_and_reference import (
    argument,
    differentiable_outputs,
    differentiated,
    inputs_for,
    named_leaves,
    op_outputs,
    seeded_grad_outputs,
    vector_jacobian_products,
    with_arguments,
)
from opforge.core.outcomes import CheckFailure, short
from opforge.core.results import Mismatch
from opforge.spec.model import Tolerance

if TYPE_CHECKING:
    import torch

# Above this many elements across the differentiated inputs, gradcheck's exact mode builds an n x n Jacobian one
# perturbation at a time; fast mode checks random projections of it instead (torch's own recommendation).
EXACT_JACOBIAN_MAX_ELEMENTS = 512

# Showing where a Jacobian is wrong means computing it: two calls of the op per input element (central differences)
# and one backward per output element. Past this many entries (output elements x input elements; 128 x 128 for an
# elementwise op) that costs more than the check it explains, and the vector-Jacobian product points at the worst
# element instead.
JACOBIAN_MAX_ENTRIES = 2**14

# How torch.autograd.gradcheck names the first (output, input) pair whose Jacobians differ, before printing both
# matrices whole.
JACOBIAN_MISMATCH = re.compile(r"Jacobian mismatch for output (\d+) with respect to input (\d+)")


@dataclass(frozen=True)
class FiniteDifferences:
    """gradcheck's step and tolerances in one dtype."""

    eps: float
    atol: float
    rtol: float


# The finite-difference settings per dtype, most precise first: an op that does not claim float64 (a float32-only
# kernel rejects it) is checked in the first dtype here it claims. A central difference in a dtype with unit roundoff
# u has error ~ u|f|/eps (rounding) + eps^2|f3|/6 (truncation, f3 the third derivative), and x + eps is itself rounded
# to u|x|. float64: torch.autograd.gradcheck's own defaults. float32 (u = 6e-8): eps 1e-3 keeps the rounding term
# near 6e-5|f| and the truncation near 2e-7|f3|, under atol 1e-3 / rtol 1e-2 for values and derivatives of order
# 1-10. float16 (u = 4.9e-4) and bfloat16 (u = 3.9e-3): steps of 1e-1 and 2.5e-1 keep x + eps within 2% of the
# intended step, and the tolerances (5e-2, 1e-1) still catch the usual gradient bugs (a missing factor or term, a
# wrong sign: errors of order 1). Coarse, but the alternative is no gradient check at all for such an op.
FINITE_DIFFERENCES = {
    "float64": FiniteDifferences(eps=1e-6, atol=1e-5, rtol=1e-3),
    "float32": FiniteDifferences(eps=1e-3, atol=1e-3, rtol=1e-2),
    "float16": FiniteDifferences(eps=1e-1, atol=5e-2, rtol=5e-2),
    "bfloat16": FiniteDifferences(eps=2.5e-1, atol=1e-1, rtol=1e-1),
}


def gradcheck(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    return {"gradcheck": _run(ctx, implementation, case, second_order=False)}


def gradgradcheck(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    return {"gradgradcheck": _run(ctx, implementation, case, second_order=True)}


@dataclass(frozen=True)
class Differentiable:
    """A function as torch.autograd.gradcheck sees it, with names for what its failures number: input j is the j-th
    of `inputs` (each requires grad), output i the i-th returned value that requires grad."""

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    input_names: tuple[str, ...]
    # One per returned value, in the order returned, whether it requires grad or not.
    output_names: tuple[str, ...]


def _run(ctx: CheckContext, implementation: Implementation, case: Case, second_order: bool) -> CheckFailure | None:
    loaded = ctx.loaded
    inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
    names = differentiated(loaded, inputs)
    if sum(argument(inputs, loaded, n).numel() for n in names) == 0:
        return None  # nothing to differentiate; the empty case is covered by correctness and opcheck
    try:
        op = _op_function(loaded, implementation, inputs, names)
        checker, checked, check = _checker(ctx, implementation, inputs, op, case, second_order)
    except Exception as exc:  # the op's own failure on this case, as torch's check would meet it
        name = "gradgradcheck" if second_order else "gradcheck"
        return CheckFailure(f"{name} failed: the op raised {short(exc)}", None)
    steps = FINITE_DIFFERENCES[case.dtype]
    fast = sum(t.numel() for t in op.inputs) > EXACT_JACOBIAN_MAX_ELEMENTS
    failure, caught = _verdict(partial(check, eps=steps.eps, atol=steps.atol, rtol=steps.rtol, fast_mode=fast))
    if failure is None:
        return None
    hint = NO_AUTOGRAD_HINT if any(NO_AUTOGRAD_WARNING in str(w.message) for w in caught) else ""
    summary = JACOBIAN_MISMATCH.search(str(failure))
    if summary is None:
        return CheckFailure(
            f"{checker} failed: {short(failure)}{hint}", _gradient_mismatch(ctx, implementation, case, names)
        )
    # torch's first line names the pair; the lines after it are both Jacobians whole, more than a terminal shows.
    verdict = f"{checker} failed: {str(failure).splitlines()[0].rstrip(',')}"
    detail, located = _jacobian_detail(checked, summary, steps)
    pointer = None if located else _gradient_mismatch(ctx, implementation, case, names)
    return CheckFailure(verdict + detail + hint, pointer)


def _checker(
    ctx: CheckContext,
    implementation: Implementation,
    inputs: CaseInputs,
    op: Differentiable,
    case: Case,
    second_order: bool,
) -> tuple[str, Differentiable, Callable[..., Any]]:
    """The check's name, the function whose Jacobians it compares, and the torch check to call with the settings."""
    import torch

    if not second_order:
        return "gradcheck", op, partial(torch.autograd.gradcheck, op.fn, op.inputs)
    checked = _first_derivatives(op, op.fn(*op.inputs), case, ctx.base_seed)
    grad_outputs = checked.inputs[len(op.inputs) :]
    return "gradgradcheck", checked, partial(torch.autograd.gradgradcheck, op.fn, op.inputs, grad_outputs)


def _verdict(check: Callable[..., Any]) -> tuple[Exception | None, list[warnings.WarningMessage]]:
    """What the check raised (None: it passed) and the warnings it gave, which go on to the result's own record."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # gradcheck warns about every input that is not float64: here that is the dtype chosen on purpose.
        warnings.filterwarnings("ignore", message=".*double precision floating point.*")
        try:
            check(raise_exception=True)
            failure = None
        except Exception as exc:
            failure = exc
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return failure, caught


def _op_function(
    loaded: LoadedOp, implementation: Implementation, inputs: CaseInputs, names: list[str]
) -> Differentiable:
    """The op as a function of its differentiated inputs, the others held at the case's values, returning its tensors
    as a flat tuple (torch's gradcheck takes a tensor or a tuple of them: a `Tensor[]` output's tensors each, no None
    or number)."""
    import torch

    def named(*tensors: torch.Tensor) -> list[tuple[str, Any]]:
        args, kwargs = with_arguments(loaded, inputs, dict(zip(names, tensors)))
        returned = op_outputs(loaded, implementation.fn(*args, **kwargs))
        return [(n, v) for n, v in named_leaves(loaded, returned, {}) if isinstance(v, torch.Tensor)]

    def fn(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(v for _, v in named(*tensors))

    wrt = tuple(argument(inputs, loaded, n) for n in names)
    return Differentiable(fn, wrt, tuple(names), tuple(n for n, _ in named(*wrt)))


def _first_derivatives(op: Differentiable, returned: tuple[Any, ...], case: Case, base_seed: int) -> Differentiable:
    """The function torch.autograd.gradgradcheck hands to gradcheck: the op's gradients as a function of the op's
    inputs and of one grad_output per differentiable output (seeded by the case, where gradgradcheck's own are not:
    a rerun sees the same function). It keeps a None where nothing reaches an input (gradgradcheck drops it): a None
    is no output that requires grad, so the numbering is the same and each position keeps its input's name."""
    import torch

    live = _differentiable_positions(returned)
    grad_outputs = seeded_grad_outputs([returned[k] for k in live], case, base_seed)
    count = len(op.inputs)

    def fn(*tensors: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        outputs = differentiable_outputs(as_tuple(op.fn(*tensors[:count])))
        return torch.autograd.grad(outputs, tensors[:count], tensors[count:], create_graph=True, allow_unused=True)

    return Differentiable(
        fn,
        op.inputs + tuple(g.requires_grad_() for g in grad_outputs),
        op.input_names + tuple(f"grad_{op.output_names[k]}" for k in live),
        tuple(f"grad[{name}]" for name in op.input_names),
    )


def _differentiable_positions(returned: tuple[Any, ...]) -> list[int]:
    """Which returned values gradcheck numbers as outputs: those that require grad."""
    import torch

    return [k for k, value in enumerate(returned) if isinstance(value, torch.Tensor) and value.requires_grad]


@dataclass(frozen=True)
class JacobianPair:
    """The output and the input of the Jacobian gradcheck named, by their places among the function's returned
    values and inputs."""

    output_name: str
    output_position: int
    output_shape: tuple[int, ...]
    input_name: str
    input_index: int
    input_shape: tuple[int, ...]

    @property
    def entries(self) -> int:
        return math.prod(self.output_shape) * math.prod(self.input_shape)


def _jacobian_detail(checked: Differentiable, summary: re.Match[str], steps: FiniteDifferences) -> tuple[str, bool]:
    """What to add to gradcheck's verdict about the Jacobian it names, and whether that locates the wrong entry (its
    worst one) or not (the Jacobian is too large to compute here, or could not be computed: the verdict then stands
    on its own, and the vector-Jacobian product points at where)."""
    try:
        pair = _jacobian_pair(checked, int(summary.group(1)), int(summary.group(2)))
        if pair.entries > JACOBIAN_MAX_ENTRIES:
            return _too_large(pair), False
        worst = _worst_entry(checked, pair, steps)
    except Exception:
        return "", False
    return (_describe_entry(pair, worst, steps), True) if worst is not None else ("", False)


def _jacobian_pair(checked: Differentiable, output_index: int, input_index: int) -> JacobianPair:
    returned = as_tuple(checked.fn(*checked.inputs))
    position = _differentiable_positions(returned)[output_index]
    return JacobianPair(
        checked.output_names[position],
        position,
        tuple(returned[position].shape),
        checked.input_names[input_index],
        input_index,
        tuple(checked.inputs[input_index].shape),
    )


def _worst_entry(checked: Differentiable, pair: JacobianPair, steps: FiniteDifferences) -> Mismatch | None:
    """The Jacobian entry furthest beyond gradcheck's own test, |analytical - numerical| <= atol + rtol *
    |numerical|, with its index (output element, input element) in the flattened Jacobian."""
    numerical = _numerical_jacobian(checked, pair, steps.eps)
    analytical = _analytical_jacobian(checked, pair)
    return worst_mismatch("Jacobian", analytical, numerical, Tolerance(atol=steps.atol, rtol=steps.rtol))


def _numerical_jacobian(checked: Differentiable, pair: JacobianPair, eps: float) -> torch.Tensor:
    """Central differences as gradcheck takes them, (f(x + eps) - f(x - eps)) / 2 eps, one input element at a time.
    The input is perturbed in place so that the op sees its strides and storage offset unchanged."""
    import torch

    values = checked.inputs[pair.input_index].detach()

    def output() -> torch.Tensor:
        # A copy: an op may return a view of its input, which the next perturbation would change.
        returned: torch.Tensor = as_tuple(checked.fn(*checked.inputs))[pair.output_position]
        return returned.detach().to(torch.float64, copy=True).reshape(-1)

    columns = []
    for index in itertools.product(*map(range, pair.input_shape)):
        original = values[index].item()
        values[index] = original + eps
        after = output()
        values[index] = original - eps
        before = output()
        values[index] = original
        columns.append((after - before) / (2 * eps))
    return torch.stack(columns, dim=1)


def _analytical_jacobian(checked: Differentiable, pair: JacobianPair) -> torch.Tensor:
    """The Jacobian through the function's backward, one output element at a time."""
    import torch

    def of_input(value: torch.Tensor) -> Any:
        inputs = list(checked.inputs)
        inputs[pair.input_index] = value
        return as_tuple(checked.fn(*inputs))[pair.output_position]

    jacobian: torch.Tensor = torch.autograd.functional.jacobian(of_input, checked.inputs[pair.input_index])
    return jacobian.to(torch.float64).reshape(math.prod(pair.output_shape), math.prod(pair.input_shape))


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in `shape` of element `flat` of its row-major flattening."""
    index = []
    for size in reversed(shape):
        flat, position = divmod(flat, size)
        index.append(position)
    return tuple(reversed(index))


def _describe_entry(pair: JacobianPair, worst: Mismatch, steps: FiniteDifferences) -> str:
    row, column = worst.index
    return (
        f" ({pair.output_name} with respect to {pair.input_name}). Worst entry, {pair.output_name} at "
        f"{_unravel(row, pair.output_shape)} with respect to {pair.input_name} at "
        f"{_unravel(column, pair.input_shape)}: expected {worst.expected:.6g} (numerical: central differences, eps "
        f"{steps.eps:g}), got {worst.got:.6g} (analytical: through the backward); {worst.mismatched} of "
        f"{worst.total} entries differ by more than atol {steps.atol:g} + rtol {steps.rtol:g} * |numerical|. Check "
        "the derivative formula that computes that entry."
    )


def _too_large(pair: JacobianPair) -> str:
    return (
        f" ({pair.output_name} with respect to {pair.input_name}). Its Jacobian, {math.prod(pair.output_shape)} x "
        f"{math.prod(pair.input_shape)} entries, is too large to show: opforge computes one of at most "
        f"{JACOBIAN_MAX_ENTRIES} entries to find its worst."
    )


# What PyTorch says, as a warning only, when autograd meets an op with no autograd kernel: the gradient through it
# is then silently missing (None, treated as zero). For gradgradcheck that is a backward op without its own formula.
NO_AUTOGRAD_WARNING = "an autograd kernel was not registered to the Autograd key"
NO_AUTOGRAD_HINT = (
    " An op on the gradient's path has no autograd formula (see the warning below), so the derivative through it is"
    " silently missing; for gradgradcheck that is the backward op: register its own autograd formula"
    " (torch.library.register_autograd on the backward op) or compute the backward from differentiable ops."
)


def _gradient_mismatch(
    ctx: CheckContext, implementation: Implementation, case: Case, names: list[str]
) -> Mismatch | None:
    """Where the op's vector-Jacobian product departs most from the reference's, to show next to the verdict."""
    loaded = ctx.loaded
    try:
        inputs = inputs_for(loaded, case, ctx.base_seed, requires_grad=True)
        got, expected, _ = vector_jacobian_products(loaded, implementation, case, ctx.base_seed, inputs, names)
    except Exception:
        return None  # the verdict stands on its own; this is only a pointer to where
    tol = tolerance_for(loaded.spec, case.dtype, grad=True)
    for name, g, e in zip(names, got, expected):
        if g is not None and e is not None:
            mismatch = worst_mismatch(f"grad[{name}]", g, e, tol)
            if mismatch:
                return mismatch
    return None


def finite_difference_dtype(claimed: tuple[str, ...]) -> str | None:
    """float64 when the op claims it, else the most precise floating dtype it claims (None: it claims none)."""
    return next((dtype for dtype in FINITE_DIFFERENCES if dtype in claimed), None)


def gradient_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One case per device/layout/shape/values point, in the finite-difference dtype."""
    if not loaded.spec.differentiable:
        return []
    seen: dict[str, Case] = {}
    for case in aligned(cases):
        dtype = finite_difference_dtype(loaded.spec.dtypes_on(case.device))
        if dtype is None:
            continue
        moved = replace(case, dtype=dtype)
        seen.setdefault(moved.id, moved)
    return list(seen.values())


def double_backward_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    return gradient_cases(loaded, implementation, cases) if loaded.spec.double_backward else []


CHECKS = (
    Check(
        "gradcheck",
        "gradients against finite differences (torch.autograd.gradcheck in float64)",
        gradient_cases,
        gradcheck,
        default_when=("differentiable",),
    ),
    Check(
        "gradgradcheck",
        "second derivatives against finite differences of the gradient (torch.autograd.gradgradcheck)",
        double_backward_cases,
        gradgradcheck,
        default_when=("differentiable", "double_backward"),
    ),
)
