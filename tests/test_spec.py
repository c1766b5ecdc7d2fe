"""Spec loading: valid specs load into frozen models; every malformed one gives file:line, key, expected, got, hint."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import FIXTURES, SPECS

from opforge.building.op import load_op
from opforge.core.errors import SpecError
from opforge.loading.spec import load_spec

VALID = """\
op: opforge_test::good
schema: "opforge_test::good(Tensor x) -> Tensor"
load:
  python: [broken_ops]
reference: broken_ops:reference
inputs:
  x: {shapes: [[], [7]], low: -2, high: 2}
dtypes: [float32]
"""


def write(tmp_path, text, name="op.yaml"):
    import shutil

    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_specs_load_frozen():
    spec = load_spec(SPECS / "leaky_swish.yaml")
    assert spec.op == "opforge::leaky_swish"
    assert [i.name for i in spec.inputs] == ["x", "alpha"]
    assert spec.inputs[0].shapes[0] == ()
    assert "gradgradcheck" in spec.checks
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.op = "other"  # type: ignore[misc]


def test_defaults(tmp_path):
    spec = load_spec(write(tmp_path, VALID))
    assert spec.devices == ("cpu",) and spec.layouts == ("contiguous", "noncontiguous", "channels_last")
    assert spec.differentiable and not spec.double_backward
    assert "gradgradcheck" not in spec.checks and "gradcheck" in spec.checks


# (replace this, with that, expected line, key, a fragment of the message)
BAD = [
    ("dtypes: [float32]", "dtypes: [float32]\nfrobnicate: 1", 9, "frobnicate", "unknown key 'frobnicate'"),
    ("dtypes: [float32]", "dtypes: [float33]", 8, "dtypes[0]", "Did you mean 'float32'?"),
    ("dtypes: [float32]", "dtypes: float32", 8, "dtypes", "expected a list"),
    ("dtypes: [float32]", "dtypes: [float32]\ndevices: [tpu]", 9, "devices[0]", "one of cpu, cuda"),
    ("dtypes: [float32]", "dtypes: [float32]\nchecks: [corectness]", 9, "checks[0]", "Did you mean 'correctness'?"),
    ("low: -2", "low: minus two", 7, "inputs.x.low", "expected a number"),
    ("{shapes: [[], [7]]", "{shapes: [[-1]]", 7, "inputs.x.shapes[0]", "non-negative"),
    ("reference: broken_ops:reference", "reference: broken_ops.reference", 5, "reference", "`module:function`"),
    ("op: opforge_test::good", "op: good", 1, "op", "qualified name"),
    (
        "python: [broken_ops]",
        "python: [broken_ops]\n  sources: [missing.cpp]",
        5,
        "load.sources[0]",
        "missing.cpp is missing",
    ),
    ("x: {shapes: [[], [7]], low: -2, high: 2}", "x: {shapes: [[7]], values: [1]}", 7, "inputs.x", "both"),
    ("dtypes: [float32]", "dtypes: [float32]\nxfail: [{check: nope, reason: r}]", 9, "xfail[0].check", "one of"),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nxfail: [{check: correctness, implementation: fast, reason: r}]",
        9,
        "xfail[0].implementation",
        "one of native, got 'fast'",
    ),
    ("dtypes: [float32]", "dtypes: [float32]\nchecks: [correctness, vmap]", 9, "checks", "a `vmap:` entry"),
    ("dtypes: [float32]", "dtypes: [float32]\nchecks: [large_index]", 9, "checks", "a `large_index:` entry"),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nerror_inputs:\n  - {description: d, inputs: {x: {dtype: int32}},"
        " error: RuntimeErr, match: m}",
        10,
        "error_inputs[0].error",
        "built-in exception",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nerror_inputs:\n  - {description: d, inputs: {x: {dtype: int32}},"
        " error: SystemExit, match: m}",
        10,
        "error_inputs[0].error",
        "an Exception subclass",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nerror_inputs:\n  - {description: d, inputs: {y: {dtype: int32}},"
        " error: RuntimeError, match: m}",
        10,
        "error_inputs[0].inputs.y",
        "one of the spec's inputs",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nerror_inputs:\n  - {description: d, inputs: {x: {shape: 7}},"
        " error: RuntimeError, match: m}",
        10,
        "error_inputs[0].inputs.x.shape",
        "a shape",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nerror_inputs:\n  - {description: d, inputs: {x: {dtype: int32}},"
        " error: RuntimeError, match: m}\n  - {description: D, inputs: {x: {dtype: int8}}, error: RuntimeError,"
        " match: m}",
        11,
        "error_inputs[1].description",
        "unlike the others",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nlarge_index: {shapes: {x: [2147483648]}, dtype: float32}",
        9,
        "large_index.shapes",
        "more than 2^31",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nlarge_index: {shapes: {}, dtype: float32}",
        9,
        "large_index.shapes.x",
        "a 'x' entry",
    ),
    (
        "dtypes: [float32]",
        "dtypes: [float32]\nlarge_index: {shapes: {x: [2147483649]}}",
        9,
        "large_index.dtype",
        "one of the spec's dtypes",
    ),
]


@pytest.mark.parametrize("old, new, line, key, fragment", BAD, ids=[b[3] for b in BAD])
def test_bad_spec_names_file_line_key_and_hint(tmp_path, old, new, line, key, fragment):
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert (err.line, err.key) == (line, key), str(err)
    message = str(err)
    assert message.startswith(f"{path}:{line}: {key}: expected ")
    assert fragment in message
    assert err.hint, "every spec error says what to do"


def test_broken_yaml_reports_its_line(tmp_path):
    path = write(tmp_path, VALID.replace("dtypes: [float32]", "dtypes: [float32\n"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.line is not None and "valid YAML" in str(info.value)


def test_missing_required_key(tmp_path):
    path = write(tmp_path, VALID.replace("dtypes: [float32]\n", ""))
    with pytest.raises(SpecError, match="dtypes"):
        load_spec(path)


def test_a_spec_without_a_reference_loads_and_is_checked_against_the_op_itself(tmp_path):
    """`reference:` is optional: without one the op itself on contiguous float64 is the reference
    (tests/test_self_reference.py)."""
    assert load_spec(write(tmp_path, VALID.replace("reference: broken_ops:reference\n", ""))).reference is None


def test_tolerances_accept_yaml11_exponents(tmp_path):
    path = write(tmp_path, VALID + "tolerances:\n  float32: {atol: 1e-3, rtol: 1e-4}\n")
    assert dict(load_spec(path).tolerances)["float32"].atol == 1e-3


# Errors only the loaded op can reveal.
LOAD_ERRORS = [
    (
        'schema: "opforge_test::good(Tensor x) -> Tensor"',
        'schema: "opforge_test::good(Tensor x, int n=3) -> Tensor"',
        "schema",
        "registered schema",
    ),
    ("python: [broken_ops]", "python: [no_such_module]", "load", "no module named 'no_such_module'"),
    ("reference: broken_ops:reference", "reference: broken_ops:nope", "reference", "a callable 'nope'"),
    ("op: opforge_test::good", "op: opforge_test::not_registered", "op", "no such operator"),
    ("x: {shapes: [[], [7]], low: -2, high: 2}", "y: {shapes: [[7]]}", "inputs.y", "schema's arguments"),
]


@pytest.mark.parametrize("old, new, key, fragment", LOAD_ERRORS, ids=[e[2] for e in LOAD_ERRORS])
def test_load_errors_name_the_spec_line(tmp_path, old, new, key, fragment):
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(SpecError) as info:
        load_op(load_spec(path))
    assert info.value.key == key and info.value.line is not None
    assert fragment in str(info.value)


def test_claims_switch_their_checks_on_by_default(tmp_path):
    spec = load_spec(write(tmp_path, VALID))
    assert {"dtypes", "memory", "stream"} <= set(spec.checks)
    assert not {"vmap", "error_inputs", "large_index"} & set(spec.checks)
    claimed = VALID.replace(
        "dtypes: [float32]",
        "dtypes: [float16]\nvmap: true\nlarge_index: {shapes: {x: [2147483649]}}"
        "\nerror_inputs:\n  - {description: integer x, inputs: {x: {dtype: int32}}, "
        "error: RuntimeError, match: must be}",
    )
    spec = load_spec(write(tmp_path, claimed))
    assert {"vmap", "error_inputs", "large_index"} <= set(spec.checks)
    assert spec.section("large_index").dtype == "float16" and not spec.section("large_index").enabled
    assert spec.error_inputs[0].label == "integer_x" and spec.error_inputs[0].tensors[0].dtype == "int32"


def test_claims_are_one_section_of_plain_statements_with_defaults(tmp_path):
    spec = load_spec(write(tmp_path, VALID + "claims: {double_backward: true, deterministic: false, vmap: true}\n"))
    assert spec.differentiable and spec.double_backward and spec.vmap and spec.cuda_graphs
    assert not spec.deterministic and not spec.warnings
    assert "gradgradcheck" in spec.checks and "determinism" in spec.checks


@pytest.mark.parametrize(
    "old, claim, value",
    [
        ("nondeterministic: true", "deterministic", False),
        ("cuda_graphs: false", "cuda_graphs", False),
        ("vmap: true", "vmap", True),
        ("differentiable: false", "differentiable", False),
    ],
)
def test_old_claim_keys_still_load_with_a_warning_naming_the_new_form(tmp_path, old, claim, value):
    path = write(tmp_path, VALID + old + "\n")
    spec = load_spec(path)
    assert getattr(spec, claim) is value
    (warning,) = spec.warnings
    line = VALID.count("\n") + 1
    assert warning.startswith(f"{path}:{line}: `{old}` is read as `claims: {{{claim}: {str(value).lower()}}}`")


def test_an_old_claim_key_beside_its_claim_is_refused(tmp_path):
    with pytest.raises(SpecError) as error:
        load_spec(write(tmp_path, VALID + "nondeterministic: true\nclaims: {deterministic: false}\n"))
    assert error.value.key == "nondeterministic" and "Drop `nondeterministic:`" in str(error.value)
