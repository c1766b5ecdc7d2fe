"""From a validated spec to callables: build the sources, import the modules, resolve the op, its reference and its
other implementations, and check the registered schema and the spec's inputs against each other.

Everything that does not need the built library is checked before the build (a cold build takes tens of seconds):
the schema's syntax, the inputs against the spec's schema, and that every `module:function` the spec names exists
(found on the import path and defined in the module's source, without importing it: importing may need the build).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opforge.building.extension import BuildPlan, BuildResult, Toolchain, build, detect_toolchain, plan_build
from opforge.building.self_reference import SelfReference
from opforge.cases.arguments import SAME_VALUES_HINT, call_samples, same_value
from opforge.cases.matrix import SAMPLE_NAME_KEY
from opforge.core.errors import BuildError, SpecError
from opforge.core.outcomes import short
from opforge.core.schema import canonical, is_tensor_type
from opforge.spec.model import CASE_DTYPE, KNOWN_DTYPES, OpSpec, ScalarInput, TensorInput

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from torch._C import Argument, FunctionSchema
    from torch._ops import OpOverload

NATIVE = "native"


@dataclass(frozen=True)
class Implementation:
    """One implementation under test: the spec's op itself ("native") or an extra implementation."""

    name: str
    fn: Callable[..., Any]
    # The registered operator behind it, for checks that need one (opcheck); None for a plain function.
    overload: OpOverload | None


@dataclass(frozen=True)
class LoadedOp:
    spec: OpSpec
    overload: OpOverload
    implementations: tuple[Implementation, ...]
    reference: Callable[..., Any]
    build: BuildResult | None
    # Input name -> the function that makes its values (a spec's `generator:`).
    generators: dict[str, Callable[..., Any]] = field(default_factory=dict)
    # The spec's `samples:` function, which makes every case's inputs; None: sampled from `inputs`.
    samples: Callable[..., Any] | None = None

    @property
    def arguments(self) -> list[Argument]:
        return list(self.overload._schema.arguments)

    @property
    def mutated_arguments(self) -> list[str]:
        return [a.name for a in self.arguments if a.alias_info is not None and a.alias_info.is_write]

    @property
    def self_reference(self) -> SelfReference | None:
        """The op itself as its reference, for a spec without `reference:` (opforge.building.self_reference); else
        None."""
        return self.reference if isinstance(self.reference, SelfReference) else None

    @property
    def reference_label(self) -> str:
        """What the checks compared a value with, for messages: `the reference`, or for a spec without one
        `the op itself on contiguous float64` (the dtype its last call was computed in)."""
        own = self.self_reference
        return own.label if own is not None else "the reference"


def load_op(spec: OpSpec, cuda_arch: str | None = None, on_step: Callable[[str], None] | None = None) -> LoadedOp:
    _pause_recording()
    _add_import_roots(spec)
    _check_inputs(spec, _parse_schema(spec).arguments)
    for key, ref in _named_callables(spec):
        _check_callable_exists(spec, key, ref)
    build = _build(spec, cuda_arch, on_step) if spec.sources else None
    for module in spec.python_modules:
        _import(spec, "load", module)
    overload = _resolve_op(spec)
    _check_schema(spec, overload)
    implementations = (Implementation(NATIVE, overload, overload),) + tuple(
        _implementation(spec, name, ref) for name, ref in spec.implementations
    )
    reference = (
        resolve_callable(spec, "reference", spec.reference) if spec.reference else _self_reference(spec, overload)
    )
    generators = {
        t.name: resolve_callable(spec, f"inputs.{t.name}.generator", t.generator)
        for t in spec.tensor_inputs()
        if t.generator
    }
    samples = resolve_callable(spec, "samples", spec.samples.ref) if spec.samples else None
    if samples is not None:
        spec = resolve_samples(spec, list(overload._schema.arguments), samples)
    _import_what_a_first_call_imports()
    return LoadedOp(spec, overload, implementations, reference, build, generators, samples)


def _pause_recording() -> None:
    """A process that checks an op is opforge's, not a recorded program's: under `opforge record` (its hook
    module loaded at startup), its calls are not recorded (opforge.tools.record.hook)."""
    recording = sys.modules.get("_opforge_record_hook")
    if recording is not None:
        recording.pause()


def _self_reference(spec: OpSpec, overload: OpOverload) -> SelfReference:
    """A spec without `reference:` is checked against the op itself: on the CPU where the spec claims it, else on
    its first device."""
    device = "cpu" if "cpu" in spec.devices else spec.devices[0]
    return SelfReference(overload, spec.dtypes_on(device), device)


