"""Loading a spec: its YAML read with line numbers (opforge.spec.reader), each section validated (inputs, claims,
xfail, bench), the result a frozen OpSpec (opforge.spec.model). Nothing here imports torch: `opforge list` and
spec errors stay instant. Also where specs are found (the bundled ones, a name or a path).
"""

from __future__ import annotations

import re
from pathlib import Path

from opforge.checks.catalog import CATALOG
from opforge.errors import SpecError, UsageError
from opforge.spec.bench import read_bench_section
from opforge.spec.claims import read_error_inputs, read_large_index
from opforge.spec.inputs import read_inputs
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES, KNOWN_LAYOUTS, SPEC_SUFFIXES, OpSpec, bench_modes
from opforge.spec.reader import (
    Node,
    Reader,
    compose,
    describe,
    list_of,
    one_of,
    read_bool,
    read_callable,
    read_seconds,
    read_str,
    read_tolerances,
)
from opforge.spec.xfail import read_xfails

_QUALNAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")

_LOAD_KEYS = ("python", "sources")
_TOP_KEYS = (
    "op",
    "schema",
    "description",
    "load",
    "implementations",
    "reference",
    "inputs",
    "dtypes",
    "devices",
    "layouts",
    "tolerances",
    "grad_tolerances",
    "checks",
    "xfail",
    "differentiable",
    "double_backward",
    "nondeterministic",
    "vmap",
    "error_inputs",
    "large_index",
    "timeout",
    "bench",
)
_REQUIRED = ("op", "schema", "load", "reference", "inputs", "dtypes")


def load_spec(path: Path | str) -> OpSpec:
    """Parse and validate one spec file. Raises SpecError naming file:line for anything wrong."""
    path = Path(path).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            path,
            None,
            "",
            "a readable spec file",
            exc.strerror or str(exc),
            "Check the path; `opforge list` shows the bundled specs.",
        ) from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise SpecError(
            path,
            line,
            "",
            "UTF-8 text",
            f"byte {exc.object[exc.start]:#04x} that is not UTF-8",
            "Save the spec as UTF-8.",
        ) from None
    root = compose(path, text)
    r = Reader(path, root, "", _TOP_KEYS, required=_REQUIRED)

    op = r.get("op", read_str)
    if not _QUALNAME.match(op):
        raise r.fail(
            r.child("op"), "op", "a qualified name `namespace::name`", repr(op), "Write e.g. `opforge::leaky_swish`."
        )
    load = Reader(path, r.child("load"), "load", _LOAD_KEYS)
    python_modules = load.get("python", list_of(read_str, allow_empty=True), ())
    sources = _sources(load, path) if load.has("sources") else ()
    if not python_modules and not sources:
        raise r.fail(
            r.child("load"),
            "load",
            "`python:` modules or `sources:` files that register the op",
            "neither",
            "List the module that defines the op or its C++ sources.",
        )
    checks = r.get("checks", list_of(one_of(CATALOG.names)), None)
    differentiable = r.get("differentiable", read_bool, True)
    double_backward = r.get("double_backward", read_bool, False)
    inputs = r.get("inputs", read_inputs)
    dtypes = r.get("dtypes", list_of(one_of(KNOWN_DTYPES)))
    vmap = r.get("vmap", read_bool, False)
    error_inputs = read_error_inputs(r, inputs) if r.has("error_inputs") else ()
    large_index = read_large_index(r, inputs, dtypes) if r.has("large_index") else None
    claims = {
        "differentiable": differentiable,
        "double_backward": double_backward,
        "vmap": vmap,
        "error_inputs": bool(error_inputs),
        "large_index": large_index is not None,
    }
    if checks is None:
        checks = CATALOG.default_checks(claims)
    _check_claims(r, checks, claims)
    implementations = r.get("implementations", _implementations, ())
    devices = r.get("devices", list_of(one_of(KNOWN_DEVICES)), ("cpu",))
    schema = r.get("schema", read_str)
    lines = tuple((k, r.line(k)) for k in root.value) + tuple(
        (f"inputs.{name}", child.line) for name, child in r.child("inputs").value.items()
    )

    return OpSpec(
        path=path,
        op=op,
        schema=schema,
        description=r.get("description", read_str, ""),
        python_modules=python_modules,
        sources=sources,
        implementations=implementations,
        reference=r.get("reference", read_callable),
        inputs=inputs,
        dtypes=dtypes,
        devices=devices,
        layouts=r.get("layouts", list_of(one_of(KNOWN_LAYOUTS)), ("contiguous",)),
        tolerances=r.get("tolerances", read_tolerances, ()),
        grad_tolerances=r.get("grad_tolerances", read_tolerances, ()),
        checks=checks,
        xfail=read_xfails(r, implementations),
        differentiable=differentiable,
        double_backward=double_backward,
        nondeterministic=r.get("nondeterministic", read_bool, False),
        vmap=vmap,
        error_inputs=error_inputs,
        large_index=large_index,
        timeout=r.get("timeout", read_seconds),
        bench=read_bench_section(r, inputs, schema, bench_modes(differentiable, inputs), dtypes, devices),
        lines=lines,
    )


