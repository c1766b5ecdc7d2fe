"""`opforge scan NS`: what the ops registered in a namespace have and lack, read from the dispatcher and the schemas
without running a kernel: each op's kernels by dispatch key, whether it has a fake kernel, an autograd formula and a
vmap rule, what its schema says it writes or aliases, and which specs of a directory name it (and how many results
their last `opforge check` ran).

Three flags, each read statically (docs/scan.md says exactly what each one can and cannot see):

- `no-fake`: no fake kernel (torch.library.register_fake), no Meta kernel and no composite kernel, and not an op
  FakeTensor makes the result of itself (one that returns nothing and marks a write, or is tagged out or inplace),
  so torch.compile, torch.export and FakeTensor cannot trace the op.
- `cuda-without-cpu`: a CUDA kernel and no CPU one (nor a composite one that serves CPU).
- `undeclared-mutation`: the op looks like it writes an argument (its name ends in one `_`; it is an `out`
  overload; it is named `..._out` or `...Out` and takes a Tensor `out`, `output` or `out_...`; it has a
  keyword-only Tensor `out...`; or it returns nothing and torch.compile's dead-code elimination would drop it)
  while its schema marks no argument written (`Tensor(a!)`). A kernel that writes an input its schema leaves
  unmarked, under a name that says nothing, is only seen by running it (opcheck).

What is read where (torch 2.13): the kernels from `torch._C._dispatch_has_kernel_for_dispatch_key` (a kernel
registered for that very key, alias keys such as Autograd and CompositeImplicitAutograd included); a Python fake
kernel from torch's simple registry (`register_fake` on an op defined with torch.library.Library, or on a C++ op, also
registers a Meta kernel); an op made with torch.library.custom_op registers Meta and Autograd kernels whether or not
a fake kernel or a formula was given, so for those the CustomOpDef says what was registered.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from opforge.core.errors import UsageError
from opforge.spec.model import SPEC_SUFFIXES

# The dispatch keys looked up for each op. An op's own kernel for a key; a composite one serves several.
KERNEL_KEYS = (
    "CPU",
    "CUDA",
    "Meta",
    "Autograd",
    "AutogradCPU",
    "AutogradCUDA",
    "AutogradOther",
    "CompositeImplicitAutograd",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
    "FuncTorchBatched",
    "QuantizedCPU",
    "QuantizedCUDA",
    "SparseCPU",
    "SparseCUDA",
)
CIA = "CompositeImplicitAutograd"
CEA = "CompositeExplicitAutograd"
REGISTER_FAKE = "register_fake"
# FakeTensor's own result for an op that returns nothing and marks a write, or carries Tag.out or Tag.inplace.
TRIVIAL_FAKE = "trivial"
REGISTER_AUTOGRAD = "register_autograd"
REGISTER_VMAP = "register_vmap"


class FlagKind(str, Enum):
    NO_FAKE = "no-fake"
    CUDA_WITHOUT_CPU = "cuda-without-cpu"
    UNDECLARED_MUTATION = "undeclared-mutation"


@dataclass(frozen=True)
class Flag:
    kind: FlagKind
    # Why this op is flagged, in its own terms (which name, which argument, which module).
    message: str


@dataclass(frozen=True)
class Coverage:
    """A spec that names the op, and its last `opforge check` run here (None: no run recorded)."""

    spec: str
    results: int | None = None
    failed: int | None = None


@dataclass(frozen=True)
class LastRun:
    """What the last `opforge check` of a spec ran (opforge.reporters.lastfailed keeps it)."""

    results: int
    failed: int


@dataclass(frozen=True)
class ScannedOp:
    name: str  # ns::op, or ns::op.overload for an overload other than the default
    schema: str | None  # None: kernels registered for a name no schema defines
    kernels: tuple[str, ...]  # the KERNEL_KEYS with a kernel of this op's own
    cpu: str | None  # the dispatch key whose kernel runs on CPU tensors (CPU, a composite one), None if none
    cuda: str | None
    fake: str | None  # register_fake, Meta, or a composite key; None: no fake kernel
    autograd: str | None  # Autograd (or AutogradCPU...), register_autograd, CompositeImplicitAutograd; None: none
    vmap: str | None  # FuncTorchBatched, register_vmap, CompositeImplicitAutograd; None: none
    writes: tuple[str, ...]  # arguments the schema marks written (Tensor(a!))
    aliases: tuple[str, ...]  # arguments the schema marks aliased, not written (Tensor(a): views)
    custom_op: bool  # made with torch.library.custom_op
    flags: tuple[Flag, ...]
    specs: tuple[Coverage, ...] | None = None  # None: no --specs directory was given

    @property
    def short_name(self) -> str:
        return self.name.split("::", 1)[1]

    def flagged(self, kind: FlagKind) -> bool:
        return any(f.kind == kind for f in self.flags)


@dataclass(frozen=True)
class Scan:
    namespace: str
    imported: tuple[str, ...]
    specs_dir: str | None
    ops: tuple[ScannedOp, ...]
    import_seconds: float
    scan_seconds: float
    unreadable_specs: tuple[str, ...] = ()

    @property
    def flagged(self) -> tuple[ScannedOp, ...]:
        return tuple(op for op in self.ops if op.flags)

    def count(self, kind: FlagKind) -> int:
        return sum(op.flagged(kind) for op in self.ops)

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "opforge",
            "kind": "scan",
            "namespace": self.namespace,
            "imported": list(self.imported),
            "specs_dir": self.specs_dir,
            "import_seconds": round(self.import_seconds, 3),
            "scan_seconds": round(self.scan_seconds, 3),
            "counts": {"ops": len(self.ops), "flagged": len(self.flagged)}
            | {kind.value: self.count(kind) for kind in FlagKind},
            "unreadable_specs": list(self.unreadable_specs),
            "ops": [_op_json(op) for op in self.ops],
        }


def _op_json(op: ScannedOp) -> dict[str, Any]:
    data = asdict(op)
    data["flags"] = [{"kind": f.kind.value, "message": f.message} for f in op.flags]
    return data


def scan(
    namespace: str,
    imports: Sequence[str] = (),
    specs_dir: Path | None = None,
    last_runs: Mapping[Path, LastRun] | None = None,
) -> Scan:
    """Import `imports` (the modules that register the namespace's ops), then scan every op of `namespace`.

    `last_runs` maps a spec's resolved path to its last run (opforge.reporters.lastfailed.last_runs)."""
    namespace = namespace.strip().removesuffix("::")
    started = time.perf_counter()
    import torch  # noqa: F401 (the dispatcher's own ops are registered on import)

    _import_all(imports)
    imported_at = time.perf_counter()
    names = _op_names(namespace)
    if not names:
        raise _no_ops(namespace, imports)
    covering: dict[str, list[Path]] = {}
    unreadable: list[str] = []
    if specs_dir is not None:
        covering, unreadable = _specs_by_op(specs_dir)
    schemas = _schemas(namespace)
    ops = tuple(
        _scan_op(name, schemas.get(name), covering.get(name, []) if specs_dir is not None else None, last_runs or {})
        for name in names
    )
    return Scan(
        namespace,
        tuple(imports),
        str(specs_dir) if specs_dir is not None else None,
        ops,
        imported_at - started,
        time.perf_counter() - imported_at,
        tuple(unreadable),
    )


# ----------------------------------------------------------------------------------------------- finding the ops


def _import_all(modules: Sequence[str]) -> None:
    """Import each module as `python -c` would: the current directory first on the path."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(
                f"--import {module}",
                "a module Python can import",
                f"{type(exc).__name__}: {exc}",
                "Install it, or run from the directory that holds it (or add that directory to PYTHONPATH).",
            ) from None
        except Exception as exc:  # the module's own code failed: that is what the user can act on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UsageError(
                f"--import {module}",
                "the module to import cleanly",
                f"{type(exc).__name__}: {first}",
                "Fix the error it raises on import (run `python -c 'import " + module + "'` to see the traceback).",
            ) from None


def _op_names(namespace: str) -> list[str]:
    import torch

    prefix = f"{namespace}::"
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))


def _no_ops(namespace: str, imports: Sequence[str]) -> UsageError:
    import torch

    namespaces = sorted({n.split("::", 1)[0] for n in torch._C._dispatch_get_all_op_names()})
    close = difflib.get_close_matches(namespace, namespaces, n=3)
    after = f" after importing {', '.join(imports)}" if imports else ""
    near = f" Namespaces with ops now include {', '.join(close)}." if close else ""
    return UsageError(
        f"scan {namespace}",
        f"operators registered in namespace {namespace!r}",
        f"none{after}",
        "Pass --import MODULE for the module that registers them (e.g. opforge scan fbgemm --import fbgemm_gpu)."
        + near,
    )


def _schemas(namespace: str) -> dict[str, Any]:
    """Op name (ns::op or ns::op.overload) -> its FunctionSchema."""
    import torch

    prefix = f"{namespace}::"
    found = {}
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith(prefix):
            found[schema.name + (f".{schema.overload_name}" if schema.overload_name else "")] = schema
    return found


def _custom_op(qualname: str) -> Any:
    """The CustomOpDef of an op made with torch.library.custom_op, else None (a private registry: guarded)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # pragma: no cover: present in every torch opforge supports
        return None
    return OPDEFS.get(qualname)


def _python_fake_kernel(qualname: str) -> bool:
    try:
        from torch._library.simple_registry import singleton
    except ImportError:  # pragma: no cover
        return False
    return singleton.find(qualname).fake_impl.kernel is not None


# ----------------------------------------------------------------------------------------------- one op


def _scan_op(name: str, schema: Any, specs: list[Path] | None, last_runs: Mapping[Path, LastRun]) -> ScannedOp:
    import torch

    qualname, _, overload = name.partition(".")
    kernels = tuple(k for k in KERNEL_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(name, k))
    has = set(kernels)
    custom = _custom_op(qualname) if not overload else None

    def serving(backend: str) -> str | None:
        return backend if backend in has else CEA if CEA in has else CIA if CIA in has else None

    trivial = TRIVIAL_FAKE if _trivial_fake(name) else None
    if custom is not None:
        # custom_op registers its own Meta and Autograd kernels, which raise when nothing was registered behind them.
        fake = REGISTER_FAKE if custom._abstract_fn is not None else trivial
        autograd = REGISTER_AUTOGRAD if custom._backward_fn is not None else None
        vmap = REGISTER_VMAP if custom._vmap_fn is not None else None
    else:
        fake = (
            REGISTER_FAKE
            if _python_fake_kernel(name)
            else "Meta"
            if "Meta" in has
            else CIA
            if CIA in has
            else CEA
            if CEA in has
            else trivial
        )
        own_autograd = [k for k in kernels if k.startswith("Autograd")]
        autograd = (
            "Autograd" if "Autograd" in has else "+".join(own_autograd) if own_autograd else CIA if CIA in has else None
        )
        vmap = "FuncTorchBatched" if "FuncTorchBatched" in has else CIA if CIA in has else None
    writes, aliases = _alias_annotations(schema)
    op = ScannedOp(
        name=name,
        schema=str(schema) if schema is not None else None,
        kernels=kernels,
        cpu=serving("CPU"),
        cuda=serving("CUDA"),
        fake=fake,
        autograd=autograd,
        vmap=vmap,
        writes=writes,
        aliases=aliases,
        custom_op=custom is not None,
        flags=(),
        specs=None if specs is None else tuple(_coverage(p, last_runs) for p in specs),
    )
    return _with_flags(op, schema, overload)


def _trivial_fake(name: str) -> bool:
    """Whether FakeTensor makes the op's result itself, needing no fake kernel (torch._library.utils): an op that
    returns nothing and marks an argument written, or is tagged out or inplace."""
    import torch

    qualname, _, overload = name.partition(".")
    namespace, base = qualname.split("::", 1)
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
        return bool(torch._library.utils.can_generate_trivial_fake_impl(op))
    except (AttributeError, RuntimeError, AssertionError):
        return False


def _alias_annotations(schema: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if schema is None:
        return (), ()
    writes = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    aliases = tuple(a.name for a in schema.arguments if a.alias_info is not None and not a.alias_info.is_write)
    return writes, aliases


def _with_flags(op: ScannedOp, schema: Any, overload: str) -> ScannedOp:
    from dataclasses import replace

    flags = []
    if op.fake is None:
        flags.append(Flag(FlagKind.NO_FAKE, _no_fake_message(op)))
    if op.cuda is not None and op.cpu is None:
        autograd = [k for k in op.kernels if k.startswith("Autograd")]
        where = (
            f"its {autograd[0]} kernel runs first and may serve CPU tensors itself, but under torch.inference_mode "
            "(which skips it) CPU tensors reach no kernel"
            if autograd
            else "on CPU tensors it raises NotImplementedError"
        )
        flags.append(Flag(FlagKind.CUDA_WITHOUT_CPU, f"a CUDA kernel and no CPU or composite kernel: {where}"))
    looks = _looks_mutating(op.name.partition(".")[0], overload, schema)
    if looks is not None and not op.writes:
        flags.append(Flag(FlagKind.UNDECLARED_MUTATION, f"{looks}; its schema marks no argument written"))
    return replace(op, flags=tuple(flags))


def _no_fake_message(op: ScannedOp) -> str:
    """Where the fake kernel could have been: a C++ op may name the Python module that registers it (a pystub). An
    op whose only kernel is an Autograd one runs it on fake tensors too (outside torch.inference_mode): what it calls
    decides whether that traces."""
    import torch

    message = "no register_fake, Meta or composite kernel"
    if op.kernels and all(k.startswith("Autograd") for k in op.kernels):
        message += "; its only kernel is Autograd, which fake tensors reach outside torch.inference_mode"
    qualname, _, overload = op.name.partition(".")
    try:
        stub = torch._C._dispatch_pystub(qualname, overload)
    except (AttributeError, RuntimeError):
        stub = None
    if stub:
        module = stub[0]
        state = "imported, and it registers none for this op" if module in sys.modules else "not imported"
        message += f"; its C++ registration names {module} for one ({state})"
    return message


def _looks_mutating(qualname: str, overload: str, schema: Any) -> str | None:
    """Why an op's name or schema says it writes an argument, or None. Read from the name and schema alone: the
    conventions of ATen (`add_`, `add.out`, `out=`) and of C++ libraries (`fooOut(Tensor output, ...)`).

    A name's `_out` alone is not enough, nor a positional argument's `out` or `output` alone: fbgemm_gpu 1.8.0's sll
    ops end in `_jagged_out` (their result is jagged) and write nothing; ten of its ops read an `output` or
    `output_offsets` argument (a backward's forward output, the offsets of the output to build), as ATen's attention
    backwards read `Tensor out`. Its three ops named ...Out or ..._out that take `Tensor output` write it. An op that
    returns nothing is flagged only when torch.compile would drop it (torch keeps its own checks, `_assert_async`,
    and ops registered as effectful)."""
    if schema is None:
        return None
    base = qualname.split("::", 1)[1]
    if base.endswith("_") and not base.endswith("__"):
        return "named in-place (ends in '_')"
    if overload == "out" or overload.endswith("_out"):
        return f"an out overload (.{overload})"
    tensors = [a for a in schema.arguments if _is_tensor(a)]
    buffers = [a.name for a in tensors if a.name in ("out", "output") or a.name.startswith(("out_", "output_"))]
    suffix = "_out" if base.endswith("_out") else "Out" if base.endswith("Out") and base[:-3][-1:].islower() else ""
    if suffix and buffers:
        return f"named as an out variant (ends in {suffix}) and takes Tensor {buffers[0]}"
    outs = [a.name for a in tensors if a.kwarg_only and a.name.startswith("out")]
    if outs:
        return f"an out= argument ({', '.join(outs)})"
    if not schema.returns and tensors and not _impure(qualname, overload):
        return (
            "it returns nothing and torch.compile drops it as dead code (if it only checks, register it as effectful)"
        )
    return None


def _impure(qualname: str, overload: str) -> bool:
    """Whether torch.compile's dead-code elimination keeps the op though nothing uses its result
    (torch._library.utils.is_impure: a mutable schema, an effect registered, torch's own side-effectful ops)."""
    import torch

    namespace, base = qualname.split("::", 1)
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
        return bool(torch._library.utils.is_impure(op))
    except (AttributeError, RuntimeError, AssertionError, ImportError):
        return False


def _is_tensor(argument: Any) -> bool:
    import torch

    kind = argument.type
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    if isinstance(kind, torch._C.ListType):
        kind = kind.getElementType()
    return isinstance(kind, torch._C.TensorType)


# ----------------------------------------------------------------------------------------------- specs


def _specs_by_op(directory: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """Op name -> the spec files under `directory` (recursively) whose `op:` names it. Only the `op:` key is read,
    so a spec that `opforge check` would refuse still counts as covering its op. YAML files that do not parse are
    returned too; YAML without an `op:` string is no spec and skipped."""
    if not directory.is_dir():
        raise UsageError(
            f"--specs {directory}",
            "a directory of spec files",
            "no such directory" if not directory.exists() else "a file",
            "Pass the directory that holds your specs (searched recursively).",
        )
    found: dict[str, list[Path]] = {}
    unreadable = []
    for path in sorted(p for p in directory.rglob("*") if p.suffix in SPEC_SUFFIXES and p.is_file()):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            unreadable.append(str(path))
            continue
        op = data.get("op") if isinstance(data, dict) else None
        if isinstance(op, str) and "::" in op:
            found.setdefault(op.strip().removesuffix(".default"), []).append(path)
    return found, unreadable


def _coverage(path: Path, last_runs: Mapping[Path, LastRun]) -> Coverage:
    run = last_runs.get(path.resolve())
    return Coverage(str(path), run.results if run else None, run.failed if run else None)
