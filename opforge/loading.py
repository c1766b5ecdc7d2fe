"""From a validated spec to callables: build the sources, import the modules, resolve the op, its reference and its
other implementations, and check the registered schema and the spec's inputs against each other."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opforge.build import BuildResult, build_sources
from opforge.errors import BuildError, SpecError
from opforge.spec import OpSpec, ScalarInput, TensorInput

NATIVE = "native"


@dataclass(frozen=True)
class Target:
    """One implementation under test: the spec's op itself ("native") or an extra implementation."""

    name: str
    fn: Callable[..., Any]
    # The registered operator behind it, for checks that need one (opcheck); None for a plain function.
    overload: Any | None


@dataclass(frozen=True)
class LoadedOp:
    spec: OpSpec
    overload: Any  # torch._ops.OpOverload
    targets: tuple[Target, ...]
    reference: Callable[..., Any]
    build: BuildResult | None

    @property
    def arguments(self) -> list[Any]:
        return list(self.overload._schema.arguments)

    @property
    def mutated_arguments(self) -> list[str]:
        return [a.name for a in self.arguments if a.alias_info is not None and a.alias_info.is_write]


def load_op(spec: OpSpec, cuda_arch: str | None = None, on_step: Callable[[str], None] | None = None) -> LoadedOp:
    build = build_sources(spec.sources, cuda_arch, on_step) if spec.sources else None
    _import_modules(spec)
    overload = _resolve_op(spec)
    _check_schema(spec, overload)
    _check_inputs(spec, overload)
    targets = (Target(NATIVE, overload, overload),) + tuple(
        _target(spec, name, ref) for name, ref in spec.implementations
    )
    loaded = LoadedOp(spec, overload, targets, resolve_callable(spec, "reference", spec.reference), build)
    _check_vmap_claim(loaded)
    return loaded


def _import_modules(spec: OpSpec) -> None:
    # The spec's own directory is importable, so a user's spec can sit next to the user's module.
    directory = str(spec.directory)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    for module in spec.python_modules:
        _import(spec, "load", module)


def _import(spec: OpSpec, key: str, module: str) -> Any:
    try:
        return importlib.import_module(module)
    except BuildError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise spec.error(
                key,
                f"an importable module {module!r}",
                f"no module named {exc.name!r}",
                "Put it next to the spec or install it.",
            ) from None
        raise _import_failure(spec, key, module, exc) from None
    except Exception as exc:  # a user's module may raise anything on import; report it, do not crash
        raise _import_failure(spec, key, module, exc) from None


def _import_failure(spec: OpSpec, key: str, module: str, exc: Exception) -> SpecError:
    return spec.error(
        key,
        f"module {module!r} to import cleanly",
        f"{type(exc).__name__}: {exc}",
        "Fix the error in that module (run `python -c 'import " + module + "'` to see it).",
    )


def resolve_callable(spec: OpSpec, key: str, ref: str) -> Callable[..., Any]:
    module_name, attr = ref.split(":", 1)
    module = _import(spec, key, module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        got = "nothing by that name" if fn is None else f"a {type(fn).__name__}"
        raise spec.error(
            key,
            f"a callable {attr!r} in module {module_name!r}",
            got,
            f"Define {attr} in {module_name} or fix the name.",
        )
    return fn


def _target(spec: OpSpec, name: str, ref: str) -> Target:
    fn = resolve_callable(spec, "implementations", ref)
    # A torch.library.custom_op wraps an OpOverload; opcheck needs that.
    overload = getattr(fn, "_opoverload", None)
    if overload is None and type(fn).__name__ == "OpOverload":
        overload = fn
    return Target(name, fn, overload)


def _resolve_op(spec: OpSpec) -> Any:
    import torch

    namespace, name = spec.op.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        raise spec.error(
            "op",
            f"an operator {spec.op} registered by load.python or load.sources",
            "no such operator",
            "Check the m.def(...) / torch.library.custom_op name and the namespace.",
        ) from None


def _check_schema(spec: OpSpec, overload: Any) -> None:
    import torch

    try:
        expected = torch._C.parse_schema(spec.schema)
    except RuntimeError as exc:
        raise spec.error(
            "schema",
            "a valid operator schema",
            f"{spec.schema!r} ({str(exc).splitlines()[0]})",
            "Write it as `ns::name(Tensor x, float alpha=0.1) -> Tensor`.",
        ) from None
    actual = overload._schema
    if _canonical(expected) != _canonical(actual):
        raise spec.error(
            "schema",
            f"the registered schema {actual}",
            repr(spec.schema),
            "Update the spec's schema, or the op's definition if the spec is right.",
        )


def _canonical(schema: Any) -> str:
    """The schema after the op name (a spec may leave out the namespace), alias sets renamed in order of first
    appearance: `Tensor(a!)` and torch.library.custom_op's `Tensor(a0!)` mean the same."""
    text = str(schema)
    text = text.split("(", 1)[1] if "(" in text else text
    names: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        alias = names.setdefault(match.group(1), f"alias{len(names)}")
        return f"Tensor({alias}{match.group(2)})"

    return re.sub(r"Tensor\((\w+)(!?)\)", rename, text)


def _check_inputs(spec: OpSpec, overload: Any) -> None:
    arguments = {a.name: a for a in overload._schema.arguments}
    for entry in spec.inputs:
        if entry.name not in arguments:
            raise spec.error(
                f"inputs.{entry.name}",
                f"one of the schema's arguments ({', '.join(arguments)})",
                repr(entry.name),
                "Name each input after its schema argument.",
            )
        is_tensor = _is_tensor_type(arguments[entry.name].type)
        if is_tensor and isinstance(entry, ScalarInput):
            raise spec.error(
                f"inputs.{entry.name}",
                f"`shapes:` for Tensor argument {entry.name}",
                "`values:`",
                "Give a tensor argument `shapes:` (and optionally low/high).",
            )
        if not is_tensor and isinstance(entry, TensorInput):
            raise spec.error(
                f"inputs.{entry.name}",
                f"`values:` for {arguments[entry.name].type} argument {entry.name}",
                "`shapes:`",
                "Give a non-tensor argument a list of `values:`.",
            )
    given = {i.name for i in spec.inputs}
    for name, argument in arguments.items():
        if name not in given and not argument.has_default_value():
            raise spec.error(
                "inputs",
                f"an entry for schema argument {name!r} (it has no default)",
                "none",
                f"Add `{name}:` under inputs.",
            )


def _check_vmap_claim(loaded: LoadedOp) -> None:
    """The vmap check compares with a loop over slices of fresh inputs; an op that writes its arguments would need
    the batched writes compared too, which it does not do: refuse the claim rather than check nothing."""
    mutated = loaded.mutated_arguments
    if loaded.spec.vmap and mutated:
        raise loaded.spec.error(
            "vmap",
            "vmap: true only for an op that mutates none of its arguments",
            f"vmap: true on an op that mutates {', '.join(mutated)}",
            "Drop `vmap: true`: opforge checks vmap of functional ops only.",
        )


def _is_tensor_type(t: Any) -> bool:
    return str(t).startswith("Tensor")
