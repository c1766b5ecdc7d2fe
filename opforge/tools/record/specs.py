"""From the calls a recording wrote (opforge.tools.record.hook) to one spec and one calls file per op.

The calls of every process are merged in the order they were made, the first `max_calls` distinct ones of each op
(overload) kept. Each spec is one `opforge check` and `opforge fuzz` run as written (docs/record.md): its schema from
the registration, its samples the recorded calls (opforge.recorded), the dtypes and devices seen as claimed, no
reference (the op itself on contiguous float64: opforge.building.self_reference), and a comment per key saying what to
refine.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.recorded import CALLS_FORMAT, INDEX
from opforge.tools.record.hook import FORMAT

FLOATING = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64")
# Claimed dtypes in the order specs list them.
DTYPE_ORDER = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclass(frozen=True)
class OpCalls:
    """One op overload's recorded calls, in the order they were made (at most max_calls distinct ones): each call's
    description (its .json: the arguments without their values) and the file holding its values (its .pt)."""

    op: str
    overload: str
    schema: str
    argument_names: tuple[str, ...]
    module: str
    module_file: str
    calls: tuple[dict[str, Any], ...]
    files: tuple[Path, ...]

    @property
    def qualified(self) -> str:
        return self.op if self.overload == "default" else f"{self.op}.{self.overload}"

    @property
    def stem(self) -> str:
        return self.qualified.replace("::", ".")


@dataclass(frozen=True)
class WrittenSpec:
    op: str
    spec: Path
    calls_file: Path
    calls: int


def read_recording(directory: Path, max_calls: int) -> list[OpCalls]:
    """Every op's calls from the files of every recorded process, merged: the first max_calls distinct calls of
    each, in the order they were made (the files are named by time, process and sequence). Read from the calls'
    .json descriptions alone: no torch here. A call without its .json, or whose files cannot be read, is left out."""
    by_op: dict[str, list[tuple[dict[str, Any], Path]]] = {}
    keys: dict[str, set[Any]] = {}
    for path in sorted(directory.glob("*.json")):
        values = path.with_suffix(".pt")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("format") != FORMAT or not values.exists():
            continue
        name = f"{record['op']}.{record['overload']}"
        key = _key(record["arguments"])
        seen = keys.setdefault(name, set())
        if key in seen or len(seen) >= max_calls:
            continue
        seen.add(key)
        by_op.setdefault(name, []).append((record, values))
    found = []
    for records in by_op.values():
        first = records[0][0]
        found.append(
            OpCalls(
                first["op"],
                first["overload"],
                first["schema"],
                tuple(first["argument_names"]),
                first["module"],
                first["module_file"],
                tuple(r for r, _ in records),
                tuple(f for _, f in records),
            )
        )
    return sorted(found, key=lambda o: o.qualified)


def _key(arguments: dict[str, Any]) -> Any:
    def one(value: Any) -> Any:
        if isinstance(value, dict) and value.get("kind") == "tensor":
            return (
                value["dtype"],
                tuple(value["shape"]),
                tuple(value["stride"]),
                value["storage_offset"],
                value["device"],
                value["requires_grad"],
            )
        if isinstance(value, dict) and value.get("kind") == "list":
            return tuple(one(v) for v in value["items"])
        if isinstance(value, dict):
            return tuple(sorted(value.items()))
        return (type(value).__name__, repr(value))

    return tuple((name, one(value)) for name, value in arguments.items())


def write_specs(ops: list[OpCalls], out: Path, command: list[str], when: str) -> list[WrittenSpec]:
    """Each op's spec (`<ns>.<op>.yaml`) and calls file (`<ns>.<op>.calls.zip`) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for op in ops:
        calls_file = out / f"{op.stem}.calls.zip"
        temporary = calls_file.with_name(f".{calls_file.name}.tmp")
        index = {
            "format": CALLS_FORMAT,
            "op": op.op,
            "overload": op.overload,
            "schema": op.schema,
            "calls": len(op.calls),
        }
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(INDEX, json.dumps(index, indent=1))
            for number, values in enumerate(op.files):
                archive.write(values, f"call{number}.pt")
        temporary.replace(calls_file)
        spec = out / f"{op.stem}.yaml"
        write_atomically(spec, spec_text(op, calls_file.name, command, when, out))
        written.append(WrittenSpec(op.qualified, spec, calls_file, len(op.calls)))
    return written


def _tensors(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict) and value.get("kind") == "tensor":
        return [value]
    if isinstance(value, dict) and value.get("kind") == "list":
        return [t for v in value["items"] for t in _tensors(v)]
    return []


