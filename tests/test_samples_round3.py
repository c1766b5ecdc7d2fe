"""Samples functions as real ops need them (issue 40, items 7 and 10), on tests/fixtures/round3's ops: a sample's
Python values hold for every case or the spec is refused when it loads; an optional tensor may be None in some
samples; an index follows the integer dtype under test when the spec says `dtype: case_dtype`; a ScalarType
argument follows the dtype under test; a sample may carry a short name for its case id. Each correct op passes,
each twin fails where its bug shows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from helpers import FIXTURES, describe, failures_by_check, run_spec

from opforge.building.op import load_op
from opforge.core.errors import SpecError
from opforge.core.results import Status
from opforge.loading.spec import load_spec

ROUND3 = FIXTURES / "round3"
_modules = itertools.count()


def variant(tmp_path: Path, fixture: str, replace: dict[str, str] | None = None, extra: str = "") -> Path:
    """A copy of a round3 spec (text replaced, YAML appended) in tmp_path, loading round3 from the fixtures (its
    namespace is registered once per process)."""
    text = (ROUND3 / f"{fixture}.yaml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("load:\n", f"load:\n  path: [{ROUND3}]\n", 1)
    path = tmp_path / f"{fixture}.yaml"
    path.write_text(text + extra)
    return path


def samples_module(tmp_path: Path, source: str) -> str:
    """A module of samples functions beside a variant spec, under a name no other test has imported."""
    name = f"round3_samples_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text("import torch\nimport round3\n\n" + source)
    return name


def with_samples(tmp_path: Path, fixture: str, source: str, function: str, extra: str = "") -> Path:
    module = samples_module(tmp_path, source)
    text = (ROUND3 / f"{fixture}.yaml").read_text()
    old = next(line for line in text.splitlines() if line.startswith("samples:"))
    return variant(
        tmp_path,
        fixture,
        {old: f"samples: {module}:{function}", "python: [round3]": f"python: [round3, {module}]"},
        extra,
    )


def load_error(path: Path) -> str:
    with pytest.raises(SpecError) as error:
        load_op(load_spec(path))
    assert f"{path}:" in str(error.value), "a spec error names the spec's file and line"
    return f"{error.value.key}: {error.value}"


def by_status(report, check: str = "correctness") -> dict[Status, set[str]]:
    found: dict[Status, set[str]] = {}
    for r in report.results:
        if r.check == check:
            found.setdefault(r.status, set()).add(f"{r.dtype}:{r.case_id}")
    return found


# ------------------------------------------------------------------------- (a) values that hold for every case


def test_a_value_computed_from_the_cases_random_tensors_is_refused_when_the_spec_loads():
    """jagged_sum_samples_untied draws the offsets from the case's generator and computes max_length from them:
    before, the value planned from seed 0 reached every case beside other offsets, and the correct op failed 4 results
    (its loop bound shorter than the case's longest segment)."""
    message = load_error(ROUND3 / "jagged_sum_untied.yaml")
    assert message.startswith("samples:"), message
    assert "sample 1's max_length the same whatever the seed and dtype" in message, message
    assert "13 (float64, seed 0) and 5 (float32, seed 1)" in message, message
    assert "torch.Generator().manual_seed(i)" in message, "the error says how to tie the value to the tensors"


def test_a_value_tied_to_the_samples_tensors_checks_the_op_and_catches_its_twin():
    report = run_spec(ROUND3 / "jagged_sum.yaml")
    assert report.results and not report.failed, describe(report.results)
    failed = failures_by_check(run_spec(ROUND3 / "jagged_sum_stops_early.yaml"))
    # Samples 0-2 each have a segment of exactly max_length rows; sample 3 has no rows at all.
    assert {r.case_id.split("-")[3] for r in failed["correctness"]} == {"sample0", "sample1", "sample2"}


SHAPE_PER_SEED = """
def shapes_per_seed(dtype, device, generator):
    for segments, columns, _ in round3.JAGGED_SUM_GEOMETRIES:
        lengths = torch.randint(0, 6, (segments,), generator=generator)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        values = torch.rand(int(lengths.sum()), columns, generator=generator, dtype=torch.float64)
        yield {"values": values.to(dtype), "offsets": offsets, "max_length": 5}
"""


def test_a_shape_drawn_from_the_cases_seed_is_refused_when_the_spec_loads(tmp_path):
    """Before, this loaded and every case but the planned seed's was an ERROR blaming dtype or device."""
    message = load_error(with_samples(tmp_path, "jagged_sum", SHAPE_PER_SEED, "shapes_per_seed"))
    assert "sample 0's values the same whatever the seed and dtype" in message, message
    assert "a tensor of shape" in message, message


COUNT_PER_SEED = """
def count_per_seed(dtype, device, generator):
    for index in range(int(torch.randint(1, 9, (), generator=generator))):
        yield {"values": torch.rand(3, 2, dtype=dtype), "offsets": torch.tensor([0, 3]), "max_length": 3}
"""


def test_a_number_of_samples_that_follows_the_seed_is_refused(tmp_path):
    message = load_error(with_samples(tmp_path, "jagged_sum", COUNT_PER_SEED, "count_per_seed"))
    assert "as many samples" in message and "(float64, seed 0)" in message, message


FLOAT16_ONLY = """
def longer_in_float16(dtype, device, generator):
    for sample in round3.jagged_sum_samples(dtype, device, generator):
        yield sample | {"max_length": sample["max_length"] + (dtype == torch.float16)}
"""


def test_a_value_that_differs_in_one_dtype_only_errors_that_dtypes_cases(tmp_path):
    """The load draws float64 and float32; a value that changes in float16 alone is caught in each float16 case,
    an ERROR naming what differs, never a pass."""
    path = with_samples(tmp_path, "jagged_sum", FLOAT16_ONLY, "longer_in_float16")
    path.write_text(path.read_text().replace("dtypes: [float32, float64]", "dtypes: [float32, float16]"))
    report = run_spec(path)
    statuses = {(r.dtype, r.status) for r in report.results}
    assert statuses == {("float32", Status.PASS), ("float16", Status.ERROR)}, describe(report.results)
    error = next(r for r in report.results if r.status == Status.ERROR)
    assert "max_length: expected 5 (as made in float64 on cpu), got 6 in float16" in error.message, error.message


# ------------------------------------------------------------------- (b) an optional tensor given in some samples


def test_an_optional_tensor_may_be_a_tensor_in_some_samples_and_none_in_others():
    """round3.permute_rows_samples passes weights in three samples and None in two: before, a spec error ("put
    samples whose argument is not a tensor in a spec of their own")."""
    report = run_spec(ROUND3 / "permute_rows_mixed.yaml")
    assert report.results and not report.failed, describe(report.results)
    ids = {r.case_id for r in report.results if r.check == "correctness"}
    assert "float32-cpu-contiguous-sample0-x=5x3-perm=5-weights=5" in ids, ids
    assert "float32-cpu-contiguous-sample1-x=5x3-perm=5-weights=None" in ids, ids
    assert {r.check for r in report.results} >= {"opcheck:test_faketensor", "determinism"}


def test_a_twin_that_drops_the_optional_work_fails_only_the_samples_that_give_it(tmp_path):
    twin = "round3::permute_rows_keeps_weights"
    path = variant(
        tmp_path,
        "permute_rows_mixed",
        {"op: round3::permute_rows\n": f"op: {twin}\n", 'schema: "round3::permute_rows(': f'schema: "{twin}('},
    )
    failed = failures_by_check(run_spec(path, checks=("correctness",)))
    assert {r.case_id.split("-")[3] for r in failed["correctness"]} == {"sample0", "sample2"}  # 1x4's perm is 0
    assert all("weights=None" not in r.case_id for r in failed["correctness"])


def test_fuzz_plans_an_optional_tensor_a_sample_leaves_none_without_a_shape():
    from opforge.fuzz.worker import _space

    pairings = _space(load_op(load_spec(ROUND3 / "permute_rows_mixed.yaml")))["pairings"]
    assert [[name for name, _ in pairing] for pairing in pairings][:2] == [["x", "perm", "weights"], ["x", "perm"]]


# ------------------------------------------------------------------ (c) an index that follows the integer case


def test_an_index_of_dtype_case_dtype_follows_each_integer_case():
    """gather_rows claims int32 and int64 (its index's dtypes; x stays float32). Before, `dtype: case_dtype` was
    no dtype, and the float32 results read "expected dtype torch.float64" in an integer case."""
    report = run_spec(ROUND3 / "gather_rows.yaml")
    assert report.results and not report.failed, describe(report.results)
    twin = by_status(run_spec(ROUND3 / "gather_rows_reads_int64.yaml", checks=("correctness",)))
    assert {i.split(":")[0] for i in twin[Status.FAIL]} == {"int32"}, twin
    assert all("one_row" not in i for i in twin[Status.FAIL]), "an index of zeros reads the same either way"


def test_without_case_dtype_the_index_keeps_the_dtype_the_samples_made(tmp_path):
    """What `dtype: case_dtype` changes: without it the index stays int64 in the int32 case, and the twin's bug
    goes unseen."""
    path = variant(tmp_path, "gather_rows_reads_int64", {"  index: {dtype: case_dtype}\n": ""})
    report = run_spec(path, checks=("correctness",))
    assert report.results and not report.failed, describe(report.results)


WIDENS = """
def gather_rows_in_float64(x, index):
    return x.index_select(0, index).double()
"""


def test_a_floating_output_in_an_integer_case_keeps_the_dtype_of_its_floating_inputs(tmp_path):
    """The correct op returns float32 rows of its float32 table (above); one that returns float64 still fails."""
    module = samples_module(tmp_path, WIDENS)
    path = variant(
        tmp_path,
        "gather_rows",
        {"python: [round3]": f"python: [round3, {module}]"},
        f"implementations:\n  widened: {module}:gather_rows_in_float64\n",
    )
    failed = failures_by_check(run_spec(path, checks=("correctness",)), implementation="widened")
    assert failed["correctness"], "the widened implementation must fail"
    assert all("expected dtype torch.float32, got torch.float64" in r.message for r in failed["correctness"])


# ----------------------------------------------------------------- (d) a ScalarType that follows the case dtype


def test_a_scalar_type_of_case_dtype_follows_each_case():
    """Before, `values: [case_dtype]` reached the op as the string 'case_dtype' (every result failed)."""
    report = run_spec(ROUND3 / "cast_to.yaml")
    assert report.results and not report.failed, describe(report.results)
    assert {r.dtype for r in report.results if r.check == "correctness"} == {
        "float32",
        "float64",
        "float16",
        "bfloat16",
    }
    assert all(r.case_id.endswith("-dtype=case_dtype") for r in report.results if r.check == "correctness")
    # The case's dtype reaches the op through `dtype` alone (x is float32): dtypes tries the unclaimed ones too.
    assert {"int8", "int64", "bool"} <= {r.dtype for r in report.results if r.check == "dtypes"}
    twin = failures_by_check(run_spec(ROUND3 / "cast_to_through_half.yaml"))
    assert {r.dtype for r in twin["correctness"]} == {"bfloat16"}, describe(twin["correctness"])
    # int16 is unclaimed, and the twin's float16 detour returns wrong values in it rather than refusing it.
    assert {r.dtype for r in twin["dtypes"]} == {"bfloat16", "int16"}, describe(twin["dtypes"])


def test_a_samples_function_that_returns_its_own_dtype_gives_the_case_dtype(tmp_path):
    """Before, its float64 (the planning call's) reached every case: the correct op failed in float32, float16 and
    bfloat16."""
    report = run_spec(ROUND3 / "cast_to_samples.yaml")
    assert report.results and not report.failed, describe(report.results)
    twin = "round3::cast_to_through_half"
    path = variant(
        tmp_path,
        "cast_to_samples",
        {"op: round3::cast_to\n": f"op: {twin}\n", 'schema: "round3::cast_to(': f'schema: "{twin}('},
    )
    assert {r.dtype for r in failures_by_check(run_spec(path))["correctness"]} == {"bfloat16"}


def test_a_scalar_type_may_name_a_dtype(tmp_path):
    """`values: [bfloat16]`: every case converts to bfloat16, so the twin fails in every dtype under test."""
    report = run_spec(
        variant(tmp_path, "cast_to", {"values: [case_dtype]": "values: [bfloat16]"}), checks=("correctness",)
    )
    assert report.results and not report.failed, describe(report.results)
    path = variant(tmp_path, "cast_to_through_half", {"values: [case_dtype]": "values: [bfloat16]"})
    failed = failures_by_check(run_spec(path, checks=("correctness",)))
    assert {r.dtype for r in failed["correctness"]} == {"float32", "float64", "float16", "bfloat16"}


@pytest.mark.parametrize(
    "fixture, replace, got",
    [
        ("cast_to", {"values: [case_dtype]": "values: [float17]"}, "'float17'"),
        ("fake_quant", {"values: [0.05]": "values: [case_dtype]"}, "'case_dtype'"),
    ],
    ids=["unknown-dtype", "case-dtype-of-a-float"],
)
def test_dtype_values_spec_errors(tmp_path, fixture, replace, got):
    message = load_error(variant(tmp_path, fixture, replace))
    assert message.startswith("inputs.") and got in message, message


# ------------------------------------------------------------------------------------------- (e) sample names


def test_a_named_samples_case_id_is_its_name():
    """Before, `int32-cpu-contiguous-sample2-x=33x65-index=7` and the like (a list argument's tensors printed in
    full made fbgemm's ~230 characters)."""
    spec = load_op(load_spec(ROUND3 / "gather_rows.yaml")).spec
    assert spec.samples is not None and spec.samples.names == ("one_row", "repeats", "wide", "none")
    report = run_spec(ROUND3 / "gather_rows.yaml", checks=("correctness",), keyword="wide")
    assert {r.case_id for r in report.results} == {
        f"{dtype}-cpu-{layout}-wide"
        for dtype in ("int32", "int64")
        for layout in ("contiguous", "offset", "transposed", "strided")
    }


def test_an_xfail_and_a_regression_name_a_sample_by_its_name(tmp_path):
    path = variant(
        tmp_path,
        "gather_rows_reads_int64",
        extra="xfail:\n  - {check: correctness, dtype: int32, case: '*-wide', reason: reads int32 as int64}\n"
        "regressions:\n  - {dtype: int32, device: cpu, seed: 3, sample: 1}\n",
    )
    rows = by_status(run_spec(path, checks=("correctness",)))
    assert rows[Status.XFAIL] == {
        f"int32:int32-cpu-{layout}-wide" for layout in ("contiguous", "offset", "transposed", "strided")
    }
    assert "int32:regression0-int32-cpu-contiguous-repeats" in rows[Status.FAIL], rows


NAMED = """
def named(dtype, device, generator):
    for sample, name in zip(round3.jagged_sum_samples(dtype, device, generator), NAMES):
        yield sample | {"_name": name}
"""


@pytest.mark.parametrize(
    "names, expected, got",
    [
        (("a", "b", "a", "c"), "sample 2's '_name' to be unique (sample 0 has it too)", "'a'"),
        (("a", "cut-3", "b", "c"), "sample 1's '_name' to be a string of letters, digits", "'cut-3'"),
        (("sample1", "a", "b", "c"), "sample 0's '_name' to be unlike `sampleN`", "'sample1'"),
    ],
    ids=["duplicate", "hyphen", "looks-unnamed"],
)
def test_sample_name_spec_errors(tmp_path, names, expected, got):
    path = with_samples(tmp_path, "jagged_sum", f"NAMES = {names!r}\n{NAMED}", "named")
    message = load_error(path)
    assert expected in message and f"got {got}" in message, message


def test_unnamed_samples_keep_their_index_shapes_and_values():
    report = run_spec(ROUND3 / "jagged_sum.yaml", checks=("correctness",), dtypes=("float64",), keyword="sample0")
    assert "float64-cpu-contiguous-sample0-values=9x4-offsets=4-max_length=5" in {r.case_id for r in report.results}


def test_a_named_samples_case_reaches_the_sanitizer_child_unchanged():
    """compute-sanitizer's child gets each case as JSON (opforge.checks.sanitize)."""
    import json

    from opforge.cases.matrix import build_matrix
    from opforge.checks.sanitize import _case_json
    from opforge.engine.sanitize_child import _case

    spec = load_op(load_spec(ROUND3 / "gather_rows.yaml")).spec
    case = build_matrix(spec, ("int32",), ("cpu",))[1]
    assert case.sample_name == "repeats"
    assert _case(json.loads(json.dumps(_case_json(case)))) == case