def _import_what_a_first_call_imports() -> None:
    """A torch.library op's first call imports torch._dynamo (its kernels run under torch._disable_dynamo): 1.7 s
    on this 2-core VM, many times that on a loaded machine, where a worker's trivial first case then ran into its
    time limit; and a fuzz worker's forked children each paid it again. Loading pays it once instead, under the
    load's limit, so a case's time limit measures the case."""
    import torch._dynamo  # noqa: F401


def _build(spec: OpSpec, cuda_arch: str | None, on_step: Callable[[str], None] | None) -> BuildResult:
    return build(spec_build_plan(spec, detect_toolchain(cuda_arch)), on_step)


def spec_build_plan(spec: OpSpec, toolchain: Toolchain) -> BuildPlan:
    """The build of a spec's sources with what its `load:` section says they need."""
    load = spec.load
    return plan_build(
        spec.sources,
        toolchain,
        include_dirs=load.include_dirs,
        libraries=load.libraries,
        extra_cflags=load.extra_cflags,
        module=load.module,
    )


def _add_import_roots(spec: OpSpec) -> None:
    """The spec's own directory is importable, so a user's spec can sit next to the user's module; `load.path`
    directories come first (the root of a package the spec checks)."""
    for directory in (spec.directory, *reversed(spec.load.path)):
        if str(directory) in sys.path:
            sys.path.remove(str(directory))
        sys.path.insert(0, str(directory))


def _named_callables(spec: OpSpec) -> list[tuple[str, str]]:
    """Every `module:function` the spec names, with the key that names it."""
    named = [("reference", spec.reference)] if spec.reference else []
    named += [("implementations", ref) for _, ref in spec.implementations]
    named += [("samples", spec.samples.ref)] if spec.samples else []
    return named + [(f"inputs.{t.name}.generator", t.generator) for t in spec.tensor_inputs() if t.generator]


def _check_callable_exists(spec: OpSpec, key: str, ref: str) -> None:
    """A module that is nowhere on the import path, or a function its source does not define, is the spec's error
    now, before a build. Found without importing anything (a package's __init__ may need the build); a module whose
    source cannot tell (a star import, a module __getattr__, a compiled module) is left to the import."""
    module_name, attr = ref.split(":", 1)
    found = _find_module(module_name)
    if found is None:
        raise spec.error(
            key,
            f"an importable module {module_name!r}",
            "no module by that name on the import path",
            "Put it next to the spec, add its root to load.path, or install it.",
        )
    source = Path(found.origin) if found.origin and found.origin.endswith(".py") else None
    if source is None:
        return
    defined = _top_level_names(source)
    if defined is not None and attr not in defined:
        raise spec.error(
            key,
            f"a callable {attr!r} in module {module_name!r}",
            f"nothing by that name in {source}",
            f"Define {attr} in {module_name} or fix the name.",
        )


def _find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """The module's spec, found package by package along the import path without importing a package; a module
    already imported is taken as it is."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None) or importlib.machinery.ModuleSpec(name, None)
    found = None
    path = None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if prefix in sys.modules:
            module = sys.modules[prefix]
            found = getattr(module, "__spec__", None)
            path = list(getattr(module, "__path__", []) or [])
            continue
        # A top-level module through every finder (an editable install has its own); a submodule in its package's
        # directories, so that no package is imported to find it.
        found = (
            importlib.util.find_spec(prefix) if depth == 1 else importlib.machinery.PathFinder.find_spec(prefix, path)
        )
        if found is None:
            return None
        path = list(found.submodule_search_locations or [])
    return found


def _top_level_names(source: Path) -> set[str] | None:
    """The names a module's source defines at top level, or None when the source cannot tell (a star import, a
    module-level __getattr__, a syntax error the import will report better)."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif not isinstance(node, (ast.Expr, ast.Pass)):
            return None  # a name defined under an if/try/with: leave it to the import
    return None if "__getattr__" in names else names


def _import(spec: OpSpec, key: str, module: str) -> ModuleType:
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
    fn: object = getattr(module, attr, None)
    if not callable(fn):
        got = "nothing by that name" if fn is None else f"a {type(fn).__name__}"
        raise spec.error(
            key,
            f"a callable {attr!r} in module {module_name!r}",
            got,
            f"Define {attr} in {module_name} or fix the name.",
        )
    return fn


def _implementation(spec: OpSpec, name: str, ref: str) -> Implementation:
    fn = resolve_callable(spec, "implementations", ref)
    # A torch.library.custom_op wraps an OpOverload; opcheck needs that.
    overload = getattr(fn, "_opoverload", None)
    if overload is None and type(fn).__name__ == "OpOverload":
        overload = fn
    return Implementation(name, fn, overload)