def spec_text(op: OpCalls, calls_file: str, command: list[str], when: str, spec_dir: Path) -> str:
    """The spec of one recorded op, every key with a comment saying what to refine."""
    names = list(op.argument_names)
    direct = {name: [c["arguments"][name] for c in op.calls if _is_tensor(c["arguments"].get(name))] for name in names}
    tensor_args = [n for n in names if direct[n]]
    floating = [n for n in tensor_args if any(t["dtype"] in FLOATING for t in direct[n])]
    primary = floating[0] if floating else (tensor_args[0] if tensor_args else None)
    case_dtypes = _ordered({t["dtype"] for t in direct[primary]}) if primary else ["float32"]
    pinned = {}
    for name in floating[1:]:
        pairs = [
            (c["arguments"][name]["dtype"], c["arguments"][primary]["dtype"])
            for c in op.calls
            if _is_tensor(c["arguments"].get(name)) and _is_tensor(c["arguments"].get(primary))
        ]
        if any(own != main for own, main in pairs):
            pinned[name] = pairs[0][0]
    devices = _ordered_devices({t["device"] for c in op.calls for v in c["arguments"].values() for t in _tensors(v)})
    grads = [n for n in floating if any(t["requires_grad"] for t in direct[n])]
    settings: dict[str, list[str]] = {}
    for name in grads:
        settings.setdefault(name, []).append("requires_grad: true")
    for name, dtype in pinned.items():
        settings.setdefault(name, []).append(f"dtype: {dtype}")
    if primary and not floating:
        settings.setdefault(primary, []).append("dtype: case_dtype")
    summarized = sorted(
        {n for c in op.calls for n, v in c["arguments"].items() for t in _tensors(v) if t["values"] is None}
    )
    lines = [
        f"# {op.qualified} as `opforge record` saw it: {len(op.calls)} distinct call(s) of `{_shell(command)}` "
        f"({when}).",
        "# `opforge check` and `opforge fuzz` run it as written; each comment says what to refine (docs/record.md).",
        f"op: {op.qualified}" + _pad(f"op: {op.qualified}") + "# the op (and overload) the program called",
        f"schema: {json.dumps(op.schema)}" + "  # from its registration: keep it, so a change of the op's signature "
        "shows",
        "load:",
    ]
    root = _import_root(op.module, op.module_file)
    if root is not None:
        lines.append(_load_path(root, spec_dir))
    if op.module in ("", "__main__"):
        lines.append(
            "  python: []  # the program registered the op itself: move the registration into a module and name it here"
        )
    else:
        lines.append(
            f"  python: [{op.module}]" + _pad(f"  python: [{op.module}]") + "# the module that registered the op"
        )
    lines += [
        "# reference: my_module:reference  # none yet: every dtype, layout, device, compile and special value is "
        "compared with the op itself on",
        "#   contiguous float64 (or its widest dtype): write a float64 reference to check the values themselves",
        "samples:  # the recorded calls, one sample each (call0, call1, ...): add a function of your own for shapes "
        "the program never made",
        "  function: opforge.recorded:samples",
        f"  file: {calls_file}",
    ]
    if summarized:
        lines.append(
            f"  # {', '.join(summarized)}: past the size cap, recorded by a summary: their values are drawn from "
            "their recorded range"
        )
    if settings:
        lines.append("inputs:")
        for name, entries in settings.items():
            text = f"  {name}: {{{', '.join(entries)}}}"
            why = []
            if "requires_grad: true" in entries:
                why.append("the program differentiated through it")
            if any(e.startswith("dtype: ") and e != "dtype: case_dtype" for e in entries):
                why.append("it kept this dtype beside the others")
            if "dtype: case_dtype" in entries:
                why.append("no floating input: this tensor's dtype is the case's")
            lines.append(text + _pad(text) + "# " + "; ".join(why))
    dtypes_line = f"dtypes: [{', '.join(case_dtypes)}]"
    lines.append(
        dtypes_line + _pad(dtypes_line) + "# the dtypes seen: add the others the op supports (the dtypes check "
        "tries them all)"
    )
    devices_line = f"devices: [{', '.join(devices)}]"
    lines.append(devices_line + _pad(devices_line) + "# the devices seen: add cuda where the op has a CUDA kernel")
    differentiable = bool(grads)
    lines += [
        "claims:",
        f"  differentiable: {str(differentiable).lower()}"
        + _pad(f"  differentiable: {str(differentiable).lower()}")
        + (
            "# the program differentiated through it"
            if differentiable
            else "# the program never asked for its gradient: true (and requires_grad above) to check its backward"
        ),
        "  deterministic: true" + _pad("  deterministic: true") + "# false for an op with atomics or sampling",
        "# tolerances:, xfail:, layouts:, special_values: as the op needs them (docs/specs.md)",
    ]
    return "\n".join(lines) + "\n"


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and value.get("kind") == "tensor"


def _ordered(dtypes: set[str]) -> list[str]:
    return sorted(dtypes, key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER))


def _ordered_devices(devices: set[str]) -> list[str]:
    known: list[str] = [d for d in ("cpu", "cuda") if d in devices]
    return known or ["cpu"]


def _import_root(module: str, module_file: str) -> Path | None:
    """The directory a module's top-level package lives in, unless it is an installed package (site-packages)."""
    if not module or module == "__main__" or not module_file:
        return None
    path = Path(module_file).resolve()
    if "site-packages" in path.parts or "dist-packages" in path.parts:
        return None
    root = path.parent.parent if path.name == "__init__.py" else path.parent
    for _ in range(module.count(".")):
        root = root.parent
    return root


def _load_path(root: Path, spec_dir: Path) -> str:
    """`load.path`, relative to the spec where the specs are written inside the program's tree (the usual `--out
    recorded` run from the project), so that the project and its specs move together; else absolute."""
    spec_dir = spec_dir.resolve()
    if spec_dir.is_relative_to(root):
        entry = f"  path: [{json.dumps(Path(os.path.relpath(root, spec_dir)).as_posix())}]"
        return entry + _pad(entry) + "# where the program imported it from, relative to this file"
    return (
        f"  path: [{json.dumps(str(root))}]" + "  # where the program imported it from: make it relative to this "
        "file (or install the package) to keep the spec"
    )


def _pad(text: str, column: int = 48) -> str:
    return " " * max(2, column - len(text))


def _shell(command: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(part) for part in command)
