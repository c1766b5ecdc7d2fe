"""What `opforge record` runs inside the recorded program: the calls of custom operators, written as they come.

Self-contained (the standard library, and torch once the program imports it): `opforge record` copies this file
beside a `sitecustomize.py` that it puts first on COMMAND's PYTHONPATH, so every Python process COMMAND starts
(children too, whatever their interpreter, opforge installed there or not) runs it at startup. It does nothing
until the program imports torch; then it makes each operator packet of a recorded namespace (`torch.ops.<ns>.<op>`)
and its overloads (`.default`, what `torch.library.custom_op` functions call) an instance of a subclass whose
`__call__` notes the call first, then calls the op exactly as before. aten and torch's own namespaces are never
touched, so the program's ordinary tensor code runs at full speed.

A call is kept when it is new for its op (dtypes, shapes, strides, storage offset, device, requires_grad and the
non-tensor arguments: `call_key`) and the op has fewer than OPFORGE_RECORD_MAX_CALLS kept: its arguments are
written, by schema name, with the values of every tensor of at most OPFORGE_RECORD_MAX_ELEMENTS elements (integer
tensors: INTEGER_FACTOR times that; beyond it, its metadata and a summary), to a file of its own, written before the
op runs (a call that crashes the process is kept) and renamed into place (a crash never leaves half a file).

Not recorded: a call made while another recorded call runs (a custom op whose Python implementation calls another
custom op: the outer call is what the program made), calls on tensors that are not plain tensors (FakeTensor,
functional tensors while torch.compile traces, meta tensors), and every call in a process that is opforge checking
an op (opforge.building.op pauses the recording when it loads one).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from torch import Tensor
    from torch._C import FunctionSchema
    from torch._ops import OpOverload, OpOverloadPacket

ENV_DIR = "OPFORGE_RECORD_DIR"
ENV_NAMESPACES = "OPFORGE_RECORD_NAMESPACES"
ENV_MAX_CALLS = "OPFORGE_RECORD_MAX_CALLS"
ENV_MAX_ELEMENTS = "OPFORGE_RECORD_MAX_ELEMENTS"
DEFAULT_MAX_CALLS = 5
# Per floating tensor: 65,536 elements (256 KiB of float32). Integer tensors (indices, lengths, offsets) carry the
# structure an op's other inputs follow, which a summary cannot give back: they keep 16 times as many.
DEFAULT_MAX_ELEMENTS = 1 << 16
INTEGER_FACTOR = 16
FORMAT = "opforge-recorded-call/1"
# Namespaces of torch itself: never recorded, even when no --namespace is given.
TORCH_NAMESPACES = frozenset(
    {
        "aten",
        "prim",
        "prims",
        "rngprims",
        "debugprims",
        "quantized",
        "_quantized",
        "quantized_decomposed",
        "profiler",
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "c10d_functional",
        "_dtensor",
        "inductor",
        "higher_order",
        "mkldnn",
        "mkl",
        "onednn",
        "_inductor_test",
        "_test",
        "cuda",
        "fsdp",
        "streams",
        "_export",
        "export",
        "mps",
        "xpu",
        "torchao",
        "triton",
    }
)

_local = threading.local()
_lock = threading.Lock()
_state: dict[str, Any] = {"paused": False, "installed": False, "seq": 0}
# Per op overload (`ns::op.overload`): the keys of the calls kept.
_kept: dict[str, set[Any]] = {}
# Per namespace: the module that registered its ops, as far as it could be told (`_registering_module`).
_modules: dict[str, str] = {}


def pause() -> None:
    """Record nothing more in this process (opforge checking an op: its own calls are no program's)."""
    _state["paused"] = True


def _settings() -> dict[str, Any]:
    namespaces = [n for n in os.environ.get(ENV_NAMESPACES, "").split(",") if n]
    return {
        "dir": os.environ.get(ENV_DIR, ""),
        "namespaces": frozenset(namespaces),
        "max_calls": int(os.environ.get(ENV_MAX_CALLS, DEFAULT_MAX_CALLS)),
        "max_elements": int(os.environ.get(ENV_MAX_ELEMENTS, DEFAULT_MAX_ELEMENTS)),
    }


def recorded_namespace(namespace: str, chosen: frozenset[str]) -> bool:
    if chosen:
        return namespace in chosen
    return namespace not in TORCH_NAMESPACES


# ------------------------------------------------------------------------------------------- installing


class _TorchFinder:
    """A meta path finder that installs the recording once `torch` has been imported (torch is not imported here:
    a program that never imports it pays nothing)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "torch":
            return None
        import importlib.machinery

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                install()
            except Exception as exc:  # never break the program
                _warn(f"could not install the recording: {exc!r}")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_from_environment() -> None:
    """Called from the sitecustomize `opforge record` writes: install now if torch is imported, else once it is."""
    if not os.environ.get(ENV_DIR):
        return
    if "torch" in sys.modules:
        install()
    else:
        sys.meta_path.insert(0, _TorchFinder())


def install() -> None:
    import torch._ops as ops

    if _state["installed"]:
        return
    _state["installed"] = True
    settings = _settings()
    _state.update(settings)
    original_getattr = ops._OpNamespace.__getattr__

    def namespace_getattr(self: Any, op_name: str) -> Any:
        packet = original_getattr(self, op_name)
        _convert_packet(packet)
        return packet

    ops._OpNamespace.__getattr__ = namespace_getattr  # type: ignore[method-assign]
    for namespace in list(getattr(ops.ops, "_dir", [])):
        holder = getattr(ops.ops, namespace, None)
        for op_name in list(getattr(holder, "_dir", [])):
            _convert_packet(getattr(holder, op_name, None))
    _watch_registrations()


def _convert_packet(packet: object) -> None:
    import torch._ops as ops

    if type(packet) is not ops.OpOverloadPacket:
        return
    namespace = packet._qualified_op_name.split("::", 1)[0]
    if not recorded_namespace(namespace, _state["namespaces"]):
        return
    packet.__class__ = _packet_class()
    for overload_name in list(packet._dir):
        _convert_overload(getattr(packet, overload_name, None))


def _convert_overload(overload: object) -> None:
    import torch._ops as ops

    if type(overload) is ops.OpOverload:
        overload.__class__ = _overload_class()


_classes: dict[str, type] = {}


def _packet_class() -> type:
    if "packet" not in _classes:
        import torch._ops as ops

        class RecordingPacket(ops.OpOverloadPacket):
            """An operator packet whose calls are noted (opforge record)."""

            def __getattr__(self, key: str) -> Any:
                found = super().__getattr__(key)
                _convert_overload(found)
                return found

            def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
                if _recording():
                    _note_packet_call(self, args, kwargs)
                return _guarded(ops.OpOverloadPacket.__call__, self, args, kwargs)

        _classes["packet"] = RecordingPacket
    return _classes["packet"]


def _overload_class() -> type:
    if "overload" not in _classes:
        import torch._ops as ops

        class RecordingOverload(ops.OpOverload):
            """An operator overload whose calls are noted (opforge record)."""

            def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
                if _recording():
                    _note(self, args, kwargs)
                return _guarded(ops.OpOverload.__call__, self, args, kwargs)

        _classes["overload"] = RecordingOverload
    return _classes["overload"]


def _recording() -> bool:
    return not _state["paused"] and not getattr(_local, "depth", 0)


def _guarded(call: Any, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The op's call, with calls it makes to other recorded ops left out."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        return call(op, *args, **kwargs)
    finally:
        _local.depth -= 1


def _watch_registrations() -> None:
    """Which module registers each namespace: the caller of torch.ops.load_library (an extension package's
    __init__) and of torch.library.Library (a Python registration: custom_op, torch.library.define)."""
    import torch
    import torch.library as library

    load_library: Callable[[str | os.PathLike[str]], None] = torch.ops.load_library

    def recording_load_library(path: str | os.PathLike[str]) -> None:
        module = _calling_module()
        before = _op_namespaces()
        try:
            return load_library(path)
        finally:
            for namespace in _op_namespaces() - before:
                _modules.setdefault(namespace, module)

    torch.ops.load_library = recording_load_library  # type: ignore[method-assign]
    original_init: Callable[..., None] = library.Library.__init__

    def library_init(self: Any, ns: str, kind: str, *args: Any, **kwargs: Any) -> None:
        original_init(self, ns, kind, *args, **kwargs)
        if kind in ("DEF", "FRAGMENT"):
            _modules.setdefault(ns, _calling_module())

    library.Library.__init__ = library_init  # type: ignore[method-assign]


def _op_namespaces() -> set[str]:
    import torch

    return {name.split("::", 1)[0] for name in torch._C._dispatch_get_all_op_names()}


def _calling_module() -> str:
    """The module of the innermost frame outside torch and this file: who asked for the registration."""
    frame = sys._getframe(1)
    here = os.path.dirname(os.path.abspath(__file__))
    while frame is not None:
        filename = frame.f_code.co_filename
        name = frame.f_globals.get("__name__", "")
        if not (
            name == "torch"
            or name.startswith(("torch.", "importlib", "_frozen_importlib"))
            or os.path.dirname(os.path.abspath(filename)) == here
            or filename.startswith("<frozen")
        ):
            return str(name)
        frame = frame.f_back  # type: ignore[assignment]
    return ""


# ------------------------------------------------------------------------------------------- recording


def _note_packet_call(packet: OpOverloadPacket, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A call through the packet (`torch.ops.ns.op(...)`): its overload is the one the dispatcher resolves."""
    import torch

    names = packet._overload_names
    try:
        name = names[0] if len(names) == 1 else torch._C._jit_resolve_packet(packet._qualified_op_name, *args, **kwargs)
        overload = getattr(packet, name or "default")
    except Exception:
        return
    _note(overload, args, kwargs)


def _note(overload: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        _note_call(overload, args, kwargs)
    except Exception as exc:  # a recording bug must never change the program
        _warn(f"could not record a call of {overload}: {exc!r}")


def _note_call(overload: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    schema = overload._schema
    bound = _bind(schema, args, kwargs)
    if bound is None or not _plain(bound):
        return
    qualname = f"{schema.name}.{overload._overloadname}"
    key = call_key(bound)
    with _lock:
        kept = _kept.setdefault(qualname, set())
        if key in kept or len(kept) >= _state["max_calls"]:
            return
        kept.add(key)
        _state["seq"] += 1
        seq = _state["seq"]
    namespace = schema.name.split("::", 1)[0]
    module = _modules.get(namespace) or _calling_module()
    record = {
        "format": FORMAT,
        "op": schema.name,
        "overload": overload._overloadname,
        "schema": str(schema),
        "argument_names": [a.name for a in schema.arguments],
        "module": module,
        "module_file": getattr(sys.modules.get(module), "__file__", None) or "",
        "arguments": {name: encode(value, _state["max_elements"]) for name, value in bound.items()},
        "argv": list(sys.argv),
        "pid": os.getpid(),
    }
    _write(record, seq)


def _bind(schema: FunctionSchema, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by schema name (those it gives: a default it leaves out stays out)."""
    names = [a.name for a in schema.arguments]
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names or name in bound:
            return None
        bound[name] = value
    return bound


def _plain(bound: dict[str, Any]) -> bool:
    """Only calls on plain tensors with data: not FakeTensor, functional or meta tensors (torch.compile tracing)."""
    import torch

    for tensor in _tensors(bound):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.device.type == "meta":
            return False
    return True


def _tensors(value: object) -> list[Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def call_key(bound: dict[str, Any]) -> Any:
    """What makes two calls of an op distinct: each tensor's dtype, shape, strides, storage offset, device and
    requires_grad, and every other argument's value."""
    return tuple((name, _value_key(value)) for name, value in bound.items())


def _value_key(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            str(value.dtype),
            tuple(value.shape),
            tuple(value.stride()),
            value.storage_offset(),
            str(value.device),
            value.requires_grad,
        )
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_value_key(v) for v in value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, repr(value))


def encode(value: Any, max_elements: int) -> Any:
    """An argument as the calls file keeps it (docs/record.md, "The calls file")."""
    import torch

    if isinstance(value, torch.Tensor):
        floating = value.is_floating_point() or value.is_complex()
        limit = max_elements if floating else max_elements * INTEGER_FACTOR
        kept = value.numel() <= limit
        return {
            "kind": "tensor",
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "storage_offset": value.storage_offset(),
            "device": value.device.type,
            "requires_grad": bool(value.requires_grad),
            "values": value.detach().to("cpu", copy=True).contiguous() if kept else None,
            "summary": None if kept else summary(value),
        }
    if isinstance(value, (list, tuple)):
        return {"kind": "list", "items": [encode(v, max_elements) for v in value]}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"kind": "device", "name": str(value)}
    if isinstance(value, (torch.memory_format, torch.layout)):
        return {"kind": "repr", "name": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"kind": "repr", "name": repr(value)}


def summary(value: Any) -> dict[str, Any]:
    """What a tensor too large to keep is remembered by: its range, mean and spread over the finite values, how many
    are NaN or infinite, and whether it is sorted (offsets are)."""
    import torch

    flat = value.detach().reshape(-1).to("cpu")
    wide = flat.to(torch.float64) if not flat.is_complex() else flat.real.to(torch.float64)
    finite = wide[torch.isfinite(wide)]
    if finite.numel():
        low, high = float(finite.min()), float(finite.max())
        mean, std = float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0
    else:
        low = high = mean = std = 0.0
    return {
        "min": low,
        "max": high,
        "mean": mean,
        "std": std,
        "nan": int(torch.isnan(wide).sum()),
        "posinf": int((wide == math.inf).sum()),
        "neginf": int((wide == -math.inf).sum()),
        "sorted": bool(flat.numel() < 2 or bool((wide[1:] >= wide[:-1]).all())),
    }


def _write(record: dict[str, Any], seq: int) -> None:
    """The call as `<stem>.pt` (torch.save: the values) and then `<stem>.json` (what it is, without the values:
    what `opforge record` merges and writes the spec from without importing torch). A call whose .json is missing
    (the process died between the two) is left out."""
    import json

    import torch

    directory = _state["dir"]
    os.makedirs(directory, exist_ok=True)
    stem = f"{time.time_ns():020d}-{os.getpid()}-{seq:06d}"
    temporary = os.path.join(directory, f".{stem}.tmp")
    torch.save(record, temporary)
    os.replace(temporary, os.path.join(directory, f"{stem}.pt"))
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump({**record, "arguments": _described(record["arguments"])}, out)
    os.replace(temporary, os.path.join(directory, f"{stem}.json"))


def _described(value: Any) -> Any:
    """An encoded value with each tensor's values replaced by True (kept) or None (a summary instead)."""
    if isinstance(value, dict) and value.get("kind") == "tensor":
        return {**value, "values": True if value["values"] is not None else None}
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_described(v) for v in value]
    return value


def _warn(message: str) -> None:
    try:
        with open(os.path.join(_state.get("dir") or ".", f"warnings-{os.getpid()}.txt"), "a") as log:
            log.write(message + "\n")
    except OSError:
        pass
