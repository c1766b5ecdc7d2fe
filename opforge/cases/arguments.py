"""The inputs of each case of the test matrix (opforge.cases.matrix): the op's arguments and the reference's.

Inputs are sampled in float64 from the case's seed, rounded to the case's dtype, and the reference sees those rounded
values upcast back to float64: any difference the checks find is the op's, not the sampling's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opforge.cases.matrix import (
    FILL_SPECIALS,
    SPECIAL_FILLS,
    Case,
    input_layout,
    offset_of,
    transposed_dims,
)
from opforge.spec.model import CASE_DTYPE, KNOWN_DTYPES, Avoid, OpSpec, TensorInput, layout_kind

if TYPE_CHECKING:
    import torch
    from torch._C import Argument


@dataclass
class CaseInputs:
    """The arguments of one case, ready for the op, plus float64 CPU copies of the same values for the reference."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    reference_args: tuple[Any, ...]
    reference_kwargs: dict[str, Any]
    tensor_names: tuple[str, ...]


def make_inputs(
    spec: OpSpec,
    schema_arguments: list[Argument],
    case: Case,
    base_seed: int,
    requires_grad: bool = False,
    generators: dict[str, Callable[..., Any]] | None = None,
    samples: Callable[..., Any] | None = None,
) -> CaseInputs:
    """`generators`: input name -> the function that makes its values (the spec's `generator:`, resolved);
    `samples`: the spec's `samples:` function, resolved, which makes a sample case's tensors."""
    shapes = dict(case.shapes)
    present = [t for t in spec.tensor_inputs() if t.name in shapes]  # an optional one a sample leaves None is not
    values64 = _values_of(_Draw(spec, generators, samples, case, base_seed), present)
    given = {i.name: i for i in spec.inputs}
    scalars = dict(case.values)
    args, kwargs, ref_args, ref_kwargs, positional = [], {}, [], {}, True
    for argument in schema_arguments:
        if argument.name not in given and argument.name not in scalars:
            positional = False  # left to its default; later arguments go by name
            continue
        entry = given.get(argument.name)
        if isinstance(entry, TensorInput) and entry.name in shapes:
            dtype = _torch_dtype(entry.dtype or case.dtype)
            layout = input_layout(spec, entry.name, case.layout, shapes[entry.name])
            value = in_layout(values64[entry.name], layout, dtype, case.device)
            grad = requires_grad and entry.requires_grad and (value.is_floating_point() or value.is_complex())
            value = value.requires_grad_(grad) if grad else value
            # A copy: the values may be the memo's (_values_of), and a reference may write its arguments.
            ref = values64[entry.name].to(_reference_dtype(dtype), copy=True).requires_grad_(grad)
        else:
            value = ref = argument_value(argument, scalars[argument.name], case.dtype)
        if positional and not argument.kwarg_only:
            args.append(value)
            ref_args.append(ref)
        else:
            kwargs[argument.name] = value
            ref_kwargs[argument.name] = ref
    return CaseInputs(tuple(args), kwargs, tuple(ref_args), ref_kwargs, tuple(t.name for t in present))


# Cases whose values hold at most this many elements in all are kept for the next build of the same case. Fuzz judges
# one example with several oracles, each building its inputs: a 0.8M-element bfloat16 example with `fill: sorted`
# took 1.21 s to judge, 0.67 s of it making its values five times over (CPU, 2026-12-07). Larger cases (large_index's
# 2^31 elements) are not kept: holding their float64 values past the build could take the memory the op needs.
MEMO_MAX_ELEMENTS = 2**24


@dataclass(frozen=True, eq=False)
class _Draw:
    """What a case's values are drawn from: the spec, its generators and samples function, the case and the seed."""

    spec: OpSpec
    generators: dict[str, Callable[..., Any]] | None
    samples: Callable[..., Any] | None
    case: Case
    base_seed: int

    def same_as(self, other: _Draw) -> bool:
        """The same draw: the same makers (by identity, which the memo holding them keeps unique), case and seed."""
        makers = self.spec is other.spec and self.generators is other.generators and self.samples is other.samples
        return makers and self.case == other.case and self.base_seed == other.base_seed


_memo: list[tuple[_Draw, dict[str, torch.Tensor]]] = []  # the last draw kept, at most one


def _values_of(draw: _Draw, present: list[TensorInput]) -> dict[str, torch.Tensor]:
    """Each present tensor input's values in float64, as the op will see them (rounded to its dtype), drawn from the
    case's seed; never written by the caller, so the next build of the same case can reuse them."""
    if _memo and _memo[0][0].same_as(draw):
        return _memo[0][1]
    values64 = _drawn_values(draw, present)
    _memo.clear()
    if sum(v.numel() for v in values64.values()) <= MEMO_MAX_ELEMENTS:
        _memo.append((draw, values64))
    return values64


