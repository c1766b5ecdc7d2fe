"""The spec's `bench.bytes` expressions: bytes moved per call, as arithmetic over the op's tensors.

An expression is parsed with `ast` and checked against a small whitelist (numbers, names, + - * / // % **, the
tensor attributes below, and a few functions); it is evaluated by walking that tree, never by `eval`. Nothing here
imports torch, so a malformed expression is a spec error at load time.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What an expression may ask of a tensor, as `x.numel`, `x.numel()` or `numel(x)`.
TENSOR_ATTRIBUTES = ("numel", "element_size", "nbytes", "ndim")
FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor}
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
# Keeps `2 ** 10 ** 10` from hanging the loader; byte counts need no more than 2**63.
MAX_EXPONENT = 64
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ExpressionError(ValueError):
    """What is wrong with an expression, phrased to follow "expected a bytes expression, got ...: "."""


@dataclass(frozen=True)
class TensorSize:
    """The sizes of one tensor an expression can use; built from a real tensor by `opforge.bench.runner`."""

    shape: tuple[int, ...]
    element_size: int
    floating: bool = True  # only floating tensors have gradients

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size

    @property
    def ndim(self) -> int:
        return len(self.shape)


def parse(text: str, names: set[str]) -> ast.Expression:
    """The checked tree of `text`; raises ExpressionError naming the first thing outside the whitelist."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"a syntax error ({exc.msg}) in {text!r}") from None
    for node in ast.walk(tree):
        _check_node(node, names)
    return tree


def _check_node(node: ast.AST, names: set[str]) -> None:
    # Operator nodes (ast.Add, ...) are visited on their own by ast.walk after their BinOp/UnaryOp.
    if (
        isinstance(node, (ast.Expression, ast.Load, ast.BinOp, ast.UnaryOp))
        or type(node) in _BINARY
        or type(node) in _UNARY
    ):
        return
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"the constant {node.value!r}: only numbers are allowed")
        return
    if isinstance(node, ast.Name):
        if node.id not in names and node.id not in FUNCTIONS and node.id not in TENSOR_ATTRIBUTES:
            raise ExpressionError(f"the unknown name {node.id!r}: use one of {', '.join(sorted(names))}")
        return
    if isinstance(node, ast.Attribute):
        if not isinstance(node.value, ast.Name) or node.attr not in TENSOR_ATTRIBUTES:
            raise ExpressionError(f"the attribute .{node.attr}: only <tensor>.{'/.'.join(TENSOR_ATTRIBUTES)}")
        return
    if isinstance(node, ast.Call):
        _check_call(node)
        return
    raise ExpressionError(
        f"a {type(node).__name__} expression: only numbers, names, arithmetic, "
        f"<tensor>.{'/.'.join(TENSOR_ATTRIBUTES)} and {', '.join(FUNCTIONS)}() are allowed"
    )


def _check_call(node: ast.Call) -> None:
    if node.keywords:
        raise ExpressionError("a call with keyword arguments")
    func = node.func
    if isinstance(func, ast.Attribute):  # x.numel()
        if not isinstance(func.value, ast.Name) or func.attr not in TENSOR_ATTRIBUTES:
            raise ExpressionError(f"the attribute .{func.attr}: only <tensor>.{'/.'.join(TENSOR_ATTRIBUTES)}")
        if node.args:
            raise ExpressionError(f"arguments to .{func.attr}()")
        return
    if isinstance(func, ast.Name) and func.id in TENSOR_ATTRIBUTES:
        if len(node.args) != 1:
            raise ExpressionError(f"{func.id}() with {len(node.args)} arguments: it takes one tensor")
        return
    if isinstance(func, ast.Name) and func.id in FUNCTIONS:
        return
    raise ExpressionError(f"a call of {ast.unparse(func)}: only {', '.join(TENSOR_ATTRIBUTES + tuple(FUNCTIONS))}")


def evaluate(tree: ast.Expression, values: dict[str, Any]) -> float:
    """The value of a checked tree with `values` bound (TensorSize for tensors, numbers for scalars): a finite
    number."""
    value = _number(tree.body, values)
    if not math.isfinite(value):
        raise ExpressionError(f"{ast.unparse(tree.body)}, which is {value}: not a finite number")
    return value


def _eval(node: ast.AST, values: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ExpressionError(
                f"{node.id!r}, which this benchmark mode does not have (it has {', '.join(sorted(values))})"
            )
        return values[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _number(node.left, values), _number(node.right, values)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ExpressionError(f"an exponent of {right}: at most {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_number(node.operand, values))
    if isinstance(node, ast.Attribute):
        return _attribute(_eval(node.value, values), node.attr)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            return _eval(node.func, values)
        name = node.func.id if isinstance(node.func, ast.Name) else ""  # parse() allows no other callee
        if name in TENSOR_ATTRIBUTES:
            return _attribute(_eval(node.args[0], values), name)
        args = [_number(a, values) for a in node.args]
        if not args:
            raise ExpressionError(f"{name}() without arguments")
        return FUNCTIONS[name](*args)
    raise ExpressionError(f"a {type(node).__name__} expression")  # parse() let nothing else through


def _number(node: ast.AST, values: dict[str, Any]) -> int | float:
    """An operand of arithmetic or of min/max/ceil/floor: a number, never a tensor (whose size is ambiguous)."""
    value = _eval(node, values)
    if isinstance(value, TensorSize):
        name = ast.unparse(node)
        raise ExpressionError(f"{name} is a tensor: use {name}.nbytes or {name}.numel()")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExpressionError(f"{ast.unparse(node)}, which is {value!r}, not a number")
    return value


def _attribute(value: Any, name: str) -> int:
    if not isinstance(value, TensorSize):
        raise ExpressionError(f".{name} of a non-tensor ({value!r})")
    size: int = getattr(value, name)  # one of TENSOR_ATTRIBUTES: all ints
    return size
