"""Comparing an op's results with the reference: tolerances, metadata, and the worst mismatching element.

Two rules decide whether an output is close enough to the float64 reference. The fixed one: every element within
atol + rtol * |expected| (torch.testing.assert_close's defaults per dtype, or the spec's `tolerances`). And, in a
dtype narrower than float64 when the spec sets no tolerance of its own for it, the low-precision rule of
torch.compile's own accuracy checker (torch._dynamo.utils.same with an fp64 reference): the op's RMS error against
the float64 reference may be up to a small multiple of the RMS error of the reference itself computed in that dtype
(same input values), i.e. no worse than an ordinary PyTorch implementation of the op. A precision bug still fails:
an overflow is an infinite error, and a float64 case has no such baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opforge.core.outcomes import CheckFailure, short
from opforge.core.results import Mismatch
from opforge.spec.model import OpSpec, Tolerance

if TYPE_CHECKING:
    import torch
    from torch import Tensor

# torch.testing.assert_close's defaults, which users already know.
DEFAULT_TOLERANCES = {
    "float64": Tolerance(atol=1e-7, rtol=1e-7),
    "float32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "float16": Tolerance(atol=1e-5, rtol=1e-3),
    "bfloat16": Tolerance(atol=1e-5, rtol=1.6e-2),
    "complex128": Tolerance(atol=1e-7, rtol=1e-7),
    "complex64": Tolerance(atol=1e-5, rtol=1.3e-6),
}
EXACT = Tolerance(atol=0.0, rtol=0.0)
# The low-precision rule's multipliers of the baseline's RMS error, torch.compile's accuracy checker's
# (torch._dynamo.utils.same, torch 2.11-2.13, with its larger multipliers for small tensors): 2x for float32, 3x for
# float16/bfloat16 and for tensors under 1,000 elements, 8x up to 500 elements and 10x up to 10, where one or two
# roundings decide the RMS (seen: an LSTM cell's float16 gradient of 8 elements at 3.2x the baseline's error, both
# off by a few units in the last place). Plus a tenth of the dtype's atol, so an exact baseline does not demand an
# exact op.
FULL_MULTIPLIER = 2.0
LOWP_MULTIPLIER = 3.0
SMALL_TENSOR_MULTIPLIERS = ((10, 10.0), (500, 8.0), (999, 3.0))
# Units of roundoff (the dtype's eps) of an output's RMS magnitude that its RMS error may reach whatever the
# baseline's: in float32 and bfloat16 less than the fixed rtol, so it matters in float16 (rtol 1e-3, one eps).
ROUNDOFF_ULPS = 2.0
# A plain-order float32 sum of n equal values is off by up to 0.12 * n units of roundoff of the sum (3,000 random
# values and lengths up to 4,096, sequential numpy float32 cumsum; an 8-lane order stays under 0.02 * n): equal
# values round alike at every addition. Twice that is what float32_sum_error allows a reduction.
FLOAT32_SUM_ERROR = 0.25
# How many times the float64 reference is run on inputs perturbed by up to one unit of roundoff of the case's dtype
# (uniform in [-eps, eps], relative): the RMS of its moves is each element's conditioning allowance. Four draws keep
# the chance that every draw lands small at one element under a percent (chi with 4 degrees of freedom below a fifth
# of its mean), and cost four float64 reference calls, on a comparison that has already failed twice.
CONDITION_DRAWS = 4
# The float32 allowance of an output element that sums terms (a scan, a reduction): FLOAT32_SUM_ERROR units of
# roundoff per term of the sum of the terms' magnitudes (the classic bound of a sum in any order is n units of
# roundoff of sum |term|; a sequential float32 prefix sum of 1,000 equal values is 0.12 * n units off, 1,000 huge
# values of both signs that cancel 0.02 * n; the bound is reached only when every rounding goes one way). The terms
# are read off the float64 reference's Jacobian: term j of output i is d out_i / d in_j * in_j.
# At most this many output elements get a Jacobian row each: one backward pass of the float64 reference per row,
# batched; a cumsum of 1,000 elements takes ~40 ms for all of its rows.
SUM_ROWS = 4096
# Batched backward passes hold rows x input elements float64 gradients at once: at most this many (256 MiB).
SUM_ROW_BATCH_ELEMENTS = 1 << 25
# Jacobian terms (rows x input elements) read for one comparison at most: fewer rows past 4,096 input elements, none
# past 2^24. Each term costs ~70 ns (2-core VM, a swish reference: 4,096 rows of 10,000 elements 3.5 s, of 100,000
# 28 s), so this is about a second. Without the cap a failing float32 output of 1,000,003 elements took ~280 s per
# comparison (on an H100 host: the stream check of cuda_ops/disagreeing_swish 265 s, the whole spec past 450 s);
# the scans of up to 1,000 elements this allowance is for keep all of their rows. When an output has more elements
# off than the rows it may read, half of the rows go to the worst elements and half to an even sample of the rest
# by rank, which stands for the rest in the RMS (SumAllowance).
SUM_TERMS_PER_COMPARISON = 1 << 24
# A baseline equal to the float64 reference rounded to its dtype at every element, at least this many of them
# rounded, is exact beyond what a computation in that dtype gives by chance, and the failure says so
# (exact_baseline_note). Chance measured on 4,096 values in [-3, 3]: composites (swish, x * sigmoid(x) + 0.1 * x,
# softplus, x * 1.7 + sin(x), a row rms_norm) land correctly rounded at 56-82% of elements in float32, float16 and
# bfloat16, so exact on 32 elements with chance at most 1.7e-3; one torch function (exp, tanh; in float16 computed in
# float32 and rounded once) or torch.cumsum (accumulated in double on the CPU) is exact at every element, and the
# note then says what makes such a baseline exact without blaming the reference.
EXACT_BASELINE_ELEMENTS = 32
# Dtypes whose reference is the float64 reference itself: no baseline to compare with.
REFERENCE_DTYPES = ("float64", "complex128")


@dataclass(frozen=True)
class Rule:
    """How an output is judged: the fixed tolerance, and whether the low-precision rule may pass it too."""

    tol: Tolerance
    lowp: bool


def tolerance_for(spec: OpSpec, dtype: str, grad: bool = False) -> Tolerance:
    return rule_for(spec, dtype, grad).tol


def rule_for(spec: OpSpec, dtype: str, grad: bool = False) -> Rule:
    """The spec's `tolerances` (or `grad_tolerances`) for the dtype win: the fixed rule alone. Else the default
    tolerance, and the low-precision rule in any floating dtype but float64."""
    table = dict(spec.tolerances)
    if grad:
        table.update(dict(spec.grad_tolerances))
    if dtype in table:
        return Rule(table[dtype], lowp=False)
    return Rule(
        DEFAULT_TOLERANCES.get(dtype, EXACT), lowp=dtype in DEFAULT_TOLERANCES and dtype not in REFERENCE_DTYPES
    )


# The float64 reference on the op's input values, each floating input multiplied elementwise by 1 + scale * r
# with r uniform in [-1, 1] drawn from a generator seeded by `draw` (scale 0: the inputs as they are).
PerturbedReference = Callable[[float, int], dict[str, Any]]
# The float64 reference run with autograd on the op's input values: its named outputs, and the floating inputs
# they were computed from (each requiring grad).
TrackedReference = Callable[[], tuple[dict[str, Any], list["Tensor"]]]


class Baseline:
    """The reference computed in the case's dtype on the op's own input values: the rounding an ordinary PyTorch
    implementation has there. Computed once, on first need (most comparisons pass the fixed rule first); a
    reference that cannot run in that dtype leaves the fixed rule alone, and the failure says why. `perturbed`,
    where given, measures how far each output element moves under a rounding of the inputs (spread)."""

    def __init__(
        self,
        dtype: str,
        compute: Callable[[], dict[str, Any]],
        input_elements: int = 0,
        perturbed: PerturbedReference | None = None,
        tracked: TrackedReference | None = None,
        own: bool = False,
    ):
        self.dtype = dtype
        # The reference is the op itself (a spec without `reference:`): the baseline is the op in this dtype on
        # contiguous inputs.
        self.own = own
        self._compute = compute
        # The largest tensor input's element count: how many terms an output element of a reduction may sum.
        self.input_elements = input_elements
        self._values: dict[str, Any] | None = None
        self.unavailable: str | None = None
        self._perturbed = perturbed
        self._spreads: dict[str, Tensor] | None = None
        self._draws: dict[tuple[int, int], dict[str, Any]] = {}
        self._tracked = tracked

    @property
    def label(self) -> str:
        if self.own:
            return f"the op itself in {self.dtype} on contiguous inputs"
        return f"the reference computed in {self.dtype}"

    def value(self, name: str) -> Any:
        if self._values is None and self.unavailable is None:
            try:
                self._values = self._compute()
            except Exception as exc:  # the reference may not support the dtype: the fixed rule decides
                self.unavailable = f"{self.label} raised {short(exc)}"
        return (self._values or {}).get(name)

    def spread(self, name: str) -> Tensor | None:
        """Elementwise, the RMS over CONDITION_DRAWS draws of how far the float64 reference's `name` moves when
        every floating input is perturbed by up to one unit of roundoff of the dtype: what rounding the inputs (or
        any intermediate of the same magnitude) costs there. 0 where a move is not finite (overflows are judged by
        the edge rule); None when there is no perturbed reference or it raised."""
        if self._spreads is None and self._perturbed is not None:
            self._spreads = self._measure_spreads(self._perturbed)
        return (self._spreads or {}).get(name)

    def _reference_on(self, perturbed: PerturbedReference, sign: int, draw: int) -> dict[str, Any]:
        """The float64 reference on the inputs perturbed by `sign` units of roundoff of the dtype with `draw`'s noise
        (sign 0: the inputs as they are), computed once."""
        import torch

        if (sign, draw) not in self._draws:
            eps = torch.finfo(getattr(torch, self.dtype)).eps
            self._draws[sign, draw] = perturbed(sign * eps, draw if sign else 0)
        return self._draws[sign, draw]

    def _measure_spreads(self, perturbed: PerturbedReference) -> dict[str, Tensor]:
        import torch

        try:
            center = self._reference_on(perturbed, 0, 0)
            draws = [self._reference_on(perturbed, 1, draw) for draw in range(1, CONDITION_DRAWS + 1)]
        except Exception:  # the reference refuses perturbed inputs: no conditioning allowance, the other rules decide
            return {}
        spreads = {}
        for name, value in center.items():
            moves = [_errors(d[name], value) for d in draws if _same_shape(d.get(name), value)]
            if len(moves) == CONDITION_DRAWS:
                rms = torch.stack(moves).pow(2).mean(0).sqrt()
                spreads[name] = rms.masked_fill(~torch.isfinite(rms), 0.0)
        return spreads

    def rounded_values(self, name: str) -> list[Tensor]:
        """Output `name` of the float64 reference on CONDITION_DRAWS perturbations of the inputs by up to one unit of
        roundoff of the dtype, each with its mirror image (the same noise, the other sign): the values an integer
        output computed from floats may take when its inputs are rounded once more. At a rounding tie of the output
        (a code of 232.5), a mirrored pair moves it both ways. Empty when there is no perturbed reference or it
        raised."""
        import torch

        if self._perturbed is None:
            return []
        draws = [(sign, draw) for draw in range(1, CONDITION_DRAWS + 1) for sign in (1, -1)]
        try:
            values = [self._reference_on(self._perturbed, sign, draw).get(name) for sign, draw in draws]
        except Exception:  # the reference refuses perturbed inputs: the op's integers must be the reference's
            return []
        return [v for v in values if isinstance(v, torch.Tensor)]

    def sum_allowance(self, name: str, ranked: Tensor) -> SumAllowance | None:
        """FLOAT32_SUM_ERROR units of float32 roundoff per term of sum |term| at elements of output `name` among the
        flat indices `ranked` (the elements the op is off at, worst first), their terms read off the float64
        reference's Jacobian row (sum_terms): a correct float32 scan or reduction may be that far off however exact
        the baseline is (torch.cumsum in float32 accumulates in double on the CPU). Every ranked element gets one
        when their rows fit SUM_ROWS and SUM_TERMS_PER_COMPARISON; else the worst half of the rows that fit and an
        even sample of the rest by rank, each sampled element weighted for the unread ones it stands for. None when
        the reference is not differentiable there, or no row fits."""
        import torch

        if self._tracked is None or ranked.numel() == 0 or self.input_elements > SUM_TERMS_PER_COMPARISON:
            return None
        try:
            outputs, inputs = self._tracked()
            output = outputs.get(name)
            if not isinstance(output, torch.Tensor):
                return None
            budget = min(SUM_ROWS, SUM_TERMS_PER_COMPARISON // max(1, sum(t.numel() for t in inputs)))
            rows, weights = _rows_to_read(ranked, budget, output.numel())
            terms = sum_terms(output, inputs, rows) if rows.numel() else None
        except Exception:  # a reference autograd cannot go through: no allowance, the other rules decide
            return None
        if terms is None:
            return None
        count, magnitude = terms
        allowance = torch.zeros(output.numel(), dtype=torch.float64)
        eps = torch.finfo(torch.float32).eps
        allowance[rows] = FLOAT32_SUM_ERROR * count * eps * magnitude
        # An element that uses a NaN or infinite input has a NaN or infinite term: no allowance there (its error less
        # an infinite allowance would be NaN and make the RMS NaN); the edge rules judge such elements.
        allowance = allowance.masked_fill(~torch.isfinite(allowance), 0.0).reshape(output.shape)
        if weights is not None:
            weights = weights.reshape(output.shape)
        return SumAllowance(allowance, weights, int(rows.numel()), int(ranked.numel()))


@dataclass(frozen=True)
class SumAllowance:
    """Baseline.sum_allowance's answer. `weights`, when not every element the op is off at could be read: what each
    element's error counts for in the RMS (1 where it was read or the op is exact, 0 where it was not read, the
    number of unread elements per sampled one plus itself at the sampled ones), so the RMS over the read elements
    estimates the RMS over all of them. Found on fbgemm's asynchronous_complete_cumsum of 65,536 float32 lengths
    (`opforge bench`): a correct sequential scan off at 25,000 elements, of which the 256 rows that fit got their
    allowance and the rest none, an RMS error 6x the allowed one."""

    allowance: Tensor
    weights: Tensor | None
    read: int
    off: int


def _rows_to_read(ranked: Tensor, budget: int, numel: int) -> tuple[Tensor, Tensor | None]:
    """All of `ranked` when it fits `budget`; else its first half-budget (the worst) and an even sample of the rest
    by rank, with the weights SumAllowance describes."""
    import torch

    if ranked.numel() <= budget or budget < 2:  # no row, or one (the worst element's): nothing to sample with
        return ranked[:budget], None
    worst = budget - budget // 2
    rest = ranked[worst:]
    sampled = rest[torch.arange(budget // 2) * rest.numel() // (budget // 2)]
    weights = torch.ones(numel, dtype=torch.float64)
    weights[rest] = 0.0
    weights[sampled] = rest.numel() / sampled.numel()
    return torch.cat([ranked[:worst], sampled]), weights


def sum_terms(output: object, inputs: list[Tensor], rows: Tensor) -> tuple[Tensor, Tensor] | None:
    """For each flat index in `rows` of `output` (float64, computed with autograd from `inputs`): how many terms it
    sums (the participation ratio (sum |t|)^2 / sum t^2: n for n equal terms, ~1 when one dominates) and sum |t|,
    the terms t_j = d output_i / d input_j * input_j. None when the output does not depend on the inputs by
    autograd."""
    import torch

    if not isinstance(output, torch.Tensor) or not output.requires_grad or not inputs:
        return None
    flat = output.reshape(-1)
    per_row = max(1, sum(t.numel() for t in inputs))
    batch = max(1, SUM_ROW_BATCH_ELEMENTS // per_row)
    absolute, squared = [], []
    for chunk in rows.split(batch):
        seeds = torch.zeros(len(chunk), flat.numel(), dtype=flat.dtype)
        seeds[torch.arange(len(chunk)), chunk] = 1.0
        grads = torch.autograd.grad(flat, inputs, seeds, retain_graph=True, allow_unused=True, is_grads_batched=True)
        # A term whose derivative is 0 is 0 whatever the input: an infinite or NaN input the element does not use
        # (an inf late in a scan, for the prefixes before it) must not make the element's terms NaN (0 * inf).
        terms = torch.cat(
            [
                torch.where(g != 0, g * x.detach(), 0.0).reshape(len(chunk), -1)
                for g, x in zip(grads, inputs)
                if g is not None
            ],
            dim=1,
        )
        absolute.append(terms.abs().sum(1))
        squared.append(terms.pow(2).sum(1))
    magnitude, square = torch.cat(absolute), torch.cat(squared)
    count = torch.where(square > 0, magnitude**2 / square.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
    return count, magnitude


def as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def returned_values(returns: int, returned: Any) -> tuple[Any, ...]:
    """What a call returned, one value per schema return: () for none, (returned,) for one (a `Tensor[]` return is
    one list, not several outputs), the returned tuple for several."""
    if returns == 0:
        return ()
    return (returned,) if returns == 1 else tuple(returned)


def map_tensors(fn: Callable[[Any], Any], value: Any) -> Any:
    """`value` with fn applied to each tensor in it, lists and tuples rebuilt around them."""
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(fn, item) for item in value)
    return fn(value) if hasattr(value, "dtype") and hasattr(value, "shape") else value


def leaves(name: str, value: Any) -> list[tuple[str, Any]]:
    """A returned value's leaves, each named by its place: a `Tensor[]` output `result1` holding two tensors is
    `result1[0]`, `result1[1]`; a tensor, None, a number or a bool is a leaf of its own."""
    if isinstance(value, (list, tuple)):
        return [leaf for i, item in enumerate(value) for leaf in leaves(f"{name}[{i}]", item)]
    return [(name, value)]


def paired_leaves(name: str, got: Any, expected: Any) -> list[tuple[str, Any, Any]]:
    """(name, got, expected) for each leaf of two returned values of one schema return, after checking that both
    have the same structure (a list as long, None where None is expected)."""
    if not isinstance(expected, (list, tuple)):
        if isinstance(got, (list, tuple)):
            raise CheckFailure(f"{name}: expected {_kind(expected)}, got a list of {len(got)}.")
        return [(name, got, expected)]
    if not isinstance(got, (list, tuple)):
        raise CheckFailure(f"{name}: expected a list of {len(expected)} values, got {_kind(got)}.")
    if len(got) != len(expected):
        raise CheckFailure(
            f"{name}: expected a list of {len(expected)} values, got {len(got)}. Return as many as the reference."
        )
    return [leaf for i, (g, e) in enumerate(zip(got, expected)) for leaf in paired_leaves(f"{name}[{i}]", g, e)]


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return "a Tensor" if hasattr(value, "dtype") and hasattr(value, "shape") else f"a {type(value).__name__}"


def check_result(
    name: str,
    got: Any,
    expected: Any,
    tol: Tolerance | Rule,
    dtype: torch.dtype | None,
    device: str,
    against: str = "the reference",
    baseline: Baseline | None = None,
    baseline_key: str | None = None,
) -> None:
    """`got` must be a tensor of `dtype` on `device`, shaped like `expected`, and close to it by the rule (a bare
    Tolerance: the fixed rule only); `against` names what `expected` is in the failure message. `baseline`, where
    the rule allows the low-precision rule, is the reference computed in the case's dtype; its value for this output
    is the one named `baseline_key` (default: `name`)."""
    import torch

    rule = tol if isinstance(tol, Rule) else Rule(tol, lowp=False)
    if not isinstance(expected, torch.Tensor):
        check_plain_value(name, got, expected, rule.tol)
        return
    if not isinstance(got, torch.Tensor):
        raise CheckFailure(f"{name}: expected a Tensor, got {_kind(got)}.")
    if tuple(got.shape) != tuple(expected.shape):
        raise CheckFailure(f"{name}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}.")
    if got.dtype != dtype:
        raise CheckFailure(f"{name}: expected dtype {dtype}, got {got.dtype}.")
    if got.device.type != device:
        raise CheckFailure(f"{name}: expected a tensor on {device}, got one on {got.device}.")
    mismatch = worst_mismatch(name, got, expected, rule.tol)
    if mismatch is None:
        return
    message = f"{name}: {mismatch.mismatched} of {mismatch.total} elements differ from {against} beyond tolerance"
    if not rule.lowp or baseline is None:
        raise CheckFailure(f"{message}.", mismatch)
    key = baseline_key or name
    if not (got.is_floating_point() or got.is_complex()):
        _check_rounded_integers(name, got, expected, rule.tol, baseline, key, message)
        return
    eager = baseline.value(key)
    if not isinstance(eager, torch.Tensor) or eager.shape != got.shape:
        why = baseline.unavailable or f"{baseline.label} returned no {key} of shape {tuple(got.shape)}"
        raise CheckFailure(f"{message}, and the low-precision rule could not apply: {why}.", mismatch)
    terms = max(1, baseline.input_elements // max(1, got.numel()))
    verdict = lowp_errors(got, expected, eager, rule.tol, baseline.label, terms)
    spread = baseline.spread(key) if _allowances_could_pass(verdict) else None
    if _same_shape(spread, got):
        verdict = lowp_errors(got, expected, eager, rule.tol, baseline.label, terms, spread)
    summed = _sum_allowance(baseline, key, got, expected) if _allowances_could_pass(verdict) else None
    if summed is not None:
        spreads = spread if spread is not None and _same_shape(spread, got) else 0.0
        verdict = lowp_errors(
            got, expected, eager, rule.tol, baseline.label, terms, spreads + summed.allowance, summed.weights
        )
    if verdict is None:
        return
    if verdict.stray_overflows:
        raise CheckFailure(
            f"{message}, and at {verdict.stray_overflows} element(s) where {baseline.label} is not finite (or the "
            "reference is not) it is close to neither.",
            replace(mismatch, **verdict.fields()),
        )
    note = "" if baseline.own else exact_baseline_note(eager, expected, got.dtype)
    sampled = (
        f" (estimated from the {summed.read} of its {summed.off} elements off whose sums were read)"
        if summed is not None and summed.weights is not None
        else ""
    )
    raise CheckFailure(
        f"{message}, and its RMS error {verdict.rms_error:.3g}{sampled} exceeds the {verdict.allowed_rms_error:.3g} "
        f"allowed by {baseline.label} (RMS error {verdict.baseline_rms_error:.3g}).{note}",
        replace(mismatch, **verdict.fields()),
    )


def _allowances_could_pass(verdict: LowpErrors | None) -> bool:
    """Whether a failing verdict could still pass with the conditioning and sum allowances, which are finite and
    leave stray overflows alone: not with an infinite RMS error. They cost reference runs (a Jacobian row each):
    `opforge fuzz` of torchvision's roi_pool on an all -inf input of 2,925 rois (the op's -FLT_MAX for the reference's
    -inf, a declared defect) spent 40 s reading 1,108 rows of an error that stays infinite, and the example was
    reported as a hang."""
    return verdict is not None and not verdict.stray_overflows and math.isfinite(verdict.rms_error)


def _check_rounded_integers(
    name: str, got: Tensor, expected: Tensor, tol: Tolerance, baseline: Baseline, key: str, message: str
) -> None:
    """An integer (or bool) output of a floating case, off the float64 reference: each element must be a value that
    the reference computed in the case's dtype or the float64 reference on inputs rounded once more gives
    (Baseline.rounded_values). A quantization code at a rounding tie goes either way in a kernel that rounds at other
    steps than the reference (an FMA, a reciprocal then a multiply: one unit of roundoff moves 223.5 to 223.49998);
    a code off where nothing is near a tie (a floor for a round, a lost scale) still fails."""
    import torch

    own = got.detach().to("cpu")
    eager = baseline.value(key)
    candidates = [*baseline.rounded_values(key), eager]
    reachable = _close(own, expected, tol)  # the float64 reference's value itself among them
    for candidate in candidates:
        if _same_shape(candidate, own):
            reachable |= _same(own, candidate)
    if bool(reachable.all()):
        return
    unreached = worst_mismatch(name, torch.where(reachable, expected.detach().to("cpu", own.dtype), own), expected, tol)
    assert unreached is not None  # an element outside the tolerance and equal to no candidate is left
    raise CheckFailure(
        f"{message}, and at {unreached.mismatched} of them neither {baseline.label} nor the float64 reference on "
        f"inputs rounded once more in {baseline.dtype} gives the op's value.",
        unreached,
    )


def exact_baseline_note(eager: Tensor, expected: Tensor, dtype: torch.dtype) -> str:
    """Why the baseline was as exact as the float64 reference, when it was: a reference that computes in float64
    whatever it is given (`.to(torch.float64)` inside) makes the low-precision rule allow its floors alone, which a
    correct low-precision kernel need not meet. Empty when the baseline looks like a computation in `dtype`."""
    import torch

    if not (dtype.is_floating_point or dtype.is_complex):
        return ""
    how = 'Write the reference in its inputs\' dtype (docs/specs.md, "A reference for low-precision dtypes").'
    if eager.dtype != dtype:
        return (
            f" The reference computed in {_name(dtype)} returned {_name(eager.dtype)}: it computes in that dtype "
            f"whatever it is given (a `.to(torch.{_name(eager.dtype)})` inside, never cast back), so this baseline "
            f"is exact and the rule allows only its floors. {how}"
        )
    wide = expected.detach().to("cpu")
    rounded = wide.to(dtype)
    rounding = torch.isfinite(wide) & (rounded.to(wide.dtype) != wide)
    if int(rounding.sum()) < EXACT_BASELINE_ELEMENTS or not bool(_same(eager, rounded).all()):
        return ""
    # Neutral on the cause: torch.cumsum in float16 (accumulated in float32 on the CPU) is exact this way too, and
    # then the note must not send an author who wrote the reference right to rewrite it (fbgemm's cumsum, fuzzed).
    return (
        f" The reference computed in {_name(dtype)} equals the float64 reference rounded to {_name(dtype)} at all "
        f"{wide.numel()} elements, {int(rounding.sum())} of them rounded: it is exact, so the rule allows only its "
        f"floors. A reference that computes in float64 inside (`.to(torch.float64)`, then back) is exact so; then "
        f"{how[0].lower()}{how[1:]} A torch function that accumulates wider (torch.cumsum, sum) or rounds once "
        f"(exp, tanh) is exact so too; then the op is less exact than eager PyTorch in {_name(dtype)}."
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sum_allowance(baseline: Baseline, key: str, got: Tensor, expected: Tensor) -> SumAllowance | None:
    """A float32 output's per-element allowance for the terms it sums (Baseline.sum_allowance) at the elements the op
    is off at; None in other dtypes."""
    import torch

    if got.dtype != torch.float32:
        return None
    errors = _errors(got, expected).reshape(-1)
    return baseline.sum_allowance(key, errors.argsort(descending=True)[: int((errors > 0).sum())])


@dataclass(frozen=True)
class LowpErrors:
    rms_error: float
    baseline_rms_error: float
    allowed_rms_error: float
    baseline: str
    # Elements where the baseline's error is infinite (it overflows, or the reference does and it does not) and the
    # op is close to neither the baseline nor the reference.
    stray_overflows: int = 0

    def fields(self) -> dict[str, Any]:
        return {
            "rms_error": self.rms_error,
            "baseline_rms_error": self.baseline_rms_error,
            "allowed_rms_error": self.allowed_rms_error,
            "baseline": self.baseline,
        }


def lowp_errors(
    got: Tensor,
    expected: Tensor,
    eager: Tensor,
    tol: Tolerance,
    label: str,
    terms: int = 1,
    spread: Tensor | None = None,
    weights: Tensor | None = None,
) -> LowpErrors | None:
    """None when `got` is as accurate as `eager` by the rule, else the figures. Where the op returns exactly what
    the baseline returns (the same rounding, the same overflow) it is as accurate as eager PyTorch there. Where the
    baseline's own error is infinite (eager overflows where float64 does not, or the other way round: the value is
    at the edge of the dtype's range, and the order of evaluation decides) the op must be close to the baseline or
    to the reference. On the other elements its error less the element's `spread` (Baseline.spread: how far a
    rounding of the inputs moves it) must have an RMS within the allowed multiple of the baseline's on those same
    elements, or within two units of roundoff (roundoff_error), or (in float32) within what a plain float32 sum of
    `terms` inputs per element may be off by (float32_sum_error). `weights` (SumAllowance) weigh the op's errors
    in its RMS."""
    import torch

    differ = ~_same(got, eager)
    if not bool(differ.any()):
        return None
    # The op's infinity where the float64 result rounds to it is exact; the baseline's stays an edge (it overflows
    # where float64 does not), judged below.
    op_errors = _errors(got, expected).masked_fill(rounds_to_infinity(got, expected), 0.0)
    # An ill-conditioned element (a sigmoid of a large negative gate, a difference of near-equal values) is off by
    # what rounding its inputs costs in any correct implementation, however lucky eager's rounding was there. Found
    # by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell in bfloat16: a gate of 2,585 terms rounded once more
    # than eager's, and h_new = sigmoid(gate) * tanh(c) of 1e-3 off by 3 of its ulps, eager by 0.04.
    if spread is not None:
        op_errors = (op_errors - spread).clamp_min(0.0)
    baseline_errors = _errors(eager, expected)
    edge = differ & baseline_errors.isinf()
    # Where eager's own result is NaN for a finite reference, its arithmetic broke down (a float16 LSTM's gates
    # overflowing into inf - inf): there is nothing to be as accurate as, so the op passes there whatever it
    # returns. Found by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell with magnitudes of 256 in float16.
    broke_down = edge & torch.isnan(eager.detach().to("cpu"))
    stray = int((edge & ~broke_down & ~(_close(got, eager, tol) | _close(got, expected, tol))).sum())
    rest = differ & ~edge
    scale = magnitude_scale(expected, got.dtype)
    op_errors, baseline_errors = op_errors * scale, baseline_errors * scale
    op_error, baseline_error = (
        _rms(op_errors[rest], None if weights is None else weights[rest]),
        _rms(baseline_errors[rest]),
    )
    allowed = lowp_multiplier(got.dtype, int(rest.sum())) * baseline_error
    magnitude = _finite_rms(expected.detach().to("cpu").abs() * scale, rest)
    floors = (float32_sum_error(got.dtype, terms, magnitude), roundoff_error(got.dtype, magnitude))
    allowed = max(allowed, *floors) + tol.atol / 10
    if stray == 0 and op_error <= allowed:
        return None
    return LowpErrors(op_error, baseline_error, allowed, label, stray)


def magnitude_scale(expected: Tensor, dtype: torch.dtype) -> Tensor | float:
    """What each element's error counts for in lowp_errors's RMS: 1 (its error as it is), except in an output
    whose largest finite magnitude is more than 1/eps of `dtype` times its median nonzero one, where one unit of
    roundoff of the largest element outweighs the median element whole and an RMS of absolute errors is that
    element's error alone (special_values' +-max calls). There an element above the median counts by its error
    relative to its own magnitude, times the median (the factor median / |expected|): an element of -1.19e37 off by
    13 units of roundoff counts as a median element off by 13 units. Found on torchvision's roi_align in float32: a
    -max times a bilinear weight of 0.035, that weight rounded by the op's float32 sample positions (the float32
    baseline's positions are Python floats: 0.9 units off there), one element of 72, with the op as far off in
    relative terms on elements that pass."""
    import torch

    if not (dtype.is_floating_point or dtype.is_complex):
        return 1.0  # an integer output is compared exactly: no roundoff to scale
    magnitudes = expected.detach().to("cpu").abs().to(torch.float64)
    finite = torch.isfinite(magnitudes) & (magnitudes > 0)
    if not bool(finite.any()):
        return 1.0
    typical = float(magnitudes[finite].median())
    if float(magnitudes[finite].max()) <= typical / torch.finfo(dtype).eps:
        return 1.0
    above = finite & (magnitudes > typical)
    return torch.where(above, typical / magnitudes.clamp_min(typical), torch.ones((), dtype=torch.float64))


def roundoff_error(dtype: torch.dtype, magnitude: float) -> float:
    """ROUNDOFF_ULPS units of roundoff of an output's RMS `magnitude`: what an op may be off by in
    its dtype whatever the baseline's luck. Found by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell in float16:
    with h all 0 the baseline's products vanish exactly and its error fell to a tenth of an ulp, while the op (one
    addmm order) stayed within 2 ulps of every element, 14.6 times the baseline's RMS error on 12 elements."""
    import torch

    if not dtype.is_floating_point:
        return 0.0
    return ROUNDOFF_ULPS * torch.finfo(dtype).eps * magnitude


