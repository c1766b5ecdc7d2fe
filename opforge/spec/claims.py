"""The claim that switches error_inputs on and gives it its cases: `error_inputs` (invalid calls and the errors they
must raise)."""

from __future__ import annotations

from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES, ErrorInput, ErrorTensor, Input, TensorInput
from opforge.spec.reader import Node, Reader, describe, list_of, one_of, read_scalar, read_shape, read_str

_ERROR_INPUT_KEYS = ("description", "inputs", "error", "match")


def read_error_inputs(r: Reader, inputs: tuple[Input, ...]) -> tuple[ErrorInput, ...]:
    entries: tuple[ErrorInput, ...] = r.get("error_inputs", list_of(lambda rr, k, n: _error_input(rr, k, n, inputs)))
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.label in seen:
            raise r.fail(
                r.child("error_inputs").value[i],
                f"error_inputs[{i}].description",
                "a description unlike the others (it names the result)",
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