def _check_claims(r: Reader, checks: tuple[str, ...], claims: dict[str, bool]) -> None:
    """A check listed in `checks:` whose cases come from a spec key (vmap, error_inputs, large_index) needs it."""
    for name in checks:
        claim = CATALOG.get(name).claim
        if claim and not claims[claim]:
            raise r.fail(
                r.child("checks"),
                "checks",
                f"a `{claim}:` entry for check {name!r}",
                "none",
                f"Add `{claim}:` (see docs/checks.md) or drop {name} from checks.",
            )


def _implementations(r: Reader, key: str, node: Node) -> tuple[tuple[str, str], ...]:
    if not isinstance(node.value, dict):
        raise r.fail(
            node,
            key,
            "a mapping of implementation name to `module:function`",
            describe(node.value),
            "Write e.g. `prototype: my_pkg.ops:my_op_prototype`.",
        )
    return tuple((name, read_callable(r, f"{key}.{name}", child)) for name, child in node.value.items())


def _sources(load: Reader, spec_path: Path) -> tuple[Path, ...]:
    node = load.child("sources")
    if not isinstance(node.value, list):
        raise load.fail(
            node,
            "load.sources",
            "a list of C++/CUDA files",
            describe(node.value),
            "List the files relative to the spec.",
        )
    return tuple(_source_path(load, spec_path, i, item) for i, item in enumerate(node.value))


def _source_path(load: Reader, spec_path: Path, index: int, item: Node) -> Path:
    rel = read_str(load, f"load.sources[{index}]", item)
    source = (spec_path.parent / rel).resolve()
    if source.suffix not in (".cpp", ".cc", ".cu"):
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "a .cpp, .cc or .cu file",
            repr(rel),
            "List translation units only; headers are found next to them.",
        )
    if not source.is_file():
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "an existing file (relative to the spec)",
            f"{source} is missing",
            "Fix the path; it is resolved against the spec's directory.",
        )
    return source


# ------------------------------------------------------------------------------------------------ finding specs


def bundled_specs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "specs"


def find_spec(name_or_path: str, specs_dir: Path | None = None) -> Path:
    """A spec file path, or the name of a spec in the specs directory."""
    candidate = Path(name_or_path)
    if candidate.suffix in SPEC_SUFFIXES:
        return candidate
    specs_dir = specs_dir or bundled_specs_dir()
    for suffix in SPEC_SUFFIXES:
        path = specs_dir / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    known = ", ".join(p.stem for p in list_specs(specs_dir)) or "none"
    raise UsageError(
        f"op {name_or_path!r}",
        f"a spec name ({known}) or a path to a .yaml spec",
        repr(name_or_path),
        "Run `opforge list` to see the specs.",
    )


def list_specs(specs_dir: Path | None = None) -> list[Path]:
    specs_dir = specs_dir or bundled_specs_dir()
    return sorted(p for p in specs_dir.glob("*") if p.suffix in SPEC_SUFFIXES)