def float32_sum_error(dtype: torch.dtype, terms: int, magnitude: float) -> float:
    """What a correct float32 sum of `terms` values in plain order may be off by: FLOAT32_SUM_ERROR * terms units of
    roundoff of the RMS magnitude of `expected` at `where`; 0 for other dtypes. A float32 reduction may be that far
    off however accurate the baseline happens to be (torch's cascade sum of 1,560 equal values is within 2 ulps,
    where the 8-lane order of a correct reduction, tests/fixtures/real_ops/row_sum, is 26 ulps off: found by
    `opforge fuzz`), and plain float32 accumulation is what CUDA reductions do. A lost term or a wrong value still
    fails: float64 cases have no such allowance. Half dtypes keep the baseline's bound alone: accumulating in
    float16 is a bug of its own."""
    import torch

    if dtype != torch.float32 or terms <= 1:
        return 0.0
    return FLOAT32_SUM_ERROR * terms * torch.finfo(torch.float32).eps * magnitude


def _close(got: Tensor, expected: Tensor, tol: Tolerance) -> Tensor:
    """Elementwise atol + rtol * |expected| (infinities of one sign and NaNs match each other)."""
    import torch

    wide = torch.complex128 if got.is_complex() else torch.float64
    g = got.detach().to("cpu", wide)
    e = expected.detach().to("cpu", wide)
    return torch.isclose(g, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)


