"""Loading a spec: its YAML read with line numbers (opforge.spec.reader), each section validated (inputs, claims,
xfail, bench), the result a frozen OpSpec (opforge.spec.model). Nothing here imports torch: `opforge list` and
spec errors stay instant. Also where specs are found (the bundled ones, a name or a path).
"""

from __future__ import annotations

import re
from pathlib import Path

from opforge.checks.base import SpecBeforeSections
from opforge.checks.catalog import CATALOG
from opforge.core.errors import SpecError, UsageError
from opforge.loading.regressions import read_regressions
from opforge.loading.xfail import read_xfails
from opforge.spec.bench import read_bench_section
from opforge.spec.claims import read_error_inputs
from opforge.spec.inputs import read_inputs
from opforge.spec.model import (
    KNOWN_DEVICES,
    KNOWN_DTYPES,
    KNOWN_LAYOUTS,
    SPEC_SUFFIXES,
    SPECIAL_VALUES,
    Input,
    OpSpec,
    Samples,
    TensorInput,
    bench_modes,
)
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
from opforge.spec.sources import read_load_section

_QUALNAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")

# What a spec says its op does, each a plain statement of the op with the value most ops have by default:
# `claims: {differentiable: true, double_backward: false, vmap: false, deterministic: true, cuda_graphs: true}`.
CLAIMS = {"differentiable": True, "double_backward": False, "vmap": False, "deterministic": True, "cuda_graphs": True}
# Top-level keys earlier specs used, still read, each with a warning naming its claim: (claim, negated).
OLD_CLAIMS = {
    "differentiable": ("differentiable", False),
    "double_backward": ("double_backward", False),
    "vmap": ("vmap", False),
    "nondeterministic": ("deterministic", True),
    "cuda_graphs": ("cuda_graphs", False),
}

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
    "claims",
    *OLD_CLAIMS,
    "error_inputs",
    "special_values",
    "cuda_graphs",
    "timeout",
    "bench",
    "samples",
    "regressions",
    # The sections the checks own (large_index, grid_size, ...): each check's module reads its own.
    *(section.key for section in CATALOG.sections),
)
_REQUIRED = ("op", "schema", "load", "dtypes")


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
            r.child("op"),
            "op",
            "a qualified name `namespace::name`, or `namespace::name.overload` for an overload",
            repr(op),
            "Write e.g. `opforge::leaky_swish` or `opforge::leaky_swish.out`.",
        )
    load = read_load_section(r, path)
    checks = r.get("checks", list_of(one_of(CATALOG.names)), None)
    claims, warnings = read_claims(r)
    samples = r.get("samples", _read_samples) if r.has("samples") else None
    inputs = _inputs(r, samples)
    dtypes, device_dtypes = _dtypes(r)
    error_inputs = read_error_inputs(r, inputs) if r.has("error_inputs") else ()
    before_sections = SpecBeforeSections(inputs, dtypes)
    sections = tuple((s.key, s.read(r, before_sections)) for s in CATALOG.sections if r.has(s.key))
    claims |= {"error_inputs": bool(error_inputs)} | {s.key: r.has(s.key) for s in CATALOG.sections}
    differentiable = claims["differentiable"]
    if checks is None:
        checks = CATALOG.default_checks(claims)
    _check_claims(r, checks, claims)
    implementations = r.get("implementations", _implementations, ())
    # Every layout by default: a spec that names none still meets a fake's strides on a transposed input.
    layouts = r.get("layouts", list_of(one_of(KNOWN_LAYOUTS)), KNOWN_LAYOUTS)
    _check_input_layouts(r, inputs, layouts)
    devices = r.get("devices", list_of(one_of(KNOWN_DEVICES)), tuple(dict(device_dtypes)) or ("cpu",))
    _check_device_dtypes(r, devices, device_dtypes)
    schema = r.get("schema", read_str)
    input_nodes = r.child("inputs").value.items() if r.has("inputs") else ()
    lines = tuple((k, r.line(k)) for k in root.value) + tuple(
        (f"inputs.{name}", child.line) for name, child in input_nodes
    )
    if samples is not None and r.has("bench"):
        raise r.fail(
            r.child("bench"),
            "bench",
            "no `bench:` section beside `samples:`",
            "both",
            "Time the op from a spec with `inputs.<arg>.shapes`: bench times fixed shapes.",
        )

    return OpSpec(
        path=path,
        op=op,
        schema=schema,
        description=r.get("description", read_str, ""),
        load=load,
        implementations=implementations,
        reference=r.get("reference", read_callable, None),
        inputs=inputs,
        dtypes=dtypes,
        devices=devices,
        layouts=layouts,
        tolerances=r.get("tolerances", read_tolerances, ()),
        grad_tolerances=r.get("grad_tolerances", read_tolerances, ()),
        checks=checks,
        xfail=read_xfails(r, implementations),
        differentiable=differentiable,
        double_backward=claims["double_backward"],
        deterministic=claims["deterministic"],
        vmap=claims["vmap"],
        error_inputs=error_inputs,
        sections=sections,
        special_values=r.get("special_values", list_of(one_of(SPECIAL_VALUES)), SPECIAL_VALUES),
        cuda_graphs=claims["cuda_graphs"],
        timeout=r.get("timeout", read_seconds),
        bench=read_bench_section(
            r, inputs, schema, bench_modes(differentiable, inputs), dtypes, devices, layouts, implementations
        ),
        lines=lines,
        device_dtypes=device_dtypes,
        samples=samples,
        regressions=read_regressions(r, inputs, samples is not None),
        warnings=warnings,
    )