def _drawn_values(draw: _Draw, present: list[TensorInput]) -> dict[str, torch.Tensor]:
    import torch

    spec, case = draw.spec, draw.case
    generator = torch.Generator().manual_seed(case.seed(draw.base_seed))
    shapes = dict(case.shapes)
    values64 = sampled_tensors(spec, draw.samples, case, generator) if case.sample and draw.samples else {}
    for t in present:
        if t.name in values64:
            continue  # made by the sample function
        make = (draw.generators or {}).get(t.name)
        values64[t.name] = (
            generated(t, make, shapes, case, generator) if make else sample(t, shapes[t.name], case.dtype, generator)
        )
    if case.fill:
        fill_values(spec, case, values64, generator)
    for t in present:
        if input_layout(spec, t.name, case.layout, shapes[t.name]) == "expanded":
            values64[t.name] = values64[t.name].narrow(0, 0, 1).expand(shapes[t.name])
    for t in present:
        if t.avoid and (t.avoid.relative_to is None or t.avoid.relative_to in shapes):
            _apply_avoid(t, t.avoid, values64, case.dtype)
    return values64


def argument_value(argument: Argument, value: Any, case_dtype: str) -> Any:
    """A non-tensor value as the op takes it: CASE_DTYPE is the case's dtype, and a dtype's name the dtype where
    the schema argument (`argument`) is a ScalarType."""
    if isinstance(value, str) and value == CASE_DTYPE:
        return _torch_dtype(case_dtype)
    if isinstance(value, str) and value in KNOWN_DTYPES and "ScalarType" in str(argument.real_type):
        return _torch_dtype(value)
    return value


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def _reference_dtype(dtype: torch.dtype) -> torch.dtype:
    import torch

    if dtype.is_floating_point:
        return torch.float64
    if dtype.is_complex:
        return torch.complex128
    return dtype


def sample(t: TensorInput, shape: tuple[int, ...], case_dtype: str, generator: torch.Generator) -> torch.Tensor:
    """Uniform values in [low, high], already rounded to the dtype the op will see, held in float64."""
    import torch

    dtype = _torch_dtype(t.dtype or case_dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).to(torch.float64)
    if not (dtype.is_floating_point or dtype.is_complex):
        low, high = int(max(t.low, torch.iinfo(dtype).min)), int(min(t.high, torch.iinfo(dtype).max))
        return torch.randint(low, high + 1, shape, generator=generator).to(torch.float64)
    values = torch.rand(shape, generator=generator, dtype=torch.float64) * (t.high - t.low) + t.low
    return values.to(dtype).to(torch.float64)


def generated(
    t: TensorInput,
    make: Callable[..., Any],
    shapes: dict[str, tuple[int, ...]],
    case: Case,
    generator: torch.Generator,
) -> torch.Tensor:
    """The values a spec's generator makes for input `t`, rounded to the dtype the op will see, held in float64.
    The generator is called as make(shape=, dtype=, device=, generator=), plus shapes= (every tensor input's shape)
    when it takes it, and must draw every random number from `generator` (seeded by the case)."""
    import torch

    dtype = _torch_dtype(t.dtype or case.dtype)
    shape = shapes[t.name]
    kwargs: dict[str, Any] = {"shape": shape, "dtype": dtype, "device": case.device, "generator": generator}
    if "shapes" in inspect.signature(make).parameters:
        kwargs["shapes"] = dict(shapes)
    value = make(**kwargs)
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape):
        got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"generator {t.generator} for {t.name}: expected a tensor of shape {tuple(shape)}, got {got}")
    return value.detach().to("cpu").to(dtype).to(torch.float64)


