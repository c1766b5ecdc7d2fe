"""Case ids that name list arguments by shape, a failure that says when the low-precision baseline was exact (an
upcasting reference), and the low-precision rule on an output whose largest element dwarfs the others (special
values' +-max calls): fixtures in tests/fixtures/ids, written as outside code."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import FIXTURES, describe, failures_by_check, run_spec, variant_of

from opforge.cases import compare
from opforge.cases.matrix import value_label
from opforge.core.results import Status

IDS = FIXTURES / "ids"


def ids_variant(tmp_path: Path, fixture: str, replace: dict[str, str] | None = None, extra: str = "") -> Path:
    """A copy of an ids spec (text replaced, YAML appended) beside a copy of its module."""
    return variant_of(tmp_path, IDS, "idsops.py", fixture, replace, extra)


# ------------------------------------------------------------------------------------------------- case ids


def test_a_list_of_tensors_shows_its_shapes_in_the_case_id():
    """segment_sums' samples give `offsets` one offsets tensor of 5 elements, two of 5 and 3, and one of 2: the ids
    say `offsets=5`, `offsets=5,3`, `offsets=2` (before: `offsets=[tensor([ 0,  4,  4,  7, 12])]`), one shell word
    each, and `-k` with a whole id runs exactly that case."""
    report = run_spec(IDS / "segment_sums.yaml", dtypes=("float32",))
    ids = {r.case_id for r in report.results}
    assert {i.rsplit("-", 1)[-1] for i in ids} == {"offsets=5", "offsets=5,3", "offsets=2"}, ids
    assert not any(c in i for i in ids for c in " []()"), ids
    assert report.results and not report.failed, describe(report.results)

    chosen = next(i for i in ids if i.endswith("offsets=5,3"))
    rerun = run_spec(IDS / "segment_sums.yaml", keyword=f"[{chosen}]")
    assert {r.case_id for r in rerun.results} == {chosen}


def test_an_xfail_case_glob_names_a_list_argument(tmp_path):
    """A `case:` glob is fnmatch, where `[...]` is a set of characters: the comma form is matched literally. The
    op passes, so the strict xfail turns exactly the results it names into XPASS."""
    path = ids_variant(
        tmp_path,
        "segment_sums",
        extra='xfail:\n  - {check: correctness, case: "*-offsets=5,3", reason: "names a list", strict: true}\n',
    )
    report = run_spec(path, dtypes=("float32",))
    xpassed = {r.case_id for r in report.results if r.status == Status.XPASS}
    assert xpassed and all(i.endswith("-sample1-values=12-offsets=5,3") for i in xpassed), xpassed
    assert {r.status for r in report.results if r.case_id not in xpassed} == {Status.PASS}


def test_value_labels():
    assert value_label([2, 3]) == "2,3"
    assert value_label([]) == "empty"
    assert value_label([torch.zeros(4, 3), None, torch.zeros(())]) == "4x3,None,0d"
    assert value_label(0.5) == "0.5"
    assert value_label(torch.float16) == "torch.float16"


# ----------------------------------------------------------------------------------- an upcasting reference


def _expm1_minus(tmp_path: Path, reference: str = "", op: str = "") -> Path:
    replace = {}
    if reference:
        replace["reference: idsops:reference_expm1_minus"] = f"reference: idsops:{reference}"
    if op:
        replace["op: idsfix::expm1_minus"] = f"op: idsfix::{op}"
        replace['schema: "idsfix::expm1_minus('] = f'schema: "idsfix::{op}('
    return ids_variant(tmp_path, "expm1_minus", replace)


def _float16_failures(path: Path) -> list:
    report = run_spec(path, dtypes=("float16",))
    errors = [r for r in report.results if r.status == Status.ERROR]
    assert not errors, describe(errors)
    return failures_by_check(report).get("correctness", [])


EXACT = "equals the float64 reference rounded to float16"
WIDE = "The reference computed in float16 returned float64"


def test_a_reference_written_in_its_inputs_dtype_passes_a_float16_cancellation(tmp_path):
    """exp(x) - (1 + x) against (exp(x) - 1) - x: both float16 orders are several units of roundoff off the small
    results, alike."""
    assert not _float16_failures(_expm1_minus(tmp_path))


def test_a_reference_that_upcasts_and_casts_back_is_named_in_the_failure(tmp_path):
    """Upcast inside, cast back: the baseline is the float64 result rounded, at every one of 2,145 elements; the
    correct op fails (the rule's floors alone), and the failure says why. The 7-element cases, where an exact
    baseline is plausible, fail without the note."""
    failed = _float16_failures(_expm1_minus(tmp_path, reference="reference_expm1_minus_upcast"))
    noted = {r.case_id.rsplit("-", 1)[-1] for r in failed if EXACT in r.message}
    assert noted == {"x=33x65"}, describe(failed)
    assert all(EXACT not in r.message for r in failed if r.case_id.endswith("x=7"))


def test_a_reference_that_returns_float64_is_named_in_the_failure(tmp_path):
    failed = _float16_failures(_expm1_minus(tmp_path, reference="reference_expm1_minus_float64"))
    assert failed and all(WIDE in r.message for r in failed), describe(failed)


def test_a_wrong_op_against_an_honest_reference_fails_without_the_note(tmp_path):
    """The bfloat16 twin is ~8x the baseline's error: it fails, and the baseline is not exact, so no note."""
    failed = _float16_failures(_expm1_minus(tmp_path, op="expm1_minus_in_bfloat16"))
    assert failed and not any(EXACT in r.message or WIDE in r.message for r in failed), describe(failed)


# ------------------------------------------------------------------------------ an extreme among small values


def test_an_extreme_element_off_by_the_ops_own_roundoff_passes(monkeypatch):
    """resample's float32 sample positions put a -max times a weight 12 units of roundoff off, where the float32
    baseline (positions in Python floats) is exact: one element of 10, with the op as far off in relative terms
    on the others. Judged relative to its magnitude it passes; by one RMS of absolute errors (before) that element
    alone decides, and it failed."""
    report = run_spec(IDS / "resample.yaml")
    assert report.results and not report.failed, describe(report.results)

    monkeypatch.setattr(compare, "magnitude_scale", lambda expected, dtype: 1.0)
    failed = failures_by_check(run_spec(IDS / "resample.yaml", checks=("special_values",)))
    assert {r.dtype for r in failed.get("special_values", [])} == {"float32"}


def test_an_op_that_clamps_extremes_still_fails(tmp_path):
    path = ids_variant(
        tmp_path,
        "resample",
        {
            "op: idsfix::resample": "op: idsfix::resample_clamps",
            'schema: "idsfix::resample(': 'schema: "idsfix::resample_clamps(',
        },
    )
    failed = failures_by_check(run_spec(path))
    assert set(failed) == {"special_values"}, describe([r for rows in failed.values() for r in rows])
    assert {r.dtype for r in failed["special_values"]} == {"float32", "float64"}


def test_an_infinite_input_leaves_no_nan_sum_allowance():
    """A term d out / d in * in of an infinite input that out does not use is 0 * inf = NaN: the allowance there is
    0, not NaN (a NaN allowance made the RMS error NaN, a failure that shows no figure)."""
    x = torch.tensor([float("inf"), 1.0, 2.0, 3.0], dtype=torch.float64)

    def tracked():
        leaf = x.clone().requires_grad_(True)
        return {"r": leaf[1:] * 2}, [leaf]

    baseline = compare.Baseline("float32", dict, tracked=tracked)
    summed = baseline.sum_allowance("r", torch.arange(3))
    assert summed is not None and bool(torch.isfinite(summed.allowance).all()), summed
