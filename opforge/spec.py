"""Op specs: YAML files loaded into frozen, validated models.

A spec is parsed with PyYAML's safe composer so that every value keeps the line it came from; every error names
`file:line`, the key, what was expected, what was found, and what to do. Nothing here imports torch: `opforge list`
and spec errors stay instant.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opforge.errors import SpecError

SPEC_SUFFIXES = (".yaml", ".yml")

FLOATING_DTYPES = ("float32", "float64", "float16", "bfloat16")
OTHER_DTYPES = ("complex64", "complex128", "int8", "int16", "int32", "int64", "uint8", "bool")
KNOWN_DTYPES = FLOATING_DTYPES + OTHER_DTYPES
KNOWN_DEVICES = ("cpu", "cuda")
KNOWN_LAYOUTS = ("contiguous", "noncontiguous", "channels_last")

# Checks a spec may name. Kept here (not imported from opforge.checks) so validating a spec never imports torch.
# `opcheck` expands into one result per torch.library.opcheck sub-test.
KNOWN_CHECKS = (
    "correctness",
    "devices",
    "determinism",
    "special_values",
    "opcheck",
    "gradcheck",
    "gradgradcheck",
    "grad_lowp",
    "compile",
    "dtypes",
    "error_inputs",
    "vmap",
    "memory",
    "stream",
    "large_index",
    "multi_gpu",
)
# Checks that apply only when the spec claims what they test under a key of the same name (`vmap: true`, an
# `error_inputs` list, `large_index`).
CLAIMED_CHECKS = ("vmap", "error_inputs", "large_index")
# int32 indexing breaks past this many elements: a large_index shape must exceed it.
INT32_INDEX_LIMIT = 2**31
OPCHECK_SUBTESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_QUALNAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")


# --------------------------------------------------------------------------------------------------- the models


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Avoid:
    """Keep sampled values at least `margin` away from each of `values` (a kink, a pole, a branch cut).

    With `relative_to`, the distance is measured on `this - other`, for kinks of a difference such as custom_loss's
    `pred - target`.
    """

    values: tuple[float, ...]
    margin: float
    relative_to: str | None = None


@dataclass(frozen=True)
class TensorInput:
    name: str
    shapes: tuple[tuple[int, ...], ...]
    low: float
    high: float
    requires_grad: bool
    avoid: Avoid | None = None
    # A fixed dtype (an index tensor, a mask) instead of the dtype under test.
    dtype: str | None = None

    is_tensor = True


@dataclass(frozen=True)
class ScalarInput:
    name: str
    values: tuple[Any, ...]

    is_tensor = False


Input = TensorInput | ScalarInput


@dataclass(frozen=True)
class ErrorTensor:
    """One tensor argument of an invalid call; what is left out comes from the spec's first case."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class ErrorInput:
    """An invalid call and the error it must raise: an exception class named in Python's builtins, whose message
    contains `match` (a plain substring)."""

    description: str
    tensors: tuple[ErrorTensor, ...]
    values: tuple[tuple[str, Any], ...]
    error: str
    match: str

    @property
    def label(self) -> str:
        return re.sub(r"\W+", "_", self.description.strip().lower()).strip("_")


