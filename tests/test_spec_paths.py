"""`load:` paths outside the spec's folder: absolute, or through environment variables (`${VAR}`, `$VAR`); an unset
variable is a spec error at its line, never a path that names `${VAR}` literally."""

from __future__ import annotations

import pytest
from helpers import FIXTURES

from opforge.core.errors import SpecError
from opforge.loading.spec import load_spec

VARIABLE = "OPFORGE_TEST_OPS_ROOT"


def _spec(tmp_path, load_lines: str):
    """A spec in its own folder whose load: section adds `load_lines` (indented by two) to the fixtures' module."""
    import shutil

    folder = tmp_path / "specs"
    folder.mkdir()
    shutil.copy(FIXTURES / "broken_ops.py", folder / "broken_ops.py")
    path = folder / "op.yaml"
    path.write_text(
        "op: opforge_test::good\n"
        'schema: "opforge_test::good(Tensor x) -> Tensor"\n'
        "load:\n"
        "  python: [broken_ops]\n"
        f"{load_lines}"
        "reference: broken_ops:reference\n"
        "inputs:\n"
        "  x: {shapes: [[7]]}\n"
        "dtypes: [float32]\n"
    )
    return path


@pytest.fixture
def elsewhere(tmp_path):
    """A package outside the spec's folder: a source, a header directory, an import root, a library file."""
    root = tmp_path / "elsewhere"
    (root / "include").mkdir(parents=True)
    (root / "op.cpp").write_text("// a translation unit\n")
    (root / "libext.so").write_bytes(b"")
    return root


def _load_lines(prefix: str) -> str:
    # Quoted: in a YAML flow list [...], a plain `${VAR}` is the start of a mapping.
    return (
        f'  sources: ["{prefix}/op.cpp"]\n'
        f'  include_dirs: ["{prefix}/include"]\n'
        f'  path: ["{prefix}"]\n'
        f'  libraries: [z, "{prefix}/libext.so"]\n'
    )


def _assert_elsewhere(load, root) -> None:
    assert load.sources == (root / "op.cpp",)
    assert load.include_dirs == (root / "include",)
    assert load.path == (root,)
    assert load.libraries == ("z", str(root / "libext.so"))


def test_absolute_paths_are_taken_as_they_are(tmp_path, elsewhere):
    _assert_elsewhere(load_spec(_spec(tmp_path, _load_lines(str(elsewhere)))).load, elsewhere)


@pytest.mark.parametrize("reference", [f"${{{VARIABLE}}}", f"${VARIABLE}"])
def test_environment_variables_in_paths_are_expanded(tmp_path, elsewhere, monkeypatch, reference):
    monkeypatch.setenv(VARIABLE, str(elsewhere))
    _assert_elsewhere(load_spec(_spec(tmp_path, _load_lines(reference))).load, elsewhere)


def test_a_variable_may_name_a_folder_relative_to_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv(VARIABLE, "vendor")
    path = _spec(tmp_path, f"  include_dirs:\n    - ${{{VARIABLE}}}/include\n")
    (path.parent / "vendor" / "include").mkdir(parents=True)
    assert load_spec(path).load.include_dirs == (path.parent / "vendor" / "include",)


# (the load: line that uses the unset variable, its key)
UNSET = [
    (f'  sources: [a.cpp, "${{{VARIABLE}}}/op.cpp"]\n', "load.sources[1]"),
    (f'  include_dirs: ["${{{VARIABLE}}}/include"]\n', "load.include_dirs[0]"),
    (f"  path: [${VARIABLE}]\n", "load.path[0]"),
    (f'  libraries: ["${{{VARIABLE}}}/libext.so"]\n', "load.libraries[0]"),
]


@pytest.mark.parametrize("line, key", UNSET, ids=[key for _, key in UNSET])
def test_an_unset_variable_is_a_spec_error_at_its_line(tmp_path, monkeypatch, line, key):
    monkeypatch.delenv(VARIABLE, raising=False)
    path = _spec(tmp_path, line)
    (path.parent / "a.cpp").write_text("")  # a source before it that is fine
    with pytest.raises(SpecError) as info:
        load_spec(path)
    error = info.value
    assert (error.path, error.line, error.key) == (path, 5, key), str(error)
    assert error.expected.startswith(f"the environment variable {VARIABLE} to be set")
    assert error.got == f"{VARIABLE} unset" and error.hint.startswith(f"Set {VARIABLE} before running opforge")
    assert f"{path}:5: {key}: expected the environment variable {VARIABLE} to be set" in str(error)