def sampled_tensors(
    spec: OpSpec, make: Callable[..., Any], case: Case, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Sample `case.shape_index`'s tensors as the op will see them (rounded to their dtype), held in float64. The
    function runs with the case's generator, device and dtype (float64 for a case in an integer or bool dtype: it
    makes floating tensors); its shapes and non-tensor values must be those the matrix was planned with, since the
    case's id, and the op, take the planned values."""
    import torch

    assert spec.samples is not None
    dtype = _torch_dtype(case.dtype)
    floating = dtype if dtype.is_floating_point or dtype.is_complex else torch.float64
    drawn = call_samples(spec, make, floating, case.device, generator)[case.shape_index]
    made_in = f"in {case.dtype} on {case.device} from the case's seed"
    for name, planned in spec.samples.values[case.shape_index]:
        if not planned_value_matches(planned, drawn.get(name), floating):
            raise ValueError(
                f"samples: sample {case.shape_index}'s {name}: expected {planned!r} (as made in float64 on cpu), "
                f"got {drawn.get(name)!r} {made_in}. {SAME_VALUES_HINT}"
            )
    entries = {t.name: t for t in spec.tensor_inputs()}
    values64 = {}
    for name, planned_shape in case.shapes:
        value = drawn.get(name)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != planned_shape:
            got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
            raise ValueError(
                f"samples: sample {case.shape_index}'s {name}: expected shape {planned_shape} (as made in float64 on "
                f"cpu), got {got} {made_in}. {SAME_VALUES_HINT}"
            )
        as_op_sees = value.detach().to("cpu").to(_torch_dtype(entries[name].dtype or case.dtype))
        values64[name] = as_op_sees.to(torch.float64)
    return values64


# What a samples function does so that each case's tensors match the shapes and values its id was planned with.
SAME_VALUES_HINT = (
    "A sample's shapes and Python values must not depend on dtype, device or seed: draw what they are computed from "
    "(lengths, offsets, sizes) from a generator of the sample's own (torch.Generator().manual_seed(i)), the values "
    "the op reads from `generator`; return the function's own `dtype` for a ScalarType argument that follows the "
    "case."
)


def planned_value_matches(planned: Any, drawn: Any, dtype: torch.dtype) -> bool:
    """Whether a sample's value drawn for a case (whose samples call got `dtype`) is the planned one: CASE_DTYPE
    stands for that dtype."""
    if isinstance(planned, str) and planned == CASE_DTYPE:
        return bool(drawn == dtype)
    return same_value(planned, drawn)


def same_value(first: Any, second: Any) -> bool:
    """Whether two calls of a samples function gave one argument the same value: equal numbers (NaN equals NaN),
    sequences of equal items, tensors of one shape and, unless floating (data a seed draws), of equal dtype and
    values (a list of offsets)."""
    import torch

    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return _same_tensor(first, second)
    if isinstance(first, (list, tuple)) or isinstance(second, (list, tuple)):
        return (
            type(first) is type(second)
            and len(first) == len(second)
            and all(same_value(a, b) for a, b in zip(first, second))
        )
    if isinstance(first, float) and isinstance(second, float) and math.isnan(first) and math.isnan(second):
        return True
    return type(first) is type(second) and bool(first == second)


def _same_tensor(first: object, second: object) -> bool:
    import torch

    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)) or first.shape != second.shape:
        return False
    if first.is_floating_point() or first.is_complex():
        return second.is_floating_point() or second.is_complex()
    return first.dtype == second.dtype and torch.equal(first.cpu(), second.cpu())


def call_samples(
    spec: OpSpec, make: Callable[..., Any], dtype: torch.dtype, device: str, generator: torch.Generator
) -> list[dict[str, Any]]:
    """The samples `make` returns, each a dict by argument name."""
    assert spec.samples is not None
    given = {"file": str(spec.samples.file)} if spec.samples.file is not None else {}
    drawn = list(make(dtype=dtype, device=device, generator=generator, **given))
    for index, one in enumerate(drawn):
        if not isinstance(one, dict):
            raise ValueError(
                f"samples: {spec.samples.ref} item {index}: expected a dict of argument name to value, got "
                f"{type(one).__name__}. Yield one dict per case."
            )
    return drawn


def fill_values(spec: OpSpec, case: Case, values64: dict[str, torch.Tensor], generator: torch.Generator) -> None:
    """Rewrite the sampled values by the case's `fill`, rounded to each input's dtype again:

    - `equal` (one value everywhere), `integers` (rounded: ties), `ends` (each value the range's low or high),
      `sorted`, `reversed` (descending), `huge` (magnitudes near the square root of the dtype's largest, so squares
      stay finite), `tiny` (near its smallest normal): every input the spec samples (not generator- or sample-made);
    - `NAME=one:S@P` (special value S at flat position P, modulo the size), `NAME=row:S@R` (all of row R of the
      last dim, modulo the rows), `NAME=all:S`: input NAME only; S one of nan, inf, -inf, 0, -0.
    Non-floating inputs keep their values."""
    import torch

    name, _, rule = case.fill.rpartition("=")
    kind, _, argument = rule.partition(":")
    entries = {t.name: t for t in spec.tensor_inputs()}
    targets = [name] if name else [t.name for t in entries.values() if t.generator is None and not case.sample]
    for target in (t for t in targets if t in values64):  # an optional input a sample leaves None takes no fill
        entry = entries[target]
        dtype = _torch_dtype(entry.dtype or case.dtype)
        values = values64[target]
        if not dtype.is_floating_point or values.numel() == 0:
            continue
        if kind in SPECIAL_FILLS:
            values = _with_special(values, kind, argument)
        else:
            values = _refilled(values, kind, entry.low, entry.high, dtype, generator)
        values64[target] = values.to(dtype).to(torch.float64)