def _resolve_op(spec: OpSpec) -> OpOverload:
    import torch

    namespace, qualified = spec.op.split("::")
    name = qualified.split(".", 1)[0]
    try:
        overload: OpOverload = getattr(getattr(getattr(torch.ops, namespace), name), spec.overload)
        return overload
    except (AttributeError, RuntimeError):
        raise spec.error(
            "op",
            f"an operator {spec.op} registered by load.python or load.sources",
            "no such operator",
            "Check the m.def(...) / torch.library.custom_op name and the namespace.",
        ) from None


def _parse_schema(spec: OpSpec) -> FunctionSchema:
    import torch

    try:
        return torch._C.parse_schema(spec.schema)
    except RuntimeError as exc:
        raise spec.error(
            "schema",
            "a valid operator schema",
            f"{spec.schema!r} ({str(exc).splitlines()[0]})",
            "Write it as `ns::name(Tensor x, float alpha=0.1) -> Tensor`.",
        ) from None


def _check_schema(spec: OpSpec, overload: OpOverload) -> None:
    expected = _parse_schema(spec)
    actual = overload._schema
    if canonical(expected) != canonical(actual):
        raise spec.error(
            "schema",
            f"the registered schema {actual}",
            repr(spec.schema),
            "Update the spec's schema, or the op's definition if the spec is right.",
        )


def _check_inputs(spec: OpSpec, schema_arguments: list[Argument]) -> None:
    """The spec's inputs against the schema's arguments (the spec's own schema: it must match the registered one)."""
    arguments = {a.name: a for a in schema_arguments}
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
        if not is_tensor and isinstance(entry, TensorInput) and spec.samples is None:
            raise spec.error(
                f"inputs.{entry.name}",
                f"`values:` for {arguments[entry.name].type} argument {entry.name}",
                "`shapes:`",
                "Give a non-tensor argument a list of `values:`.",
            )
        if isinstance(entry, ScalarInput):
            _check_dtype_values(spec, entry, arguments[entry.name])
    given = {i.name for i in spec.inputs}
    for name, argument in arguments.items():
        if name not in given and not argument.has_default_value() and spec.samples is None:
            raise spec.error(
                "inputs",
                f"an entry for schema argument {name!r} (it has no default)",
                "none",
                f"Add `{name}:` under inputs, or fix the schema if the op has no argument {name!r}.",
            )


def _check_dtype_values(spec: OpSpec, entry: ScalarInput, argument: Argument) -> None:
    """A ScalarType argument's values name dtypes (case_dtype: the case's), or are None where it is optional; only a
    ScalarType argument takes case_dtype."""
    real_type = str(argument.real_type)
    if "ScalarType" not in real_type:
        if CASE_DTYPE in entry.values:
            raise spec.error(
                f"inputs.{entry.name}",
                f"values of {real_type} argument {entry.name} ({CASE_DTYPE} stands for a ScalarType)",
                repr(CASE_DTYPE),
                f"Use {CASE_DTYPE} for a ScalarType argument only.",
            )
        return
    allowed = (*KNOWN_DTYPES, CASE_DTYPE, *((None,) if real_type.startswith("Optional[") else ()))
    for value in entry.values:
        if value not in allowed:
            raise spec.error(
                f"inputs.{entry.name}",
                f"a dtype name or {CASE_DTYPE} for ScalarType argument {entry.name}",
                repr(value),
                f"List dtypes such as float16, or {CASE_DTYPE} for the dtype under test.",
            )


# ------------------------------------------------------------------------------------------------- samples