def lowp_multiplier(dtype: torch.dtype, numel: int) -> float:
    import torch

    small = next((multiplier for elements, multiplier in SMALL_TENSOR_MULTIPLIERS if numel <= elements), None)
    if small is not None:
        return small
    return LOWP_MULTIPLIER if dtype in (torch.float16, torch.bfloat16) else FULL_MULTIPLIER


def _finite_rms(values: Tensor, where: Tensor) -> float:
    """The RMS magnitude of `values` at `where`, over its finite elements (an infinite expected value must not
    make an infinite allowance)."""
    import torch

    v = values.detach().to("cpu", torch.float64)
    return _rms(v[where & torch.isfinite(v)])


def _same_shape(a: object, b: object) -> bool:
    return hasattr(a, "shape") and hasattr(b, "shape") and tuple(a.shape) == tuple(b.shape)


def _rms(errors: Tensor, weights: Tensor | None = None) -> float:
    if weights is None:
        return math.sqrt(float((errors**2).mean())) if errors.numel() else 0.0
    # An unread element (weight 0) counts for nothing, whatever its error: 0 * inf would make the RMS NaN (seen: a
    # stream-order bug's NaN outputs, "RMS error nan (estimated from the 16 of its 1000003 elements off ...)").
    read = weights > 0
    total = float(weights[read].sum())
    return math.sqrt(float((weights[read] * errors[read] ** 2).sum()) / total) if total > 0 else 0.0