def _with_special(values: torch.Tensor, kind: str, argument: str) -> torch.Tensor:
    special, _, where = argument.partition("@")
    value = FILL_SPECIALS[special]
    out = values.clone()
    if kind == "all":
        return out.fill_(value)
    index = int(where or 0)
    if kind == "one":
        out.view(-1)[index % out.numel()] = value
        return out
    rows = out.reshape(-1, out.shape[-1] if out.dim() else 1)
    rows[index % rows.shape[0]] = value
    return rows.reshape(out.shape)


def _refilled(
    values: torch.Tensor, kind: str, low: float, high: float, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    import torch

    if kind == "equal":
        return torch.full_like(values, values.view(-1)[0].item())
    if kind == "integers":
        return values.round()
    if kind == "ends":
        pick = torch.randint(0, 2, values.shape, generator=generator).bool()
        return torch.where(pick, torch.full_like(values, high), torch.full_like(values, low))
    if kind == "sorted":
        return values.reshape(-1).sort().values.reshape(values.shape)
    if kind == "reversed":
        return values.reshape(-1).sort(descending=True).values.reshape(values.shape)
    info = torch.finfo(dtype)
    scale = math.sqrt(info.max) if kind == "huge" else info.tiny * 16
    return torch.rand(values.shape, generator=generator, dtype=torch.float64).mul(2).sub(1).mul(scale)


def _apply_avoid(t: TensorInput, avoid: Avoid, values64: dict[str, torch.Tensor], case_dtype: str) -> None:
    """Move values closer than `margin` to an avoided point out to 1.5 margins (rounded to the dtype again)."""
    import torch

    dtype = _torch_dtype(t.dtype or case_dtype)
    this = values64[t.name]
    other = values64[avoid.relative_to] if avoid.relative_to else torch.zeros(())
    shape = torch.broadcast_shapes(this.shape, other.shape)
    if this.shape == shape:
        moved, adjusted, base, sign = t.name, this.clone(), other.expand(shape), 1.0
    elif other.shape == shape and avoid.relative_to:
        moved, adjusted, base, sign = avoid.relative_to, other.clone(), this.expand(shape), -1.0
    else:
        raise ValueError(
            f"avoid.relative_to needs {t.name} or {avoid.relative_to} to have the broadcast shape "
            f"{tuple(shape)}, got {tuple(this.shape)} and {tuple(other.shape)}"
        )
    for point in avoid.values:
        diff = sign * (adjusted - base) - point
        near = diff.abs() < avoid.margin
        pushed = base + sign * (point + torch.where(diff < 0, -1.5, 1.5) * avoid.margin)
        adjusted = torch.where(near, pushed, adjusted)
    values64[moved] = adjusted.to(dtype).to(torch.float64)


def in_layout(values64: torch.Tensor, layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor holding `values64` (cast to dtype) with the case's memory layout."""
    import torch

    shape = tuple(values64.shape)
    kind = layout_kind(layout)
    if kind == "transposed":
        first, second = transposed_dims(layout, len(shape))
        swapped = list(shape)
        swapped[first], swapped[second] = shape[second], shape[first]
        view = torch.empty(swapped, dtype=dtype, device=device).transpose(first, second)
    elif kind == "strided":
        storage = torch.empty(*shape[:-1], 2 * shape[-1], dtype=dtype, device=device)
        view = storage[..., ::2]
    elif kind == "channels_last":
        view = torch.empty(shape, dtype=dtype, device=device, memory_format=torch.channels_last)
    elif kind == "offset":
        offset = offset_of(layout)
        storage = torch.empty(math.prod(shape) + offset, dtype=dtype, device=device)
        view = storage[offset:].view(shape)
    elif kind == "expanded":
        # Dim 0 of stride 0: every index along it reads the same memory (its values were made alike).
        return torch.empty(1, *shape[1:], dtype=dtype, device=device).copy_(values64[:1]).expand(shape)
    else:
        view = torch.empty(shape, dtype=dtype, device=device)
    return view.copy_(values64)
