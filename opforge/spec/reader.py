"""Reading a spec's YAML with the line every value came from, and the typed readers every spec section uses.

A spec is parsed with PyYAML's safe composer so that every value keeps its line; every error names `file:line`, the
key, what was expected, what was found, and what to do.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from opforge.core.errors import SpecError
from opforge.spec.model import KNOWN_DTYPES, Tolerance

T = TypeVar("T")

_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class Node:
    value: Any  # dict[str, Node] | list[Node] | a scalar
    line: int


def compose(path: Path, text: str) -> Node:
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
    mark: yaml.Mark | None = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return mark.line + 1
    # A reader error (a control character) carries only its offset in the text.
    position = getattr(exc, "position", None)
    return text[:position].count("\n") + 1 if isinstance(position, int) else 1


def _to_node(path: Path, node: yaml.Node, enclosing: frozenset[int]) -> Node:
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
        out: dict[str, Node] = {}
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
        return Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return Node([_to_node(path, item, enclosing) for item in node.value], line)
    if node.tag not in _SAFE_SCALAR_TAGS:
        raise SpecError(
            path, line, "", "a plain YAML value", f"tag {node.tag}", "Remove the tag: specs are plain data."
        )
    try:
        return Node(yaml.SafeLoader("").construct_object(node), line)
    except Exception:  # PyYAML's scalar constructors raise what they meet: ValueError for `2001-13-45` (a date),
        # IndexError for an empty `!!float`, AttributeError for an empty `!!timestamp`, YAMLError for bad base64
        kind = node.tag.rsplit(":", 1)[-1]
        raise SpecError(
            path, line, "", f"a valid {kind}", repr(node.value), "Fix the value, or quote it to make it a string."
        ) from None


_SAFE_SCALAR_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "timestamp", "binary")}


# ------------------------------------------------------------------------------------------------- validators


class Reader:
    """Reads typed values out of a mapping node, naming `file:line` and the dotted key on every error."""

    def __init__(self, path: Path, node: Node, prefix: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()):
        self.path = path
        self.node = node
        self.prefix = prefix
        if not isinstance(node.value, dict):
            raise self.fail(node, prefix or "spec", "a mapping", describe(node.value), "Write `key: value` entries.")
        for key, child in node.value.items():
            if key not in allowed:
                raise self.fail(
                    child,
                    self._key(key),
                    f"one of {', '.join(allowed)}",
                    f"unknown key {key!r}",
                    suggest(key, allowed),
                )
        for key in required:
            if key not in node.value:
                raise self.fail(node, self._key(key), f"a {key!r} entry", "none", f"Add `{key}:` (see docs/specs.md).")

    def _key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, node: Node, key: str, expected: str, got: str, hint: str) -> SpecError:
        return SpecError(self.path, node.line, key, expected, got, hint)

    def has(self, key: str) -> bool:
        return key in self.node.value

    def child(self, key: str) -> Node:
        child: Node = self.node.value[key]
        return child

    def line(self, key: str) -> int:
        return self.node.value[key].line if key in self.node.value else self.node.line

    def get(self, key: str, kind: Callable[[Reader, str, Node], Any], default: Any = None) -> Any:
        """The value of `key` read by `kind`; `default` when the key is absent, or null where a default exists."""
        if key not in self.node.value or (self.node.value[key].value is None and default is not None):
            return default
        return kind(self, self._key(key), self.node.value[key])


def check_implementation_names(
    r: Reader, key: str, named: tuple[str | None, ...], implementations: tuple[tuple[str, str], ...]
) -> None:
    """Each entry of the list under `key` that names an `implementation` (None: every one) names the op (native) or
    one of the spec's `implementations:`."""
    known = ("native",) + tuple(name for name, _ in implementations)
    for index, name in enumerate(named):
        if name is not None and name not in known:
            raise r.fail(
                r.child(key).value[index],
                f"{r._key(key)}[{index}].implementation",
                f"one of {', '.join(known)}",
                repr(name),
                "Name the op (native) or one of the spec's implementations, or drop the key for every one of them.",
            )


def describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def suggest(key: str, allowed: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, allowed, n=1)
    return f"Did you mean {close[0]!r}?" if close else "Remove it or fix its spelling."


def read_str(r: Reader, key: str, node: Node) -> str:
    if not isinstance(node.value, str) or not node.value.strip():
        raise r.fail(
            node, key, "a non-empty string", describe(node.value), "Quote the value if YAML reads it otherwise."
        )
    return node.value


def read_bool(r: Reader, key: str, node: Node) -> bool:
    if not isinstance(node.value, bool):
        raise r.fail(node, key, "true or false", describe(node.value), "Write true or false.")
    return node.value


def read_number(r: Reader, key: str, node: Node) -> float:
    value = node.value
    # YAML 1.1 reads `1e-3` (no dot) as a string; accept it, since that is how people write tolerances.
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise r.fail(node, key, "a number", describe(node.value), "Write a number such as 0.5 or 1.0e-3.")
    return float(value)


def read_seconds(r: Reader, key: str, node: Node) -> float:
    value = read_number(r, key, node)
    if not 0 < value < float("inf"):
        raise r.fail(node, key, "a number of seconds > 0", repr(value), "Write e.g. `timeout: 600`.")
    return value


def list_of(
    item: Callable[[Reader, str, Node], T], *, allow_empty: bool = False
) -> Callable[[Reader, str, Node], tuple[T, ...]]:
    def read(r: Reader, key: str, node: Node) -> tuple[T, ...]:
        if not isinstance(node.value, list):
            raise r.fail(node, key, "a list", describe(node.value), "Write a YAML list: [a, b] or one `- a` per line.")
        if not node.value and not allow_empty:
            raise r.fail(node, key, "a non-empty list", "an empty list", "List at least one entry or drop the key.")
        return tuple(item(r, f"{key}[{i}]", child) for i, child in enumerate(node.value))

    return read


def one_of(choices: tuple[str, ...]) -> Callable[[Reader, str, Node], str]:
    def read(r: Reader, key: str, node: Node) -> str:
        if node.value not in choices:
            raise r.fail(
                node, key, f"one of {', '.join(choices)}", describe(node.value), suggest(str(node.value), choices)
            )
        choice: str = node.value
        return choice

    return read


def read_callable(r: Reader, key: str, node: Node) -> str:
    value = read_str(r, key, node)
    if not _CALLABLE.match(value):
        raise r.fail(node, key, "`module:function`", repr(value), "Write e.g. `my_pkg.ops:reference`.")
    return value


def read_shape(r: Reader, key: str, node: Node) -> tuple[int, ...]:
    if not isinstance(node.value, list) or not all(
        isinstance(d.value, int) and not isinstance(d.value, bool) and d.value >= 0 for d in node.value
    ):
        raise r.fail(
            node,
            key,
            "a shape: a list of sizes >= 0 such as [33, 65] or [] for 0-d",
            describe(node.value),
            "Write each shape as a list of non-negative integers.",
        )
    return tuple(d.value for d in node.value)


def read_scalar(r: Reader, key: str, node: Node) -> Any:
    if isinstance(node.value, (dict, list)):
        raise r.fail(
            node,
            key,
            "a scalar value (number, bool, string, null)",
            describe(node.value),
            "List each value the argument should take.",
        )
    return node.value


def read_tolerance(r: Reader, key: str, node: Node) -> Tolerance:
    t = Reader(r.path, node, key, ("atol", "rtol"), required=("atol", "rtol"))
    return Tolerance(atol=t.get("atol", read_number), rtol=t.get("rtol", read_number))


def read_tolerances(r: Reader, key: str, node: Node) -> tuple[tuple[str, Tolerance], ...]:
    t = Reader(r.path, node, key, KNOWN_DTYPES)
    return tuple((dtype, t.get(dtype, read_tolerance)) for dtype in node.value)