def resolve_samples(spec: OpSpec, arguments: list[Argument], make: Callable[..., Any]) -> OpSpec:
    """The spec with its sample function's cases written in: a tensor input per tensor argument the samples give
    (its shapes one per sample, None where an optional one is None; its settings from `inputs.<arg>`), and each
    sample's non-tensor values and name. The samples are made here in float64 on the CPU to plan the matrix, and
    again in another dtype from another seed: what a sample's id and its non-tensor values say must hold for every
    case, which makes them again in its own dtype, on its own device, from its own seed
    (opforge.cases.arguments.sampled_tensors)."""
    import torch

    assert spec.samples is not None
    drawn = _draw_samples(spec, make, torch.float64, 0)
    names = _sample_names(spec, drawn)
    by_name = {a.name: a for a in arguments}
    crossed = {i.name for i in spec.inputs if isinstance(i, ScalarInput)}
    for index, one in enumerate(drawn):
        _check_sample_keys(spec, index, one, arguments, crossed)
    tensor_names = [a.name for a in arguments if any(isinstance(one.get(a.name), torch.Tensor) for one in drawn)]
    for name in tensor_names:
        _check_always_a_tensor(spec, drawn, by_name[name])
    settings = {t.name: t for t in spec.tensor_inputs()}
    for name in settings.keys() - set(tensor_names):
        raise spec.error(
            f"inputs.{name}",
            f"settings of a tensor argument the samples give ({', '.join(tensor_names)})",
            f"{name} ({by_name[name].type}), which no sample gives as a tensor",
            f"Drop inputs.{name}, or give it `values:` if it is a non-tensor argument the samples leave out.",
        )
    again = _draw_samples(spec, make, getattr(torch, SECOND_DRAW_DTYPE), SECOND_DRAW_SEED)
    _sample_names(spec, again)
    order = [a.name for a in arguments]
    values = _planned_values(spec, drawn, again, names, set(tensor_names), order)
    tensors = tuple(_sampled_input(spec, settings.get(n), n, [one[n] for one in drawn]) for n in tensor_names)
    scalars = tuple(i for i in spec.inputs if isinstance(i, ScalarInput))
    planned = replace(spec.samples, values=values, names=names if any(names) else ())
    return replace(spec, inputs=tensors + scalars, samples=planned)


# The second call of a samples function at load, beside the planning one (float64, seed 0): another dtype and seed,
# so that a value computed from the random tensors, or from the dtype, differs and is caught before any case runs.
SECOND_DRAW_DTYPE = "float32"
SECOND_DRAW_SEED = 1


def _draw_samples(spec: OpSpec, make: Callable[..., Any], dtype: torch.dtype, seed: int) -> list[dict[str, Any]]:
    import torch

    assert spec.samples is not None
    try:
        drawn = call_samples(spec, make, dtype, "cpu", torch.Generator().manual_seed(seed))
    except Exception as exc:  # the user's function may raise anything
        raise spec.error(
            "samples",
            f"{spec.samples.ref}(dtype={dtype}, device='cpu', generator=...) to return an iterable of dicts",
            f"it raised {short(exc)}",
            "Fix the function; call it alone with a torch.Generator() to see the traceback.",
        ) from exc
    if not drawn:
        raise spec.error("samples", f"at least one sample from {spec.samples.ref}", "none", "Yield one dict per case.")
    return drawn


def _sample_names(spec: OpSpec, drawn: list[dict[str, Any]]) -> tuple[str, ...]:
    """Each sample's short name (its `_name` key, taken out of the dict), "" where it gives none: unique, and made
    of letters, digits, `_` and `.` (a case id's parts are joined by `-`)."""
    names = tuple(one.pop(SAMPLE_NAME_KEY, "") for one in drawn)
    for index, name in enumerate(names):
        problem = _sample_name_problem(name, names[:index])
        if problem:
            raise spec.error(
                "samples",
                f"sample {index}'s {SAMPLE_NAME_KEY!r} to be {problem}",
                repr(name),
                "Name each sample differently, in letters, digits, `_` and `.`, or leave the name out.",
            )
    return names


def _sample_name_problem(name: Any, earlier: tuple[str, ...]) -> str | None:
    if not isinstance(name, str) or (name and not re.fullmatch(r"[A-Za-z0-9_.]+", name)):
        return "a string of letters, digits, `_` and `.`"
    if re.fullmatch(r"sample\d+", name):
        return "unlike `sampleN`, the id of a sample without a name"
    if name and name in earlier:
        return f"unique (sample {earlier.index(name)} has it too)"
    return None


