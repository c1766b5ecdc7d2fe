"""The spec's `bench:` section: what `opforge bench` times (sizes or shapes, dtypes, devices, modes) and the bytes
one call moves, as expressions checked here (opforge.spec.bytes_expr) and evaluated by the benchmark."""

from __future__ import annotations

import re

from opforge.core.schema import return_names
from opforge.spec.bytes_expr import ExpressionError, parse
from opforge.spec.model import (
    BENCH_BASELINES,
    BENCH_LAYOUTS,
    BENCH_MODES,
    KNOWN_DEVICES,
    KNOWN_DTYPES,
    BenchSlower,
    BenchSpec,
    Input,
    TensorInput,
)
from opforge.spec.reader import (
    Node,
    Reader,
    check_implementation_names,
    describe,
    list_of,
    one_of,
    read_shape,
    read_str,
)

_BENCH_KEYS = ("sizes", "shapes", "dtypes", "devices", "modes", "layouts", "bytes", "slower")
POWER_OF_TWO = re.compile(r"^\s*2\s*(?:\*\*|\^)\s*(\d+)\s*$")


def read_bench_section(
    r: Reader,
    inputs: tuple[Input, ...],
    schema: str,
    claimed_modes: tuple[str, ...],
    dtypes: tuple[str, ...],
    devices: tuple[str, ...],
    layouts: tuple[str, ...],
    implementations: tuple[tuple[str, str], ...] = (),
) -> BenchSpec | None:
    if not r.has("bench"):
        return None
    node = r.child("bench")
    b = Reader(r.path, node, "bench", _BENCH_KEYS)
    tensors = tuple(i.name for i in inputs if isinstance(i, TensorInput))
    if not b.has("sizes") and not b.has("shapes"):
        raise b.fail(
            node,
            "bench",
            "`sizes:` (numel of every tensor input) or `shapes:` (per input)",
            "neither",
            "Add e.g. `sizes: [2**16, 2**20, 2**24]`.",
        )
    modes = b.get("modes", list_of(one_of(BENCH_MODES)), ())
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
        sizes=b.get("sizes", list_of(_bench_size), ()),
        shapes=_bench_shapes(b, tensors) if b.has("shapes") else (),
        dtypes=_bench_claimed(b, "dtypes", KNOWN_DTYPES, dtypes),
        devices=_bench_claimed(b, "devices", KNOWN_DEVICES, devices),
        modes=modes,
        layouts=_bench_claimed(b, "layouts", BENCH_LAYOUTS, layouts),
        bytes=expressions,
        slower=_bench_slower(b, implementations) if b.has("slower") else (),
        lines=lines,
        keys=keys,
    )


def _bench_slower(b: Reader, implementations: tuple[tuple[str, str], ...]) -> tuple[BenchSlower, ...]:
    entries: tuple[BenchSlower, ...] = b.get("slower", list_of(_read_slower))
    check_implementation_names(b, "slower", tuple(e.implementation for e in entries), implementations)
    return entries


def _read_slower(r: Reader, key: str, node: Node) -> BenchSlower:
    x = Reader(r.path, node, key, ("than", "case", "implementation", "reason"), required=("than", "reason"))
    return BenchSlower(
        than=x.get("than", one_of(BENCH_BASELINES)),
        reason=x.get("reason", read_str),
        case=x.get("case", read_str),
        implementation=x.get("implementation", read_str),
    )


def _bench_claimed(b: Reader, key: str, known: tuple[str, ...], claimed: tuple[str, ...]) -> tuple[str, ...]:
    """bench.dtypes / bench.devices: each must be one the spec claims, since the op is only checked on those."""
    values: tuple[str, ...] = b.get(key, list_of(one_of(known)), ())
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


def _bench_size(r: Reader, key: str, node: Node) -> int:
    value = node.value
    match = POWER_OF_TWO.match(value) if isinstance(value, str) else None
    if match:
        value = 2 ** int(match.group(1))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise r.fail(
            node, key, "a number of elements > 0, or 2**k", describe(node.value), 'Write e.g. 65536 or "2**24".'
        )
    return value


def _bench_shapes(b: Reader, tensors: tuple[str, ...]) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    node = b.child("shapes")
    s = Reader(b.path, node, "bench.shapes", tensors, required=tensors)
    per_input = {name: s.get(name, list_of(read_shape)) for name in tensors}
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


def _bench_bytes(
    b: Reader, inputs: tuple[Input, ...], schema: str
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    node = b.child("bytes")
    if isinstance(node.value, dict):
        m = Reader(b.path, node, "bench.bytes", BENCH_MODES)
        items = [(mode, m.child(mode), f"bench.bytes.{mode}") for mode in node.value]
    else:
        items = [("fwd", node, "bench.bytes")]
    expressions, lines, keys = [], [], []
    for mode, child, key in items:
        text = read_str(b, key, child)
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
    outputs = return_names(schema)
    names = {i.name for i in inputs} | set(outputs)
    if mode != "fwd":
        names |= {f"grad_{n}" for n in outputs} | {
            f"grad_{i.name}" for i in inputs if isinstance(i, TensorInput) and i.requires_grad
        }
    return names