def _same(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise: equal values, or both NaN (the comparison of two results of one dtype)."""
    import torch

    a = a.detach().to("cpu")
    b = b.detach().to("cpu", a.dtype)
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _errors(got: Tensor, expected: Tensor) -> Tensor:
    """The elementwise errors against `expected`: 0 where both are the same NaN or infinity, infinite where only one
    of them is finite (an overflow the reference does not have)."""
    import torch

    g = got.detach().to("cpu", torch.complex128 if got.is_complex() else torch.float64)
    e = expected.detach().to("cpu", g.dtype)
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    error = torch.where(same, torch.zeros((), dtype=torch.float64), (g - e).abs().to(torch.float64))
    return torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)


def rounds_to_infinity(got: Tensor, expected: Tensor) -> Tensor:
    """Elementwise: `got` is the infinity that `expected` (finite in float64, past the largest value of got's
    dtype) rounds to in got's dtype: the correctly rounded result, no error. Seen: affine_leaky_swish in float16
    returning inf for a float64 result of 65,600 (float16's largest is 65,504), found by `opforge fuzz`."""
    import torch

    if got.is_complex() or not got.is_floating_point():
        return torch.zeros(got.shape, dtype=torch.bool)
    g = got.detach().to("cpu")
    rounded = expected.detach().to("cpu").to(g.dtype)
    return torch.isinf(g) & (g == rounded)


def check_plain_value(name: str, got: Any, expected: Any, tol: Tolerance) -> None:
    """A returned value that is no tensor (None, a bool, an int or SymInt, a float, a dtype): None where None is
    expected, a bool where a bool is, an int exactly, a float within the tolerance (an op computing it in float32
    rounds it)."""
    import torch

    if isinstance(got, torch.Tensor) or isinstance(got, bool) != isinstance(expected, bool) or _none(got, expected):
        raise CheckFailure(f"{name}: expected {_kind(expected)} ({expected!r}), got {_kind(got)}.")
    if isinstance(expected, float) and isinstance(got, (int, float)):
        if _both_nan(got, expected) or got == expected or abs(got - expected) <= tol.atol + tol.rtol * abs(expected):
            return
        raise CheckFailure(
            f"{name}: expected {expected!r}, got {got!r} (beyond atol {tol.atol:g} + rtol {tol.rtol:g} * |expected|)."
        )
    if got != expected:
        raise CheckFailure(f"{name}: expected {expected!r}, got {got!r}.")


def _none(got: object, expected: object) -> bool:
    """Exactly one of the two is None."""
    return (got is None) != (expected is None)


def _both_nan(a: object, b: object) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def worst_mismatch(name: str, got: Tensor, expected: Tensor, tol: Tolerance) -> Mismatch | None:
    """None when every element is within atol + rtol * |expected| (NaN matches NaN, inf matches inf)."""
    import torch

    g = got.detach().to("cpu", torch.complex128 if got.is_complex() else torch.float64)
    e = expected.detach().to("cpu", g.dtype)
    if g.numel() == 0:
        return None
    error = (g - e).abs()
    allowed = tol.atol + tol.rtol * e.abs()
    same = (g == e) | (torch.isnan(g) & torch.isnan(e)) | rounds_to_infinity(got, expected)
    excess = torch.where(same, torch.zeros_like(error), error - allowed)
    excess = torch.where(torch.isnan(excess), torch.full_like(excess, math.inf), excess)
    bad = excess > 0
    if not bool(bad.any()):
        return None
    flat = int(torch.argmax(excess.reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(g.shape))) if g.dim() else ()
    got_v, exp_v = g.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()
    abs_error = abs(got_v - exp_v)
    rel_error = abs_error / abs(exp_v) if exp_v else math.inf
    return Mismatch(
        output=name,
        index=index,
        got=_plain(got_v),
        expected=_plain(exp_v),
        abs_error=float(abs_error),
        rel_error=float(rel_error),
        atol=tol.atol,
        rtol=tol.rtol,
        mismatched=int(bad.sum()),
        total=g.numel(),
    )


def _plain(value: complex | float) -> complex | float:
    return value if isinstance(value, complex) else float(value)
