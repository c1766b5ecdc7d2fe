"""Property: whatever a spec file holds, loading it gives a spec or a SpecError naming file:line, never another
exception (which would reach a user as a traceback or an internal error)."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, SPECS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opforge.core.errors import OpforgeError, SpecError
from opforge.loading.spec import load_spec

# Bounded so CI stays fast. Derandomized: the same examples every run, so CI cannot fail on one it never saw
# before (explore new ones locally with --hypothesis-seed=N; a seed also reproduces a failure).
EXAMPLES = 200
BASES = {
    path.name: path.read_text()
    for path in (
        SPECS / "leaky_swish.yaml",
        SPECS / "custom_loss.yaml",
        FIXTURES / "good.yaml",
        FIXTURES / "scale_.yaml",
    )
}
# Specs that need no build: the loaded-op checks (schema, modules, callables, inputs) are fuzzed on these too.
PYTHON_ONLY = ("good.yaml", "scale_.yaml")

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


# Pieces of YAML that stress the parser and the value constructors (tags, anchors, dates, nesting), joined at random.
YAML_PIECES = (
    "op: ",
    "schema: ",
    "inputs: ",
    "x: ",
    "shapes: ",
    "dtypes: ",
    "load: ",
    "python: ",
    "\n",
    "  ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ", ",
    ": ",
    "? ",
    "&a ",
    "*a",
    "!!timestamp ",
    "!!binary ",
    "!!float ",
    "!!int ",
    "!!str ",
    "!!python/object:os.system ",
    "!custom ",
    "2001-13-45",
    "2001-01-01",
    "0xZZ",
    "0x1F",
    "'",
    '"',
    "~",
    ".nan",
    ".inf",
    "1e-3",
    "-0",
    "\t",
    "# c",
    "|\n",
    ">-\n",
    "<<: ",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "\x1f",
    "\ufeff",
    "float32",
    "cpu",
    "correctness",
)
yamlish = st.lists(st.sampled_from(YAML_PIECES) | st.text(max_size=4), max_size=40).map("".join)


@pytest.fixture(scope="module")
def workdir():
    """specs/ beside a link to the real opforge/, so the bundled specs' relative sources resolve."""
    root = Path(tempfile.mkdtemp(prefix="opforge-fuzz-"))
    (root / "specs").mkdir()
    os.symlink(REPO / "opforge", root / "opforge")
    shutil.copy(FIXTURES / "broken_ops.py", root / "specs" / "broken_ops.py")
    yield root / "specs"
    shutil.rmtree(root)


def _keys(container) -> range | set:
    return set(container) if isinstance(container, dict) else range(len(container))


def _places(node, found=None):
    """Every (container, key) in a parsed YAML tree."""
    found = [] if found is None else found
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        found.append((node, key))
        _places(child, found)
    return found


@st.composite
def mutated_specs(draw) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(BASES)))
    data = yaml.safe_load(BASES[name])
    for _ in range(draw(st.integers(1, 2))):
        places = _places(data)
        container, key = draw(st.sampled_from(places))
        # borrow: a value from elsewhere in the spec, well-formed but in the wrong place (a schema that does not
        # match, a shape list where values belong), which reaches the checks that need the loaded op.
        action = draw(st.sampled_from(("drop", "rename", "retype", "borrow", "borrow")))
        if action == "drop":
            del container[key]
        elif action == "rename" and isinstance(container, dict):
            container[draw(st.text(max_size=10) | st.sampled_from(sorted(data)))] = container.pop(key)
        elif action == "borrow":
            other, other_key = draw(st.sampled_from(places))
            container[key] = copy.deepcopy(other[other_key]) if other_key in _keys(other) else None
        else:
            container[key] = draw(values)
    text = yaml.safe_dump(data, sort_keys=False)
    if draw(st.integers(0, 3)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return name, text


TRAPS = {
    "self-alias": "a: &a [*a]",
    "bad-date": "op: 2001-13-45",
    "bad-base64": "op: !!binary xyz",
    "bad-int": "op: !!int 0xZZ",
    "empty-int": "!!int ",
    "empty-float": "!!float ",
    "empty-date": "!!timestamp ",
    "deep": "[" * 3000,
    "control-char": "op: \x1f",
    "not-utf8": b"op: \x80",
}


@pytest.mark.parametrize("text", TRAPS.values(), ids=TRAPS.keys())
def test_known_yaml_traps_give_a_spec_error(workdir, text):
    assert _assert_clean(workdir / "trap.yaml", text) is None


def _assert_clean(path: Path, text: str | bytes) -> object | None:
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    try:
        return load_spec(path)
    except SpecError as err:
        assert str(err).startswith(f"{path}"), str(err)
        assert err.line is not None or err.expected == "a readable spec file", str(err)
        assert err.hint, str(err)
        return None


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(yamlish | st.text(max_size=300) | st.binary(max_size=200))
def test_random_text_loads_or_gives_a_spec_error(workdir, text):
    _assert_clean(workdir / "random.yaml", text)


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.slow
@given(mutated_specs())
def test_mutated_specs_load_or_give_a_spec_error(workdir, mutation):
    name, text = mutation
    spec = _assert_clean(workdir / name, text)
    if spec is None or name not in PYTHON_ONLY or not _same_code(spec, name):
        return
    from opforge.building.op import load_op

    try:
        load_op(spec)
    except OpforgeError as err:
        assert isinstance(err, SpecError) and err.line is not None, str(err)


def _same_code(spec, name: str) -> bool:
    """Only modules the base spec names get imported: a mutation must not import an arbitrary module."""
    original = yaml.safe_load(BASES[name])
    modules = {ref.split(":")[0] for ref in (spec.reference, *(r for _, r in spec.implementations))}
    return set(spec.python_modules) <= set(original["load"]["python"]) and modules <= set(original["load"]["python"])
