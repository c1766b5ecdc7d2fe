"""The spec's `regressions:` list: cases kept because they once broke the op (`opforge fuzz --save` writes them),
each run from then on by every check that runs each case of the matrix, with the values it was found with; and
`opforge fuzz --example`, one such entry given on the command line, read the same way."""

from __future__ import annotations

import json
from pathlib import Path

from opforge.cases.matrix import fill_error, layout_error
from opforge.core.errors import SpecError, UsageError
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES, Input, OpSpec, Regression, ScalarInput, TensorInput
from opforge.spec.reader import Node, Reader, compose, describe, list_of, one_of, read_scalar, read_shape, read_str

_KEYS = ("dtype", "device", "layout", "shapes", "values", "fill", "seed", "sample", "found")


def read_regressions(r: Reader, inputs: tuple[Input, ...], sampled: bool) -> tuple[Regression, ...]:
    def read(r: Reader, key: str, node: Node) -> Regression:
        return _read_regression(r.path, key, node, inputs, sampled)

    regressions: tuple[Regression, ...] = r.get("regressions", list_of(read, allow_empty=True), ())
    return regressions


_PASTE = "Paste the repro's --example as fuzz printed it."


def read_example(text: str, spec: OpSpec, device: str) -> Regression:
    """`opforge fuzz --example` (a failure's repro, the mapping fuzz prints) read as a `regressions:` entry is, with
    the keys an entry requires and a hand-written example may leave out taken from the spec and the run: its first
    dtype, the device fuzz runs on, seed 0."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError("--example", "JSON", f"invalid JSON ({exc})", _PASTE) from None
    if not isinstance(data, dict):
        raise UsageError("--example", "a JSON object", type(data).__name__, _PASTE)
    defaults = {"dtype": spec.dtypes[0], "device": device, "seed": 0}
    path = Path("--example")
    try:
        return _read_regression(
            path, "example", compose(path, json.dumps(defaults | data)), spec.inputs, spec.samples is not None
        )
    except SpecError as error:
        raise UsageError(f"--example {error.key}", error.expected, error.got, error.hint) from None


def _read_regression(path: Path, key: str, node: Node, inputs: tuple[Input, ...], sampled: bool) -> Regression:
    x = Reader(path, node, key, _KEYS, required=("dtype", "device", "seed") + (("sample",) if sampled else ()))
    tensors = tuple(i.name for i in inputs if isinstance(i, TensorInput))
    scalars = {i.name: i for i in inputs if isinstance(i, ScalarInput)}
    layout = x.get("layout", read_str, "contiguous")
    if (why := layout_error(layout)) is not None:
        raise x.fail(x.child("layout"), f"{key}.layout", why, repr(layout), "Write e.g. offset:3 or transposed:0,2.")
    fill = x.get("fill", read_str, "")
    if fill and (why := fill_error(fill, tensors)) is not None:
        raise x.fail(x.child("fill"), f"{key}.fill", why, repr(fill), "See docs/fuzz.md for the fill rules.")
    return Regression(
        dtype=x.get("dtype", one_of(KNOWN_DTYPES)),
        device=x.get("device", one_of(KNOWN_DEVICES)),
        layout=layout,
        shapes=_shapes(x, key, tensors, sampled),
        values=_values(x, key, scalars),
        fill=fill,
        seed=x.get("seed", _read_int),
        sample=x.get("sample", _read_int) if sampled else None,
        found=x.get("found", read_str, ""),
    )


def _shapes(x: Reader, key: str, tensors: tuple[str, ...], sampled: bool) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if sampled:
        if x.has("shapes"):
            raise x.fail(
                x.child("shapes"),
                f"{key}.shapes",
                "no shapes in a samples spec's regression (its sample's shapes are used)",
                "shapes",
                "Drop `shapes:`; `sample:` names the sample.",
            )
        return ()
    node = x.child("shapes") if x.has("shapes") else None
    if node is None or not isinstance(node.value, dict) or set(node.value) != set(tensors):
        got = describe(node.value) if node is not None else "nothing"
        raise x.fail(
            node or x.node,
            f"{key}.shapes",
            f"a shape for each tensor input ({', '.join(tensors)})",
            got,
            "Write `shapes: {x: [7, 33]}` naming every tensor input.",
        )
    s = Reader(x.path, node, f"{key}.shapes", tensors)
    return tuple((name, s.get(name, read_shape)) for name in tensors)


def _values(x: Reader, key: str, scalars: dict[str, ScalarInput]) -> tuple[tuple[str, object], ...]:
    if not x.has("values"):
        return ()
    v = Reader(x.path, x.child("values"), f"{key}.values", tuple(scalars))
    return tuple((name, v.get(name, read_scalar)) for name in x.child("values").value)


def _read_int(r: Reader, key: str, node: Node) -> int:
    if not isinstance(node.value, int) or isinstance(node.value, bool) or node.value < 0:
        raise r.fail(node, key, "an integer >= 0", describe(node.value), "Write the number fuzz printed.")
    value: int = node.value
    return value