@dataclass(frozen=True)
class LargeIndex:
    """Shapes past 2^31 elements for the large_index check (an elementwise op is assumed: output element i depends
    on element i of each input). It costs GBs, so it runs only with `enabled: true` or `opforge check --large`."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str = "float16"
    enabled: bool = False


@dataclass(frozen=True)
class XFail:
    """A known failure. Strict (the default): a case that passes anyway is XPASS and fails the run, so stale
    entries get noticed. Non-strict: for failures that depend on the sampled values, a pass is just a pass."""

    check: str
    reason: str
    implementation: str | None = None
    dtype: str | None = None
    device: str | None = None
    strict: bool = True

    def matches(self, implementation: str, check: str, dtype: str, device: str) -> bool:
        base = check.split(":", 1)[0]
        return (
            self.check in (check, base)
            and (self.implementation is None or self.implementation == implementation)
            and (self.dtype is None or self.dtype == dtype)
            and (self.device is None or self.device == device)
        )


BENCH_MODES = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class BenchSpec:
    """What `opforge bench` times. Empty fields take defaults from the rest of the spec (see opforge.bench.runner).

    `sizes` gives every tensor input the 1-D shape (n,); `shapes` gives each tensor input its own shapes, paired by
    position like `inputs`. `bytes` maps a mode to an expression of the bytes one call moves (opforge.bench.expr).
    """

    sizes: tuple[int, ...] = ()
    shapes: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    bytes: tuple[tuple[str, str], ...] = ()
    # Line and key (`bench.bytes` or `bench.bytes.<mode>`) of each `bench.bytes` expression, for errors found when
    # it is evaluated.
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    keys: tuple[tuple[str, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class OpSpec:
    path: Path
    op: str
    schema: str
    python_modules: tuple[str, ...]
    sources: tuple[Path, ...]
    implementations: tuple[tuple[str, str], ...]
    reference: str
    inputs: tuple[Input, ...]
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    layouts: tuple[str, ...]
    tolerances: tuple[tuple[str, Tolerance], ...]
    grad_tolerances: tuple[tuple[str, Tolerance], ...]
    checks: tuple[str, ...]
    xfail: tuple[XFail, ...]
    differentiable: bool
    double_backward: bool
    description: str = ""
    # Declares results that may differ run to run (atomics, sampling): the determinism check then does not apply.
    nondeterministic: bool = False
    # Claims that switch on the vmap, error_inputs and large_index checks.
    vmap: bool = False
    error_inputs: tuple[ErrorInput, ...] = ()
    large_index: LargeIndex | None = None
    # Seconds one check on one case may take before it is killed and reported TIMEOUT; None: the run's default.
    timeout: float | None = None
    # What `opforge bench` times; None when the spec has no `bench:` section.
    bench: BenchSpec | None = None
    # Line of each top-level key and of each input, for errors found after loading (schema mismatch, bad module).
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return self.op.split("::", 1)[1]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def line_of(self, key: str) -> int | None:
        return dict(self.lines).get(key)

    def error(self, key: str, expected: str, got: str, hint: str) -> SpecError:
        return SpecError(self.path, self.line_of(key), key, expected, got, hint)

    def tensor_inputs(self) -> tuple[TensorInput, ...]:
        return tuple(i for i in self.inputs if isinstance(i, TensorInput))

    def xfail_for(self, implementation: str, check: str, dtype: str, device: str) -> XFail | None:
        return next((x for x in self.xfail if x.matches(implementation, check, dtype, device)), None)

    @property
    def bench_modes(self) -> tuple[str, ...]:
        """The modes `opforge bench` can time: a backward needs a differentiable op and an input that requires
        grad."""
        return bench_modes(self.differentiable, self.inputs)


def bench_modes(differentiable: bool, inputs: tuple[Input, ...]) -> tuple[str, ...]:
    has_gradients = any(isinstance(i, TensorInput) and i.requires_grad for i in inputs)
    return BENCH_MODES if differentiable and has_gradients else ("fwd",)


# ---------------------------------------------------------------------------------------- YAML with line numbers


@dataclass
class _Node:
    value: Any  # dict[str, _Node] | list[_Node] | a scalar
    line: int


def _compose(path: Path, text: str) -> _Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(
            path, _error_line(exc, text), "", "valid YAML", problem, "Fix the YAML syntax at that line."
        ) from None
    except RecursionError:
        raise _too_deep(path) from None
    if root is None:
        raise SpecError(
            path, 1, "", "a YAML mapping of spec keys", "an empty file", "See docs/specs.md for an example."
        )
    try:
        return _to_node(path, root, frozenset())
    except RecursionError:
        raise _too_deep(path) from None


def _too_deep(path: Path) -> SpecError:
    return SpecError(path, 1, "", "a spec nested a few levels deep", "nesting too deep to read", "Flatten the YAML.")


def _error_line(exc: yaml.YAMLError, text: str) -> int:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return mark.line + 1
    # A reader error (a control character) carries only its offset in the text.
    position = getattr(exc, "position", None)
    return text[:position].count("\n") + 1 if isinstance(position, int) else 1


def _to_node(path: Path, node: yaml.Node, enclosing: frozenset[int]) -> _Node:
    line = node.start_mark.line + 1
    if id(node) in enclosing:
        raise SpecError(
            path,
            line,
            "",
            "plain data",
            "an alias (*name) inside the value it names",
            "Write the value out instead of referring to itself.",
        )
    enclosing = enclosing | {id(node)}
    if isinstance(node, yaml.MappingNode):
        out: dict[str, _Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(
                    path, key_node.start_mark.line + 1, "", "a plain key", "a complex key", "Use plain keys."
                )
            if key in out:
                raise SpecError(
                    path,
                    key_node.start_mark.line + 1,
                    key,
                    "each key once",
                    "a duplicate",
                    "Remove one of the two entries.",
                )
            out[key] = _to_node(path, value_node, enclosing)
        return _Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return _Node([_to_node(path, item, enclosing) for item in node.value], line)
    if node.tag not in _SAFE_SCALAR_TAGS:
        raise SpecError(
            path, line, "", "a plain YAML value", f"tag {node.tag}", "Remove the tag: specs are plain data."
        )
    try:
        return _Node(yaml.SafeLoader("").construct_object(node), line)
    except Exception:  # PyYAML's scalar constructors raise what they meet: ValueError for `2001-13-45` (a date),
        # IndexError for an empty `!!float`, AttributeError for an empty `!!timestamp`, YAMLError for bad base64
        kind = node.tag.rsplit(":", 1)[-1]
        raise SpecError(
            path, line, "", f"a valid {kind}", repr(node.value), "Fix the value, or quote it to make it a string."
        ) from None


_SAFE_SCALAR_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "timestamp", "binary")}


# ------------------------------------------------------------------------------------------------- validators


class _Reader:
    """Reads typed values out of a mapping node, naming `file:line` and the dotted key on every error."""

    def __init__(self, path: Path, node: _Node, prefix: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()):
        self.path = path
        self.node = node
        self.prefix = prefix
        if not isinstance(node.value, dict):
            raise self.fail(node, prefix or "spec", "a mapping", _describe(node.value), "Write `key: value` entries.")
        for key, child in node.value.items():
            if key not in allowed:
                raise self.fail(
                    child,
                    self._key(key),
                    f"one of {', '.join(allowed)}",
                    f"unknown key {key!r}",
                    _suggest(key, allowed),
                )
        for key in required:
            if key not in node.value:
                raise self.fail(node, self._key(key), f"a {key!r} entry", "none", f"Add `{key}:` (see docs/specs.md).")

    def _key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, node: _Node, key: str, expected: str, got: str, hint: str) -> SpecError:
        return SpecError(self.path, node.line, key, expected, got, hint)

    def has(self, key: str) -> bool:
        return key in self.node.value

    def child(self, key: str) -> _Node:
        return self.node.value[key]

    def line(self, key: str) -> int:
        return self.node.value[key].line if key in self.node.value else self.node.line

    def get(self, key: str, kind: Callable[[_Reader, str, _Node], Any], default: Any = None) -> Any:
        """The value of `key` read by `kind`; `default` when the key is absent, or null where a default exists."""
        if key not in self.node.value or (self.node.value[key].value is None and default is not None):
            return default
        return kind(self, self._key(key), self.node.value[key])


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def _suggest(key: str, allowed: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, allowed, n=1)
    return f"Did you mean {close[0]!r}?" if close else "Remove it or fix its spelling."


def _str(r: _Reader, key: str, node: _Node) -> str:
    if not isinstance(node.value, str) or not node.value.strip():
        raise r.fail(
            node, key, "a non-empty string", _describe(node.value), "Quote the value if YAML reads it otherwise."
        )
    return node.value


def _bool(r: _Reader, key: str, node: _Node) -> bool:
    if not isinstance(node.value, bool):
        raise r.fail(node, key, "true or false", _describe(node.value), "Write true or false.")
    return node.value


def _number(r: _Reader, key: str, node: _Node) -> float:
    value = node.value
    # YAML 1.1 reads `1e-3` (no dot) as a string; accept it, since that is how people write tolerances.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise r.fail(node, key, "a number", _describe(node.value), "Write a number such as 0.5 or 1.0e-3.")
    return float(value)


def _seconds(r: _Reader, key: str, node: _Node) -> float:
    value = _number(r, key, node)
    if not 0 < value < float("inf"):
        raise r.fail(node, key, "a number of seconds > 0", repr(value), "Write e.g. `timeout: 600`.")
    return value


def _list(item: Callable[[_Reader, str, _Node], Any], *, allow_empty: bool = False):
    def read(r: _Reader, key: str, node: _Node) -> tuple[Any, ...]:
        if not isinstance(node.value, list):
            raise r.fail(node, key, "a list", _describe(node.value), "Write a YAML list: [a, b] or one `- a` per line.")
        if not node.value and not allow_empty:
            raise r.fail(node, key, "a non-empty list", "an empty list", "List at least one entry or drop the key.")
        return tuple(item(r, f"{key}[{i}]", child) for i, child in enumerate(node.value))

    return read


def _one_of(choices: tuple[str, ...]):
    def read(r: _Reader, key: str, node: _Node) -> str:
        if node.value not in choices:
            raise r.fail(
                node, key, f"one of {', '.join(choices)}", _describe(node.value), _suggest(str(node.value), choices)
            )
        return node.value

    return read


def _callable_ref(r: _Reader, key: str, node: _Node) -> str:
    value = _str(r, key, node)
    if not _CALLABLE.match(value):
        raise r.fail(node, key, "`module:function`", repr(value), "Write e.g. `my_pkg.ops:reference`.")
    return value


def _shape(r: _Reader, key: str, node: _Node) -> tuple[int, ...]:
    if not isinstance(node.value, list) or not all(
        isinstance(d.value, int) and not isinstance(d.value, bool) and d.value >= 0 for d in node.value
    ):
        raise r.fail(
            node,
            key,
            "a shape: a list of sizes >= 0 such as [33, 65] or [] for 0-d",
            _describe(node.value),
            "Write each shape as a list of non-negative integers.",
        )
    return tuple(d.value for d in node.value)


def _scalar_value(r: _Reader, key: str, node: _Node) -> Any:
    if isinstance(node.value, (dict, list)):
        raise r.fail(
            node,
            key,
            "a scalar value (number, bool, string, null)",
            _describe(node.value),
            "List each value the argument should take.",
        )
    return node.value


def _tolerance(r: _Reader, key: str, node: _Node) -> Tolerance:
    t = _Reader(r.path, node, key, ("atol", "rtol"), required=("atol", "rtol"))
    return Tolerance(atol=t.get("atol", _number), rtol=t.get("rtol", _number))


def _tolerances(r: _Reader, key: str, node: _Node) -> tuple[tuple[str, Tolerance], ...]:
    t = _Reader(r.path, node, key, KNOWN_DTYPES)
    return tuple((dtype, t.get(dtype, _tolerance)) for dtype in node.value)


def _avoid(r: _Reader, key: str, node: _Node) -> Avoid:
    a = _Reader(r.path, node, key, ("values", "margin", "relative_to"), required=("values", "margin"))
    margin = a.get("margin", _number)
    if margin <= 0:
        raise a.fail(a.child("margin"), f"{key}.margin", "a margin > 0", repr(margin), "Use a small positive margin.")
    return Avoid(values=a.get("values", _list(_number)), margin=margin, relative_to=a.get("relative_to", _str))


def _xfail(r: _Reader, key: str, node: _Node) -> XFail:
    x = _Reader(
        r.path,
        node,
        key,
        ("check", "implementation", "dtype", "device", "reason", "strict"),
        required=("check", "reason"),
    )
    check = x.get("check", _str)
    if check.split(":", 1)[0] not in KNOWN_CHECKS or (":" in check and check.split(":", 1)[1] not in OPCHECK_SUBTESTS):
        raise x.fail(
            x.child("check"),
            f"{key}.check",
            f"one of {', '.join(KNOWN_CHECKS)} (or opcheck:<sub-test>)",
            repr(check),
            _suggest(check, KNOWN_CHECKS),
        )
    return XFail(
        check=check,
        reason=x.get("reason", _str),
        implementation=x.get("implementation", _str),
        dtype=x.get("dtype", _one_of(KNOWN_DTYPES)),
        device=x.get("device", _one_of(KNOWN_DEVICES)),
        strict=x.get("strict", _bool, True),
    )


_INPUT_KEYS = ("shapes", "low", "high", "avoid", "requires_grad", "dtype", "values")


def _input(r: _Reader, name: str, node: _Node) -> Input:
    key = f"inputs.{name}"
    i = _Reader(r.path, node, key, _INPUT_KEYS)
    if i.has("values") == i.has("shapes"):
        raise i.fail(
            node,
            key,
            "either `shapes:` (a tensor) or `values:` (a non-tensor)",
            "both" if i.has("values") else "neither",
            "Give tensors `shapes:` and scalars `values:`.",
        )
    if i.has("values"):
        extra = [k for k in node.value if k != "values"]
        if extra:
            raise i.fail(
                i.child(extra[0]),
                f"{key}.{extra[0]}",
                "only `values:` for a non-tensor input",
                repr(extra[0]),
                "Remove it: tensor options apply to tensor inputs only.",
            )
        return ScalarInput(name=name, values=i.get("values", _list(_scalar_value)))
    low, high = i.get("low", _number, -1.0), i.get("high", _number, 1.0)
    if not low < high:
        raise i.fail(
            i.child("high") if i.has("high") else node,
            f"{key}.high",
            f"high > low ({low})",
            repr(high),
            "Give a non-empty value range.",
        )
    return TensorInput(
        name=name,
        shapes=i.get("shapes", _list(_shape)),
        low=low,
        high=high,
        requires_grad=i.get("requires_grad", _bool, False),
        avoid=i.get("avoid", _avoid),
        dtype=i.get("dtype", _one_of(KNOWN_DTYPES)),
    )


def _inputs(r: _Reader, key: str, node: _Node) -> tuple[Input, ...]:
    if not isinstance(node.value, dict) or not node.value:
        raise r.fail(
            node,
            key,
            "a mapping of argument name to its inputs",
            _describe(node.value),
            "Add one entry per schema argument, e.g. `x: {shapes: [[7]]}`.",
        )
    inputs = tuple(_input(r, name, child) for name, child in node.value.items())
    _check_paired_shapes(r, node, inputs)
    _check_avoid_targets(r, node, inputs)
    return inputs


def _check_paired_shapes(r: _Reader, node: _Node, inputs: tuple[Input, ...]) -> None:
    tensors = [i for i in inputs if isinstance(i, TensorInput)]
    counts = {len(t.shapes) for t in tensors}
    if len(counts) > 1:
        listing = ", ".join(f"{t.name}: {len(t.shapes)}" for t in tensors)
        raise r.fail(
            node,
            "inputs",
            "the same number of shapes for every tensor input (case i pairs the i-th shapes)",
            listing,
            "Give each tensor input one shape per case.",
        )


def _check_avoid_targets(r: _Reader, node: _Node, inputs: tuple[Input, ...]) -> None:
    tensor_names = {i.name for i in inputs if isinstance(i, TensorInput)}
    for i in inputs:
        if isinstance(i, TensorInput) and i.avoid and i.avoid.relative_to:
            if i.avoid.relative_to not in tensor_names - {i.name}:
                raise r.fail(
                    node.value[i.name],
                    f"inputs.{i.name}.avoid.relative_to",
                    f"another tensor input ({', '.join(sorted(tensor_names - {i.name})) or 'none'})",
                    repr(i.avoid.relative_to),
                    "Name the tensor whose difference has the kink.",
                )


_LOAD_KEYS = ("python", "sources")
_TOP_KEYS = (
    "op",
    "schema",
    "description",
    "load",
    "implementations",
    "reference",
    "inputs",
    "dtypes",
    "devices",
    "layouts",
    "tolerances",
    "grad_tolerances",
    "checks",
    "xfail",
    "differentiable",
    "double_backward",
    "nondeterministic",
    "vmap",
    "error_inputs",
    "large_index",
    "timeout",
    "bench",
)
_REQUIRED = ("op", "schema", "load", "reference", "inputs", "dtypes")


def load_spec(path: Path | str) -> OpSpec:
    """Parse and validate one spec file. Raises SpecError naming file:line for anything wrong."""
    path = Path(path).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            path,
            None,
            "",
            "a readable spec file",
            exc.strerror or str(exc),
            "Check the path; `opforge list` shows the bundled specs.",
        ) from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise SpecError(
            path,
            line,
            "",
            "UTF-8 text",
            f"byte {exc.object[exc.start]:#04x} that is not UTF-8",
            "Save the spec as UTF-8.",
        ) from None
    root = _compose(path, text)
    r = _Reader(path, root, "", _TOP_KEYS, required=_REQUIRED)

    op = r.get("op", _str)
    if not _QUALNAME.match(op):
        raise r.fail(
            r.child("op"), "op", "a qualified name `namespace::name`", repr(op), "Write e.g. `opforge::leaky_swish`."
        )
    load = _Reader(path, r.child("load"), "load", _LOAD_KEYS)
    python_modules = load.get("python", _list(_str, allow_empty=True), ())
    sources = _sources(load, path) if load.has("sources") else ()
    if not python_modules and not sources:
        raise r.fail(
            r.child("load"),
            "load",
            "`python:` modules or `sources:` files that register the op",
            "neither",
            "List the module that defines the op or its C++ sources.",
        )
    checks = r.get("checks", _list(_one_of(KNOWN_CHECKS)), None)
    differentiable = r.get("differentiable", _bool, True)
    double_backward = r.get("double_backward", _bool, False)
    inputs = r.get("inputs", _inputs)
    dtypes = r.get("dtypes", _list(_one_of(KNOWN_DTYPES)))
    claims = {
        "vmap": r.get("vmap", _bool, False),
        "error_inputs": _error_inputs(r, inputs) if r.has("error_inputs") else (),
        "large_index": _large_index(r, inputs, dtypes) if r.has("large_index") else None,
    }
    if checks is None:
        checks = tuple(
            c
            for c in KNOWN_CHECKS
            if _applicable_by_default(c, differentiable, double_backward) and (c not in CLAIMED_CHECKS or claims[c])
        )
    _check_claims(r, checks, claims)
    implementations = r.get("implementations", _implementations, ())
    devices = r.get("devices", _list(_one_of(KNOWN_DEVICES)), ("cpu",))
    schema = r.get("schema", _str)
    lines = tuple((k, r.line(k)) for k in root.value) + tuple(
        (f"inputs.{name}", child.line) for name, child in r.child("inputs").value.items()
    )

    return OpSpec(
        path=path,
        op=op,
        schema=schema,
        description=r.get("description", _str, ""),
        python_modules=python_modules,
        sources=sources,
        implementations=implementations,
        reference=r.get("reference", _callable_ref),
        inputs=inputs,
        dtypes=dtypes,
        devices=devices,
        layouts=r.get("layouts", _list(_one_of(KNOWN_LAYOUTS)), ("contiguous",)),
        tolerances=r.get("tolerances", _tolerances, ()),
        grad_tolerances=r.get("grad_tolerances", _tolerances, ()),
        checks=checks,
        xfail=_xfails(r, implementations),
        differentiable=differentiable,
        double_backward=double_backward,
        nondeterministic=r.get("nondeterministic", _bool, False),
        vmap=claims["vmap"],
        error_inputs=claims["error_inputs"],
        large_index=claims["large_index"],
        timeout=r.get("timeout", _seconds),
        bench=_bench_section(r, inputs, schema, bench_modes(differentiable, inputs), dtypes, devices),
        lines=lines,
    )


def _check_claims(r: _Reader, checks: tuple[str, ...], claims: dict[str, Any]) -> None:
    for check in CLAIMED_CHECKS:
        if check in checks and not claims[check]:
            raise r.fail(
                r.child("checks"),
                "checks",
                f"a `{check}:` entry for check {check!r}",
                "none",
                f"Add `{check}:` (see docs/checks.md) or drop {check} from checks.",
            )


# ----------------------------------------------------------------------------------------------- error_inputs


_ERROR_INPUT_KEYS = ("description", "inputs", "error", "match")


def _error_inputs(r: _Reader, inputs: tuple[Input, ...]) -> tuple[ErrorInput, ...]:
    entries = r.get("error_inputs", _list(lambda rr, k, n: _error_input(rr, k, n, inputs)))
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.label in seen:
            raise r.fail(
                r.child("error_inputs").value[i],
                f"error_inputs[{i}].description",
                "a description unlike the others (it names the result row)",
                f"the same as error_inputs[{seen[entry.label]}]",
                "Describe each invalid call differently.",
            )
        seen[entry.label] = i
    return entries


def _error_input(r: _Reader, key: str, node: _Node, inputs: tuple[Input, ...]) -> ErrorInput:
    e = _Reader(r.path, node, key, _ERROR_INPUT_KEYS, required=("description", "inputs", "error", "match"))
    error = e.get("error", _str)
    if not _is_builtin_exception(error):
        raise e.fail(
            e.child("error"),
            f"{key}.error",
            "the name of a Python built-in exception class (an Exception subclass)",
            repr(error),
            "Write e.g. RuntimeError (torch's TORCH_CHECK raises RuntimeError, or a subclass "
            "such as ValueError/TypeError/IndexError for TORCH_CHECK_VALUE/_TYPE/_INDEX).",
        )
    args = e.child("inputs")
    if not isinstance(args.value, dict) or not args.value:
        raise e.fail(
            args,
            f"{key}.inputs",
            "a mapping of argument name to what differs from a valid call",
            _describe(args.value),
            "Write e.g. `inputs: {x: {dtype: int32}}`.",
        )
    given = {i.name: i for i in inputs}
    tensors, values = [], []
    for name, child in args.value.items():
        entry = given.get(name)
        if entry is None:
            raise e.fail(
                child,
                f"{key}.inputs.{name}",
                f"one of the spec's inputs ({', '.join(given)})",
                repr(name),
                "Name an argument listed under `inputs:`.",
            )
        if isinstance(entry, TensorInput):
            tensors.append(_error_tensor(e, f"{key}.inputs.{name}", name, child))
        else:
            v = _Reader(r.path, child, f"{key}.inputs.{name}", ("value",), required=("value",))
            values.append((name, _scalar_value(v, f"{key}.inputs.{name}.value", v.child("value"))))
    return ErrorInput(
        description=e.get("description", _str),
        tensors=tuple(tensors),
        values=tuple(values),
        error=error,
        match=e.get("match", _str),
    )


def _error_tensor(r: _Reader, key: str, name: str, node: _Node) -> ErrorTensor:
    t = _Reader(r.path, node, key, ("shape", "dtype", "device"))
    return ErrorTensor(
        name=name,
        shape=t.get("shape", _shape),
        dtype=t.get("dtype", _one_of(KNOWN_DTYPES)),
        device=t.get("device", _one_of(KNOWN_DEVICES)),
    )


def _is_builtin_exception(name: str) -> bool:
    """A built-in Exception subclass: the check catches Exception, so SystemExit or KeyboardInterrupt (BaseException
    only) would escape it."""
    import builtins

    cls = getattr(builtins, name, None)
    return isinstance(cls, type) and issubclass(cls, Exception)


# ------------------------------------------------------------------------------------------------ large_index


def _large_index(r: _Reader, inputs: tuple[Input, ...], dtypes: tuple[str, ...]) -> LargeIndex:
    node = r.child("large_index")
    g = _Reader(r.path, node, "large_index", ("shapes", "dtype", "enabled"), required=("shapes",))
    dtype = g.get("dtype", _one_of(KNOWN_DTYPES), "float16")
    if dtype not in dtypes:
        raise g.fail(
            g.child("dtype") if g.has("dtype") else node,
            "large_index.dtype",
            f"one of the spec's dtypes ({', '.join(dtypes)})",
            repr(dtype),
            "Pick a claimed dtype; the smallest (float16, bfloat16) needs the least memory.",
        )
    shapes_node = g.child("shapes")
    tensors = [i.name for i in inputs if isinstance(i, TensorInput)]
    s = _Reader(r.path, shapes_node, "large_index.shapes", tuple(tensors), required=tuple(tensors))
    shapes = tuple((name, s.get(name, _shape)) for name in tensors)
    if len({shape for _, shape in shapes}) != 1:
        raise s.fail(
            shapes_node,
            "large_index.shapes",
            "the same shape for every tensor input (the check compares "
            "element i of the output with element i of each input)",
            ", ".join(f"{n}: {list(sh)}" for n, sh in shapes),
            "Give every tensor input one shape.",
        )
    numel = math.prod(shapes[0][1])
    if numel <= INT32_INDEX_LIMIT:
        raise s.fail(
            shapes_node,
            "large_index.shapes",
            f"more than 2^31 = {INT32_INDEX_LIMIT} elements",
            f"{numel}",
            "Use e.g. [2147487747] (2^31 + 4099: past the limit, no multiple of a vector width).",
        )
    return LargeIndex(shapes=shapes, dtype=dtype, enabled=g.get("enabled", _bool, False))


def _xfails(r: _Reader, implementations: tuple[tuple[str, str], ...]) -> tuple[XFail, ...]:
    xfails = r.get("xfail", _list(_xfail, allow_empty=True), ())
    known = ("native",) + tuple(name for name, _ in implementations)
    for i, x in enumerate(xfails):
        if x.implementation is not None and x.implementation not in known:
            raise r.fail(
                r.child("xfail").value[i],
                f"xfail[{i}].implementation",
                f"one of {', '.join(known)}",
                repr(x.implementation),
                "Name the op (native) or one of the spec's implementations.",
            )
    return xfails


def _applicable_by_default(check: str, differentiable: bool, double_backward: bool) -> bool:
    if check in ("gradcheck", "grad_lowp"):
        return differentiable
    if check == "gradgradcheck":
        return differentiable and double_backward
    return True


def _implementations(r: _Reader, key: str, node: _Node) -> tuple[tuple[str, str], ...]:
    if not isinstance(node.value, dict):
        raise r.fail(
            node,
            key,
            "a mapping of implementation name to `module:function`",
            _describe(node.value),
            "Write e.g. `prototype: my_pkg.ops:my_op_prototype`.",
        )
    return tuple((name, _callable_ref(r, f"{key}.{name}", child)) for name, child in node.value.items())


def _sources(load: _Reader, spec_path: Path) -> tuple[Path, ...]:
    node = load.child("sources")
    if not isinstance(node.value, list):
        raise load.fail(
            node,
            "load.sources",
            "a list of C++/CUDA files",
            _describe(node.value),
            "List the files relative to the spec.",
        )
    return tuple(_source_path(load, spec_path, i, item) for i, item in enumerate(node.value))


def _source_path(load: _Reader, spec_path: Path, index: int, item: _Node) -> Path:
    rel = _str(load, f"load.sources[{index}]", item)
    source = (spec_path.parent / rel).resolve()
    if source.suffix not in (".cpp", ".cc", ".cu"):
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "a .cpp, .cc or .cu file",
            repr(rel),
            "List translation units only; headers are found next to them.",
        )
    if not source.is_file():
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "an existing file (relative to the spec)",
            f"{source} is missing",
            "Fix the path; it is resolved against the spec's directory.",
        )
    return source


# ------------------------------------------------------------------------------------------------ bench section


_BENCH_KEYS = ("sizes", "shapes", "dtypes", "devices", "modes", "bytes")
POWER_OF_TWO = re.compile(r"^\s*2\s*(?:\*\*|\^)\s*(\d+)\s*$")


def _bench_section(
    r: _Reader,
    inputs: tuple[Input, ...],
    schema: str,
    claimed_modes: tuple[str, ...],
    dtypes: tuple[str, ...],
    devices: tuple[str, ...],
) -> BenchSpec | None:
    if not r.has("bench"):
        return None
    node = r.child("bench")
    b = _Reader(r.path, node, "bench", _BENCH_KEYS)
    tensors = tuple(i.name for i in inputs if isinstance(i, TensorInput))
    if not b.has("sizes") and not b.has("shapes"):
        raise b.fail(
            node,
            "bench",
            "`sizes:` (numel of every tensor input) or `shapes:` (per input)",
            "neither",
            "Add e.g. `sizes: [2**16, 2**20, 2**24]`.",
        )
    modes = b.get("modes", _list(_one_of(BENCH_MODES)), ())
    if any(m not in claimed_modes for m in modes):
        raise b.fail(
            b.child("modes"),
            "bench.modes",
            "only fwd for an op with differentiable: false or no input with requires_grad: true",
            ", ".join(modes),
            "Drop bwd and fwd+bwd, or declare the op differentiable and mark the "
            "inputs it differentiates with requires_grad: true.",
        )
    expressions, lines, keys = _bench_bytes(b, inputs, schema) if b.has("bytes") else ((), (), ())
    return BenchSpec(
        sizes=b.get("sizes", _list(_bench_size), ()),
        shapes=_bench_shapes(b, tensors) if b.has("shapes") else (),
        dtypes=_bench_claimed(b, "dtypes", KNOWN_DTYPES, dtypes),
        devices=_bench_claimed(b, "devices", KNOWN_DEVICES, devices),
        modes=modes,
        bytes=expressions,
        lines=lines,
        keys=keys,
    )


def _bench_claimed(b: _Reader, key: str, known: tuple[str, ...], claimed: tuple[str, ...]) -> tuple[str, ...]:
    """bench.dtypes / bench.devices: each must be one the spec claims, since the op is only checked on those."""
    values = b.get(key, _list(_one_of(known)), ())
    for index, value in enumerate(values):
        if value not in claimed:
            raise b.fail(
                b.child(key).value[index],
                f"bench.{key}[{index}]",
                f"one of the spec's {key} ({', '.join(claimed)})",
                repr(value),
                f"Add {value} to the spec's `{key}:` or drop it from `bench.{key}`.",
            )
    return values


def _bench_size(r: _Reader, key: str, node: _Node) -> int:
    value = node.value
    match = POWER_OF_TWO.match(value) if isinstance(value, str) else None
    if match:
        value = 2 ** int(match.group(1))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise r.fail(
            node, key, "a number of elements > 0, or 2**k", _describe(node.value), 'Write e.g. 65536 or "2**24".'
        )
    return value


def _bench_shapes(b: _Reader, tensors: tuple[str, ...]) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    node = b.child("shapes")
    s = _Reader(b.path, node, "bench.shapes", tensors, required=tensors)
    per_input = {name: s.get(name, _list(_shape)) for name in tensors}
    counts = {len(v) for v in per_input.values()}
    if len(counts) > 1:
        listing = ", ".join(f"{name}: {len(v)}" for name, v in per_input.items())
        raise b.fail(
            node,
            "bench.shapes",
            "the same number of shapes for every tensor input (paired by position)",
            listing,
            "Give each tensor input one shape per benchmark case.",
        )
    return tuple(tuple((name, per_input[name][i]) for name in tensors) for i in range(counts.pop()))


def _bench_bytes(b: _Reader, inputs: tuple[Input, ...], schema: str) -> tuple[tuple, tuple, tuple]:
    from opforge.bench.expr import ExpressionError, parse

    node = b.child("bytes")
    if isinstance(node.value, dict):
        m = _Reader(b.path, node, "bench.bytes", BENCH_MODES)
        items = [(mode, m.child(mode), f"bench.bytes.{mode}") for mode in node.value]
    else:
        items = [("fwd", node, "bench.bytes")]
    expressions, lines, keys = [], [], []
    for mode, child, key in items:
        text = _str(b, key, child)
        try:
            parse(text, bytes_names(inputs, schema, mode))
        except ExpressionError as exc:
            raise b.fail(
                child,
                key,
                "an arithmetic expression over the op's tensors (e.g. `2 * x.nbytes`)",
                str(exc),
                "See docs/specs.md, `bench.bytes`.",
            ) from None
        expressions.append((mode, text))
        lines.append((mode, child.line))
        keys.append((mode, key))
    return tuple(expressions), tuple(lines), tuple(keys)


def bytes_names(inputs: tuple[Input, ...], schema: str, mode: str) -> set[str]:
    """The names a `bench.bytes` expression of `mode` may use: the inputs and outputs; for a mode that runs a
    backward also grad_<output> and grad_<input> of each input with requires_grad."""
    from opforge.bench.expr import return_names

    outputs = return_names(schema)
    names = {i.name for i in inputs} | set(outputs)
    if mode != "fwd":
        names |= {f"grad_{n}" for n in outputs} | {
            f"grad_{i.name}" for i in inputs if isinstance(i, TensorInput) and i.requires_grad
        }
    return names


# ------------------------------------------------------------------------------------------------ finding specs


def bundled_specs_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "specs"


def find_spec(name_or_path: str, specs_dir: Path | None = None) -> Path:
    """A spec file path, or the name of a spec in the specs directory."""
    candidate = Path(name_or_path)
    if candidate.suffix in SPEC_SUFFIXES:
        return candidate
    specs_dir = specs_dir or bundled_specs_dir()
    for suffix in SPEC_SUFFIXES:
        path = specs_dir / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    from opforge.errors import UsageError

    known = ", ".join(p.stem for p in list_specs(specs_dir)) or "none"
    raise UsageError(
        f"op {name_or_path!r}",
        f"a spec name ({known}) or a path to a .yaml spec",
        repr(name_or_path),
        "Run `opforge list` to see the specs.",
    )


def list_specs(specs_dir: Path | None = None) -> list[Path]:
    specs_dir = specs_dir or bundled_specs_dir()
    return sorted(p for p in specs_dir.glob("*") if p.suffix in SPEC_SUFFIXES)
