"""From a validated spec to callables: build the sources, import the modules, resolve the op, its reference and its
other implementations, and check the registered schema and the spec's inputs against each other."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opforge.build import BuildResult, build_sources
from opforge.errors import BuildError, SpecError
from opforge.schema import canonical, is_tensor_type
from opforge.spec.model import OpSpec, ScalarInput, TensorInput

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
    return LoadedOp(spec, overload, targets, resolve_callable(spec, "reference", spec.reference), build)


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
    if canonical(expected) != canonical(actual):
        raise spec.error(
            "schema",
            f"the registered schema {actual}",
            repr(spec.schema),
            "Update the spec's schema, or the op's definition if the spec is right.",
        )


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
        is_tensor = is_tensor_type(arguments[entry.name].type)
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