def _read_samples(r: Reader, key: str, node: Node) -> Samples:
    """`samples: module:function`, or `samples: {function: module:function, file: PATH}`: a function that reads its
    samples from a file (`opforge record`'s calls: opforge.recorded:samples), called with `file=` the absolute path
    (relative paths are relative to the spec)."""
    if not isinstance(node.value, dict):
        return Samples(read_callable(r, key, node))
    given = Reader(r.path, node, key, ("function", "file"), required=("function", "file"))
    function = given.get("function", read_callable)
    file = Path(given.get("file", read_str))
    return Samples(function, file=file if file.is_absolute() else r.path.parent / file)


def read_claims(r: Reader) -> tuple[dict[str, bool], tuple[str, ...]]:
    """The spec's claims (CLAIMS, with their defaults), and a warning per old top-level key read as one."""
    given = Reader(r.path, r.child("claims"), "claims", tuple(CLAIMS)) if r.has("claims") else None
    claims = {name: given.get(name, read_bool, default) if given else default for name, default in CLAIMS.items()}
    warnings = []
    for old, (name, negated) in OLD_CLAIMS.items():
        if not r.has(old):
            continue
        if given is not None and given.has(name):
            raise r.fail(
                r.child(old),
                old,
                f"one place for the claim {name!r}",
                f"both `{old}:` and `claims.{name}`",
                f"Drop `{old}:`: `claims.{name}` replaces it.",
            )
        value = r.get(old, read_bool)
        claims[name] = not value if negated else value
        warnings.append(
            f"{r.path}:{r.line(old)}: `{old}: {str(value).lower()}` is read as `claims: {{{name}: "
            f"{str(claims[name]).lower()}}}`. Write that instead: the top-level `{old}:` will go."
        )
    return claims, tuple(warnings)


def _inputs(r: Reader, samples: Samples | None) -> tuple[Input, ...]:
    """`inputs:` is required unless `samples:` makes the inputs; then its entries hold per-argument settings."""
    if samples is None and not r.has("inputs"):
        raise r.fail(r.node, "inputs", "an 'inputs' entry", "none", "Add `inputs:` (see docs/specs.md).")
    inputs: tuple[Input, ...] = r.get(
        "inputs", lambda r, key, node: read_inputs(r, key, node, sampled=samples is not None), ()
    )
    return inputs


def _dtypes(r: Reader) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """`dtypes: [...]` claims them on every device; `dtypes: {cpu: [...], cuda: [...]}` per device (OpInfo's
    dtypesIfCUDA). Returns the union, in the order first given, and the per-device lists (empty for a plain list)."""
    node = r.child("dtypes")
    if not isinstance(node.value, dict):
        return r.get("dtypes", list_of(one_of(KNOWN_DTYPES))), ()
    per_device = Reader(r.path, node, "dtypes", KNOWN_DEVICES)
    device_dtypes = tuple((device, per_device.get(device, list_of(one_of(KNOWN_DTYPES)))) for device in node.value)
    if not device_dtypes:
        raise r.fail(
            node, "dtypes", "a list of dtypes, or one per device", "an empty mapping", "Write e.g. `dtypes: [float32]`."
        )
    union = tuple(dict.fromkeys(d for _, dtypes in device_dtypes for d in dtypes))
    return union, device_dtypes


def _check_device_dtypes(
    r: Reader, devices: tuple[str, ...], device_dtypes: tuple[tuple[str, tuple[str, ...]], ...]
) -> None:
    """Per-device dtypes name exactly the spec's devices: a device without a list would claim nothing."""
    if not device_dtypes:
        return
    given = tuple(device for device, _ in device_dtypes)
    if set(given) != set(devices):
        raise r.fail(
            r.child("dtypes"),
            "dtypes",
            f"a dtype list for each of the spec's devices ({', '.join(devices)})",
            ", ".join(given),
            "Give every device in `devices:` its dtypes, and no other device.",
        )


def _check_input_layouts(r: Reader, inputs: tuple[Input, ...], layouts: tuple[str, ...]) -> None:
    """An input's own `layouts` pick from the spec's: the cases' layouts come from the spec."""
    for entry in inputs:
        if not isinstance(entry, TensorInput) or entry.layouts is None:
            continue
        for index, layout in enumerate(entry.layouts):
            if layout not in layouts:
                node = r.child("inputs").value[entry.name].value["layouts"].value[index]
                raise r.fail(
                    node,
                    f"inputs.{entry.name}.layouts[{index}]",
                    f"one of the spec's layouts ({', '.join(layouts)})",
                    repr(layout),
                    f"Add {layout} to the spec's `layouts:` or drop it here.",
                )


def _check_claims(r: Reader, checks: tuple[str, ...], claims: dict[str, bool]) -> None:
    """A check listed in `checks:` whose cases come from a claim or a spec section (vmap, error_inputs, large_index)
    needs it."""
    for name in checks:
        claim = CATALOG.get(name).claim
        if claim and not claims[claim]:
            entry, where = (f"claims: {{{claim}: true}}", " under claims") if claim in CLAIMS else (f"{claim}:", "")
            raise r.fail(
                r.child("checks"),
                "checks",
                f"a `{claim}:` entry{where} for check {name!r}",
                "none",
                f"Add `{entry}` (see docs/checks.md) or drop {name} from checks.",
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
