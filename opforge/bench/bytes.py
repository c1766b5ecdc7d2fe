"""The bytes one call moves, what GB/s and % of peak divide by: the spec's `bench.bytes` expression for the mode
(opforge.spec.bytes_expr), else each input read once and each output written once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from opforge.building.op import LoadedOp
from opforge.cases.arguments import CaseInputs
from opforge.checks.op_and_reference import argument, op_outputs, output_names
from opforge.core.errors import SpecError
from opforge.spec import bytes_expr as expr
from opforge.spec.model import BenchSpec, OpSpec

if TYPE_CHECKING:
    pass


def bytes_moved(loaded: LoadedOp, mode: str, inputs: CaseInputs) -> int | None:
    """Bytes one call moves: the spec's `bench.bytes` expression for the mode, else the default count.

    Default: fwd reads every tensor input once (a mutated argument too) and writes every output that is not an
    alias of an argument, and every mutated argument, once; bwd reads each floating output's gradient and every
    tensor input once and writes each differentiated input's gradient once; fwd+bwd is the sum. None when the op's
    outputs cannot be known (its call raised: its result says why). Raises SpecError for an expression this point
    cannot evaluate. An op that mutates an argument changes `inputs`: pass a set no contender uses.
    """
    sizes = _sizes(loaded, inputs, with_gradients=mode != "fwd")
    if sizes is None:
        return None
    expressions = dict(loaded.spec.bench.bytes) if loaded.spec.bench else {}
    parts = ("fwd", "bwd") if mode == "fwd+bwd" and mode not in expressions else (mode,)
    return sum(
        _evaluate(loaded.spec, part, expressions[part], sizes)
        if part in expressions
        else _default_bytes(loaded, part, sizes)
        for part in parts
    )


def _default_bytes(loaded: LoadedOp, mode: str, sizes: dict[str, Any]) -> int:
    def tensors(names: Iterable[str]) -> list[expr.TensorSize]:
        return [sizes[n] for n in names if isinstance(sizes.get(n), expr.TensorSize)]

    read = tensors(_input_names(loaded))
    if mode == "fwd":
        return sum(t.nbytes for t in read + tensors(_written_outputs(loaded)) + tensors(loaded.mutated_arguments))
    gradients = tensors(f"grad_{n}" for n in _output_names(loaded) + _input_names(loaded))
    return sum(t.nbytes for t in read + gradients)


def _sizes(loaded: LoadedOp, inputs: CaseInputs, with_gradients: bool) -> dict[str, Any] | None:
    """The names an expression can use, bound to TensorSize (tensors) or values (scalars); grad_<output> (floating
    outputs) and grad_<input> (inputs with requires_grad), the same sizes, for the modes that run a backward."""
    import torch

    names = _input_names(loaded)
    values = {n: _size_of(argument(inputs, loaded, n)) for n in names}
    try:
        with torch.no_grad():
            returned = loaded.overload(*inputs.args, **inputs.kwargs)
    except Exception:
        return None
    for name, value in zip(_output_names(loaded), op_outputs(loaded, returned)):
        values[name] = _size_of(value)
        if with_gradients and isinstance(values[name], expr.TensorSize) and values[name].floating:
            values[f"grad_{name}"] = values[name]
    for name in inputs.tensor_names if with_gradients else ():
        if isinstance(values.get(name), expr.TensorSize) and argument(inputs, loaded, name).requires_grad:
            values[f"grad_{name}"] = values[name]
    return values


def _size_of(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return expr.TensorSize(
            tuple(value.shape), value.element_size(), value.is_floating_point() or value.is_complex()
        )
    return value


def _input_names(loaded: LoadedOp) -> list[str]:
    return [i.name for i in loaded.spec.inputs]


def _output_names(loaded: LoadedOp) -> list[str]:
    return output_names(loaded)


def _written_outputs(loaded: LoadedOp) -> list[str]:
    """Outputs a call writes: not those the schema declares as an alias of an argument (`-> Tensor(a!)`), which
    are the mutated argument itself, counted once as that."""
    returns = loaded.overload._schema.returns
    return [name for name, r in zip(_output_names(loaded), returns) if r.alias_info is None]


def _evaluate(spec: OpSpec, mode: str, text: str, sizes: dict[str, Any]) -> int:
    bench = spec.bench or BenchSpec()
    key = dict(bench.keys).get(mode, f"bench.bytes.{mode}")
    line = dict(bench.lines).get(mode)
    try:
        value = expr.evaluate(expr.parse(text, set(sizes)), sizes)
    except (ValueError, ArithmeticError) as exc:  # ExpressionError is a ValueError; so is math.ceil(nan)
        raise SpecError(
            spec.path,
            line,
            key,
            "an expression this point can evaluate",
            str(exc),
            "Use the names listed (see docs/specs.md, `bench.bytes`).",
        ) from None
    if value < 0:
        raise SpecError(spec.path, line, key, "a number of bytes >= 0", repr(value), "Fix the expression.")
    return int(value)
