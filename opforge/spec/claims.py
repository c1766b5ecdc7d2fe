"""The claims that switch checks on and give them their cases: `error_inputs` (invalid calls and the errors they
must raise) and `large_index` (shapes past 2^31 elements)."""

from __future__ import annotations

import math

from opforge.spec.model import (
    GRID_SIZE_ELEMENTS_MIN,
    INT32_INDEX_LIMIT,
    KNOWN_DEVICES,
    KNOWN_DTYPES,
    ErrorInput,
    ErrorTensor,
    GridSize,
    Input,
    LargeIndex,
    TensorInput,
)
from opforge.spec.reader import Node, Reader, describe, list_of, one_of, read_bool, read_scalar, read_shape, read_str

_ERROR_INPUT_KEYS = ("description", "inputs", "error", "match")


def read_error_inputs(r: Reader, inputs: tuple[Input, ...]) -> tuple[ErrorInput, ...]:
    entries = r.get("error_inputs", list_of(lambda rr, k, n: _error_input(rr, k, n, inputs)))
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


def _error_input(r: Reader, key: str, node: Node, inputs: tuple[Input, ...]) -> ErrorInput:
    e = Reader(r.path, node, key, _ERROR_INPUT_KEYS, required=("description", "inputs", "error", "match"))
    error = e.get("error", read_str)
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
            describe(args.value),
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
            v = Reader(r.path, child, f"{key}.inputs.{name}", ("value",), required=("value",))
            values.append((name, read_scalar(v, f"{key}.inputs.{name}.value", v.child("value"))))
    return ErrorInput(
        description=e.get("description", read_str),
        tensors=tuple(tensors),
        values=tuple(values),
        error=error,
        match=e.get("match", read_str),
    )


def _error_tensor(r: Reader, key: str, name: str, node: Node) -> ErrorTensor:
    t = Reader(r.path, node, key, ("shape", "dtype", "device"))
    return ErrorTensor(
        name=name,
        shape=t.get("shape", read_shape),
        dtype=t.get("dtype", one_of(KNOWN_DTYPES)),
        device=t.get("device", one_of(KNOWN_DEVICES)),
    )


def _is_builtin_exception(name: str) -> bool:
    """A built-in Exception subclass: the check catches Exception, so SystemExit or KeyboardInterrupt (BaseException
    only) would escape it."""
    import builtins

    cls = getattr(builtins, name, None)
    return isinstance(cls, type) and issubclass(cls, Exception)


# ------------------------------------------------------------------------------------------------ large_index


def read_grid_size(r: Reader, inputs: tuple[Input, ...]) -> GridSize:
    node = r.child("grid_size")
    g = Reader(r.path, node, "grid_size", ("shapes",), required=("shapes",))
    tensors = [i.name for i in inputs if isinstance(i, TensorInput)]
    s = Reader(r.path, g.child("shapes"), "grid_size.shapes", tuple(tensors), required=tuple(tensors))
    shapes = tuple((name, s.get(name, read_shape)) for name in tensors)
    largest = max(math.prod(shape) for _, shape in shapes)
    if largest <= GRID_SIZE_ELEMENTS_MIN:
        raise s.fail(
            g.child("shapes"),
            "grid_size.shapes",
            f"a tensor of more than 2^24 = {GRID_SIZE_ELEMENTS_MIN} elements (a grid capped at 65,535 blocks of 256 "
            "threads covers fewer)",
            f"{largest} at most",
            "Give one input a shape past 2^24 elements, e.g. [70000, 256] for an op with one block per row.",
        )
    return GridSize(shapes=shapes)


def read_large_index(r: Reader, inputs: tuple[Input, ...], dtypes: tuple[str, ...]) -> LargeIndex:
    node = r.child("large_index")
    g = Reader(r.path, node, "large_index", ("shapes", "dtype", "enabled"), required=("shapes",))
    dtype = g.get("dtype", one_of(KNOWN_DTYPES), "float16")
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
    s = Reader(r.path, shapes_node, "large_index.shapes", tuple(tensors), required=tuple(tensors))
    shapes = tuple((name, s.get(name, read_shape)) for name in tensors)
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
    return LargeIndex(shapes=shapes, dtype=dtype, enabled=g.get("enabled", read_bool, False))