def _planned_values(
    spec: OpSpec,
    drawn: list[dict[str, Any]],
    again: list[dict[str, Any]],
    names: tuple[str, ...],
    tensors: set[str],
    order: list[str],
) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """Each sample's values in schema order: its non-tensor arguments and the None of an optional tensor it leaves
    out, the same in the second draw (`again`); a value that is the call's own dtype in both draws is CASE_DTYPE. A
    tensor's shape must be the same in both draws too."""
    import torch

    if len(again) != len(drawn):
        raise spec.error(
            "samples",
            f"as many samples from {spec.samples.ref if spec.samples else ''} whatever the seed and dtype",
            f"{len(drawn)} (float64, seed 0) and {len(again)} ({SECOND_DRAW_DTYPE}, seed {SECOND_DRAW_SEED})",
            SAME_VALUES_HINT,
        )
    planned = []
    for index, (first, second) in enumerate(zip(drawn, again)):
        own = []
        for name in (n for n in order if n in first):
            value, other = first[name], second.get(name)
            follows = value is torch.float64 and other is getattr(torch, SECOND_DRAW_DTYPE)
            if not follows and not _same_in_both(value, other, name in tensors):
                label = f"sample {index}" + (f" ({names[index]})" if names[index] else "")
                raise spec.error(
                    "samples",
                    f"{label}'s {name} the same whatever the seed and dtype",
                    f"{_shown(value)} (float64, seed 0) and {_shown(other)} ({SECOND_DRAW_DTYPE}, seed "
                    f"{SECOND_DRAW_SEED})",
                    SAME_VALUES_HINT,
                )
            if name not in tensors or value is None:
                own.append((name, CASE_DTYPE if follows else value))
        planned.append(tuple(own))
    return tuple(planned)


def _same_in_both(value: Any, other: Any, is_tensor: bool) -> bool:
    """A tensor argument's shapes (its values are the case's to draw), any other argument's value."""
    import torch

    if is_tensor and isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
        return value.shape == other.shape
    return same_value(value, other)


def _shown(value: Any) -> str:
    import torch

    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def _check_sample_keys(
    spec: OpSpec, index: int, sample: dict[str, Any], arguments: list[Argument], crossed: set[str]
) -> None:
    """A sample names schema arguments only, each argument without a default (unless `inputs.<arg>.values` gives
    it), and none whose `values:` the spec crosses with the samples."""
    names = [a.name for a in arguments]
    for key in sample:
        if key not in names:
            raise spec.error(
                "samples",
                f"sample {index} to name schema arguments ({', '.join(names)})",
                f"unknown key {key!r}",
                f"Rename or drop {key!r} in the dicts {spec.samples.ref if spec.samples else ''} returns.",
            )
        if key in crossed:
            raise spec.error(
                "samples",
                f"sample {index} to leave {key!r} to inputs.{key}.values",
                f"a value for {key!r} in the sample too",
                f"Set {key!r} in the samples or in inputs.{key}.values, not both.",
            )
    for argument in arguments:
        if argument.name not in sample and argument.name not in crossed and not argument.has_default_value():
            raise spec.error(
                "samples",
                f"sample {index} to give every schema argument without a default",
                f"no {argument.name!r}",
                f"Add {argument.name!r} to each sample, or give it `values:` under inputs.",
            )


def _check_always_a_tensor(spec: OpSpec, drawn: list[dict[str, Any]], argument: Argument) -> None:
    """A tensor argument is one in every sample; an optional one (`Tensor?`) may be None in some."""
    import torch

    name = argument.name
    optional = str(argument.real_type).startswith("Optional[")
    kinds = [isinstance(one.get(name), torch.Tensor) or (optional and one.get(name) is None) for one in drawn]
    if not all(kinds):
        index = kinds.index(False)
        raise spec.error(
            "samples",
            f"{name!r} a tensor in every sample{' (or None: it is optional)' if optional else ''} (it is one in "
            f"sample {next(i for i, one in enumerate(drawn) if isinstance(one.get(name), torch.Tensor))})",
            f"{type(drawn[index].get(name)).__name__} in sample {index}",
            "Give it a tensor in every sample; only an optional tensor (`Tensor?`) may be None.",
        )


def _sampled_input(
    spec: OpSpec, entry: TensorInput | None, name: str, values: list[torch.Tensor | None]
) -> TensorInput:
    """The tensor input `name` with one shape per sample (None where an optional one is None). A tensor the samples
    make in an integer or bool dtype (an index, a mask) keeps that dtype in every case, like `inputs.<arg>.dtype`,
    unless `inputs.<arg>.dtype` is case_dtype."""
    made = [v for v in values if v is not None]
    kinds = {str(v.dtype).removeprefix("torch.") for v in made if not (v.is_floating_point() or v.is_complex())}
    if kinds and len({v.dtype for v in made}) > 1:
        raise spec.error(
            "samples",
            f"{name!r} in one dtype in every sample, or floating in every sample",
            ", ".join(sorted({str(v.dtype).removeprefix("torch.") for v in made})),
            "Make an index or mask tensor in one dtype in every sample.",
        )
    base = entry or TensorInput(name=name, shapes=(), low=-1.0, high=1.0, requires_grad=False)
    pinned = base.dtype or (kinds.pop() if kinds and not base.follows_case_dtype else None)
    return replace(base, shapes=tuple(None if v is None else tuple(v.shape) for v in values), dtype=pinned)
