"""The spec's `inputs:` section: one entry per schema argument, a tensor (`shapes:` and how to sample it) or a
non-tensor (`values:`). In a spec whose `samples:` function makes the inputs, a tensor's entry holds its settings
(requires_grad, layouts, special_values, ...) without `shapes:`."""

from __future__ import annotations

from opforge.spec.model import (
    CASE_DTYPE,
    KNOWN_DTYPES,
    KNOWN_LAYOUTS,
    SPECIAL_VALUES,
    Avoid,
    Input,
    ScalarInput,
    TensorInput,
)
from opforge.spec.reader import (
    Node,
    Reader,
    describe,
    list_of,
    one_of,
    read_bool,
    read_callable,
    read_number,
    read_scalar,
    read_shape,
    read_str,
)

_INPUT_KEYS = (
    "shapes",
    "low",
    "high",
    "avoid",
    "requires_grad",
    "dtype",
    "values",
    "layouts",
    "generator",
    "special_values",
)


def _input(r: Reader, name: str, node: Node, sampled: bool) -> Input:
    key = f"inputs.{name}"
    i = Reader(r.path, node, key, _INPUT_KEYS)
    if sampled and i.has("shapes"):
        raise i.fail(
            i.child("shapes"),
            f"{key}.shapes",
            "no `shapes:` beside `samples:` (the sample function gives every case's shapes)",
            "`shapes:`",
            f"Drop inputs.{name}.shapes, or drop `samples:` and list the shapes here.",
        )
    if i.has("values") == i.has("shapes") and not (sampled and not i.has("values")):
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
        return ScalarInput(name=name, values=i.get("values", list_of(read_scalar)))
    low, high = i.get("low", read_number, -1.0), i.get("high", read_number, 1.0)
    if not low < high:
        raise i.fail(
            i.child("high") if i.has("high") else node,
            f"{key}.high",
            f"high > low ({low})",
            repr(high),
            "Give a non-empty value range.",
        )
    dtype = i.get("dtype", one_of((*KNOWN_DTYPES, CASE_DTYPE)))
    return TensorInput(
        name=name,
        shapes=i.get("shapes", list_of(read_shape), ()),
        low=low,
        high=high,
        requires_grad=i.get("requires_grad", read_bool, False),
        avoid=i.get("avoid", _read_avoid),
        dtype=None if dtype == CASE_DTYPE else dtype,
        follows_case_dtype=dtype == CASE_DTYPE,
        layouts=i.get("layouts", list_of(one_of(KNOWN_LAYOUTS))),
        generator=i.get("generator", read_callable),
        special_values=i.get("special_values", _read_special_values),
    )


def _read_special_values(r: Reader, key: str, node: Node) -> bool | tuple[str, ...]:
    """false (keep the sampled values), true, or the special values to write into this input."""
    if isinstance(node.value, list):
        return list_of(one_of(SPECIAL_VALUES))(r, key, node)
    if not isinstance(node.value, bool):
        raise r.fail(
            node,
            key,
            f"true, false or a list of {', '.join(SPECIAL_VALUES)}",
            describe(node.value),
            "Write false to keep the input's sampled values, or list the special values it takes.",
        )
    return node.value


def read_inputs(r: Reader, key: str, node: Node, sampled: bool = False) -> tuple[Input, ...]:
    if not isinstance(node.value, dict) or (not node.value and not sampled):
        raise r.fail(
            node,
            key,
            "a mapping of argument name to its inputs",
            describe(node.value),
            "Add one entry per schema argument, e.g. `x: {shapes: [[7]]}`.",
        )
    inputs = tuple(_input(r, name, child, sampled) for name, child in node.value.items())
    if not sampled:
        _check_paired_shapes(r, node, inputs)
    _check_avoid_targets(r, node, inputs)
    return inputs


def _check_paired_shapes(r: Reader, node: Node, inputs: tuple[Input, ...]) -> None:
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


def _check_avoid_targets(r: Reader, node: Node, inputs: tuple[Input, ...]) -> None:
    tensor_names = {i.name for i in inputs if isinstance(i, TensorInput)}
    for i in inputs:
        if not (isinstance(i, TensorInput) and i.avoid and i.avoid.relative_to):
            continue
        if i.avoid.relative_to not in tensor_names - {i.name}:
            raise r.fail(
                node.value[i.name],
                f"inputs.{i.name}.avoid.relative_to",
                f"another tensor input ({', '.join(sorted(tensor_names - {i.name})) or 'none'})",
                repr(i.avoid.relative_to),
                "Name the tensor whose difference has the kink.",
            )


def _read_avoid(r: Reader, key: str, node: Node) -> Avoid:
    a = Reader(r.path, node, key, ("values", "margin", "relative_to"), required=("values", "margin"))
    margin = a.get("margin", read_number)
    if margin <= 0:
        raise a.fail(a.child("margin"), f"{key}.margin", "a margin > 0", repr(margin), "Use a small positive margin.")
    return Avoid(
        values=a.get("values", list_of(read_number)), margin=margin, relative_to=a.get("relative_to", read_str)
    )
