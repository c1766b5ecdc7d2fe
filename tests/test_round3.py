"""Issue 40's round three, on ops written like outside code (tests/fixtures/round3/round3.py): each correct op
passes and each twin fails by the check that should say so; declared crashes; the float32 scan allowance."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.errors import SpecError
from opforge.fuzz.options import FuzzOptions
from opforge.fuzz.search import fuzz
from opforge.loading.spec import load_spec

ROUND3 = FIXTURES / "round3"
runner = CliRunner()


def check(tmp_path: Path, spec: Path, *args: str) -> tuple[int, list[dict]]:
    """`opforge check` on `spec`: its exit code and its results (from the JSON report)."""
    report = tmp_path / f"{spec.stem}.json"
    result = runner.invoke(app, ["check", str(spec), "--json", str(report), *args], env={"NO_COLOR": "1"})
    assert report.exists(), result.output
    [entry] = json.loads(report.read_text())["ops"]
    return result.exit_code, entry["results"]


def variant(tmp_path: Path, name: str, edit) -> Path:
    """A copy of round3's spec `name`, its text passed through `edit`, with copies of the fixture modules beside it."""
    for module in ROUND3.glob("*.py"):
        shutil.copy(module, tmp_path / module.name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(edit((ROUND3 / f"{name}.yaml").read_text()))
    return path


def without_xfails(text: str) -> str:
    return text[: text.index("xfail:")]


# ---------------------------------------------------------------------------------- correct ops pass, twins fail

# (spec, its twin op, the check the twin must fail, what the failure must name). Each correct op passes every row.
TWINS = [
    # A float32 sequential scan passes under the scan allowance, equal and cancelling huge values too; one term
    # left out fails in every dtype.
    ("complete_cumsum", "complete_cumsum_skips_one", "correctness", "result: "),
    # int32 lengths whose offsets come back int64: the dtype is part of the result in both checks.
    ("complete_cumsum", "complete_cumsum_widens", "dtypes", "int32 is claimed, but result: expected dtype torch.int32"),
    # Tensor[]: the last piece of the list output.
    ("split_scaled", "split_scaled_last_unscaled", "correctness", "result1[1]: "),
    # Tensor?: the optional output, a tensor in some samples and None in others.
    ("permute_rows", "permute_rows_keeps_weights", "correctness", "result1: "),
    # SymInt: a plain integer output compared exactly.
    ("count_above", "count_above_or_equal", "correctness", "result1: expected 3, got 4"),
    # compile: a compiled path that floors, wrong against eager and farther from the reference.
    ("fake_quant", "fake_quant_compiled_floor", "compile", "compiled result is not as close to the float64 reference"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({spec for spec, *_ in TWINS} | {"permute_rows_unweighted"}))
def test_each_correct_round3_op_passes_every_check(tmp_path, name):
    code, rows = check(tmp_path, ROUND3 / f"{name}.yaml")
    assert code == 0, [(r["check"], r["case_id"], r["message"]) for r in rows if r["status"] not in ("pass", "xfail")]
    assert any(r["status"] == "pass" for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "twin", "flagged_by", "names"), TWINS, ids=[twin for _, twin, *_ in TWINS])
def test_each_round3_twin_fails_by_the_check_that_sees_its_bug(tmp_path, name, twin, flagged_by, names):
    renamed = variant(tmp_path, name, lambda text: re.sub(rf"round3::{name}\b", f"round3::{twin}", text))
    code, rows = check(tmp_path, renamed)
    assert code == 1
    failed = [r for r in rows if r["status"] == "fail" and r["check"] == flagged_by]
    assert failed and any(names in r["message"] for r in failed), [r["message"][:200] for r in failed]


def differentiated(text: str) -> str:
    """split_scaled with x differentiated, checked by the gradient checks."""
    text = text.replace("  differentiable: false", "  differentiable: true")
    text = text.replace("dtypes:", "inputs:\n  x: {requires_grad: true}\ndtypes:", 1)
    return re.sub(r"(?m)^checks: .*$", "checks: [gradcheck, grad_lowp]", text)


@pytest.mark.slow
def test_gradients_of_a_list_output_reach_the_same_leaves_of_the_reference(tmp_path):
    # Before, the reference's Tensor[] output was one value where the op's were its pieces: the pieces' grad_outputs
    # went to nothing on the reference side, and the correct backward failed grad_lowp on 16 of 16 float32 cases.
    code, rows = check(tmp_path, variant(tmp_path, "split_scaled", differentiated))
    assert code == 0 and {r["check"] for r in rows} == {"gradcheck", "grad_lowp"}, rows
    twin = variant(
        tmp_path,
        "split_scaled",
        lambda t: differentiated(re.sub(r"round3::split_scaled\b", "round3::split_scaled_sum_not_differentiated", t)),
    )
    code, rows = check(tmp_path, twin)
    failed = {r["check"] for r in rows if r["status"] == "fail"}
    assert code == 1 and failed == {"gradcheck", "grad_lowp"}, rows


def test_the_scan_allowance_comes_from_the_references_own_terms():
    import torch

    from opforge.cases.compare import sum_terms

    values = torch.full((1000,), 50.0, dtype=torch.float64, requires_grad=True)
    offsets = torch.cat([values.new_zeros(1), values.cumsum(0)])
    count, magnitude = sum_terms(offsets, [values], torch.tensor([0, 1, 1000]))
    # out[1000] sums all 1000 terms, out[1] one, out[0] none (counted as one, of magnitude 0): a sum's terms, not
    # the ratio of input to output elements (~1) that the plain-sum allowance had counted.
    assert count.tolist() == pytest.approx([1, 1, 1000]) and magnitude.tolist() == pytest.approx([0, 50, 50000])


# ------------------------------------------------------------------------------------------------ declared crashes


@pytest.mark.slow
def test_a_declared_crash_is_xfail_on_the_case_that_crashed(tmp_path):
    code, rows = check(tmp_path, ROUND3 / "double_contiguous_only.yaml")
    assert code == 0, rows
    by_status = {(r["check"], r["status"]) for r in rows}
    assert ("correctness", "xfail") in by_status and ("dtypes", "xfail") in by_status, by_status
    for row in (r for r in rows if r["status"] == "xfail"):
        assert "SIGSEGV" in row["message"] and "-contiguous-" not in row["case_id"], row
    # Each unclaimed dtype's task sweeps the spec's cases; it dies on the first non-contiguous one and says so there.
    swept = [r for r in rows if r["check"] == "dtypes" and r["status"] == "xfail"]
    assert len(swept) == 9 and all("was running the op on this case" in r["message"] for r in swept), swept


@pytest.mark.slow
def test_an_undeclared_crash_stays_a_crash_result_on_the_case_that_crashed(tmp_path):
    code, rows = check(tmp_path, variant(tmp_path, "double_contiguous_only", without_xfails))
    assert code == 1
    crashed = [r for r in rows if r["status"] == "crash"]
    assert {r["check"] for r in crashed} == {"correctness", "dtypes"}, crashed
    # Before, a dtypes result kept its representative (contiguous) case's id whatever case its sweep died on.
    assert all("-contiguous-" not in r["case_id"] for r in crashed), [r["case_id"] for r in crashed]


@pytest.mark.slow
def test_a_declared_crash_that_does_not_happen_is_xpass(tmp_path):
    fixed = variant(tmp_path, "double_contiguous_only", lambda t: t.replace("::double_contiguous_only", "::double"))
    code, rows = check(tmp_path, fixed)
    assert code == 1
    xpassed = [r for r in rows if r["status"] == "xpass"]
    assert xpassed and {r["check"] for r in xpassed} == {"correctness"}, rows


def test_a_crash_entry_declares_only_crashes_and_other_entries_only_failures(tmp_path):
    from opforge.core.results import Status
    from opforge.engine.tasks import Verdict, declared

    spec = load_spec(ROUND3 / "double_contiguous_only.yaml")
    where = ("native", "correctness", "float32", "cpu", "strided", "float32-cpu-strided-x=7")
    assert declared(spec, *where, Verdict(Status.CRASH, "died")).status == Status.XFAIL
    assert declared(spec, *where, Verdict(Status.TIMEOUT, "hung")).status == Status.XFAIL
    # A crash entry is no excuse for a wrong value, and only a crash entry excuses a crash.
    assert declared(spec, *where, Verdict(Status.FAIL, "wrong")).status == Status.FAIL
    assert declared(spec, *where, Verdict(Status.PASS)).status == Status.XPASS
    contiguous = where[:4] + ("contiguous", "float32-cpu-contiguous-x=7")
    assert declared(spec, *contiguous, Verdict(Status.CRASH, "died")).status == Status.CRASH


def test_crash_must_be_a_bool_and_expanded_is_a_layout_an_xfail_can_name(tmp_path):
    path = variant(tmp_path, "double_contiguous_only", lambda t: t.replace("crash: true", "crash: sometimes", 1))
    with pytest.raises(SpecError, match=r"xfail\[0\]\.crash"):
        load_spec(path)
    path = variant(tmp_path, "double_contiguous_only", lambda t: t.replace("layout: noncontiguous", "layout: expanded"))
    assert {x.layout for x in load_spec(path).xfail} == {"expanded"}


@pytest.mark.slow
def test_fuzz_counts_a_declared_crash_as_known_and_an_undeclared_one_as_a_failure(tmp_path):
    options = FuzzOptions(budget=120, max_examples=30, seed=0, database=tmp_path / "db")
    declared_run = fuzz(load_spec(variant(tmp_path, "double_contiguous_only", lambda t: t)), options)
    assert declared_run.known > 0 and declared_run.failures == [], declared_run
    undeclared = fuzz(load_spec(variant(tmp_path, "double_contiguous_only", without_xfails)), options)
    assert [f.oracle for f in undeclared.failures] == ["crash"], undeclared
