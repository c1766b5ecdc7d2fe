"""What a CI job consumes: --last-failed reruns, the Markdown summary, and the statuses every report knows."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest
from helpers import FIXTURES, in_process
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.files import write_atomically
from opforge.core.results import (
    CaseResult,
    Mismatch,
    OpReport,
    RunReport,
    Status,
    dumps_json,
    result_from_json,
    result_json,
)
from opforge.engine.plan import Filters
from opforge.reporters.lastfailed import STORE, record, recorded
from opforge.reporters.markdown import MAX_FAILURES, render_markdown

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def ids_in(path) -> list[str]:
    return [r["id"] for op in json.loads(path.read_text())["ops"] for r in op["results"]]


def test_last_failed_reruns_exactly_what_failed_then_forgets_what_passed(tmp_path):
    spec = str(FIXTURES / "ignores_strides.yaml")
    first = invoke("check", spec, "--check", "correctness", "--dtype", "float32", "--json", "all.json")
    assert first.exit_code == 1, first.output
    failed = [
        r["id"]
        for op in json.loads((tmp_path / "all.json").read_text())["ops"]
        for r in op["results"]
        if r["status"] == "fail"
    ]
    assert failed and set(recorded(tmp_path)) == set(failed)

    # No implementation: the specs come from the record.
    again = invoke("check", "--last-failed", "--json", "again.json")
    assert again.exit_code == 1, again.output
    assert sorted(ids_in(tmp_path / "again.json")) == sorted(failed)
    assert f"rerunning {len(failed)} failed results" in again.output


def test_last_failed_with_nothing_recorded_runs_everything_with_a_note(tmp_path):
    result = invoke(
        "check", str(FIXTURES / "good.yaml"), "--check", "correctness", "--dtype", "float64", "--lf", "--json", "r.json"
    )
    assert result.exit_code == 0, result.output
    assert "no failures recorded, running everything selected" in result.output
    # 4 shapes contiguous, 3 noncontiguous (0-d has no strided form), 3 offset (an empty tensor has no element to
    # start one into).
    assert len(ids_in(tmp_path / "r.json")) == 10
    assert recorded(tmp_path) == {}


def _store(tmp_path, failed: dict[str, str]) -> None:
    (tmp_path / STORE).parent.mkdir(exist_ok=True)
    (tmp_path / STORE).write_text(json.dumps({"failed": failed}))


def test_last_failed_with_targets_whose_failures_are_not_recorded_runs_them_whole(tmp_path):
    _store(tmp_path, {"other/native::correctness[x]": str(FIXTURES / "ignores_strides.yaml")})
    result = invoke(
        "check", str(FIXTURES / "good.yaml"), "--check", "correctness", "--dtype", "float64", "--lf", "--json", "r.json"
    )
    assert result.exit_code == 0, result.output
    assert "no failures recorded for the selected specs, running everything selected" in result.output
    # 4 shapes contiguous, 3 noncontiguous (0-d has no strided form), 3 offset (an empty tensor has no element to
    # start one into).
    assert len(ids_in(tmp_path / "r.json")) == 10


def test_last_failed_with_targets_reruns_only_their_recorded_failures(tmp_path):
    spec = str(FIXTURES / "ignores_strides.yaml")
    invoke("check", spec, str(FIXTURES / "good.yaml"), "--check", "correctness", "--dtype", "float32")
    failed = set(recorded(tmp_path))
    assert failed and all(i.startswith("ignores_strides/") for i in failed)
    result = invoke("check", spec, "--lf", "--json", "r.json")
    assert result.exit_code == 1, result.output
    assert set(ids_in(tmp_path / "r.json")) == failed


def test_last_failed_forgets_ids_a_whole_run_of_their_op_no_longer_produces(tmp_path):
    # A case renamed since it failed: rerunning it runs nothing, and then it is forgotten instead of "rerun" forever.
    stale = "good/native::correctness[float32-cpu-contiguous-x=999]"
    _store(tmp_path, {stale: str(FIXTURES / "good.yaml")})
    first = invoke("check", "--lf", "--json", "r.json")
    assert first.exit_code == 5, first.output  # it ran nothing: never a pass
    assert ids_in(tmp_path / "r.json") == [] and recorded(tmp_path) == {}
    # A filtered run proves nothing about the ids it did not select: they stay.
    _store(tmp_path, {stale: str(FIXTURES / "good.yaml")})
    invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness", "--dtype", "float64")
    assert list(recorded(tmp_path)) == [stale]


def test_last_failed_skips_and_forgets_a_spec_that_no_longer_exists(tmp_path):
    spec = FIXTURES / "ignores_strides.yaml"
    invoke("check", str(spec), "--check", "correctness", "--dtype", "float32")
    failed = recorded(tmp_path)
    gone = str(tmp_path / "deleted.yaml")
    _store(tmp_path, {**failed, "deleted/native::correctness[x]": gone})
    result = invoke("check", "--lf", "--json", "r.json")
    assert result.exit_code == 1, result.output
    assert f"{gone} no longer exists; its recorded failures are skipped" in " ".join(result.output.split())
    assert set(ids_in(tmp_path / "r.json")) == set(failed)
    assert recorded(tmp_path) == failed


def _result(check: str, case: str, status: Status, **extra) -> CaseResult:
    return CaseResult(
        op="op",
        implementation="native",
        check=check,
        case_id=case,
        dtype="float32",
        device="cpu",
        status=status,
        **extra,
    )


def test_record_keeps_failures_that_did_not_rerun_and_drops_a_load_failure_once_the_op_loads(tmp_path):
    crash = CaseResult(
        op="op", implementation="native", check="load", case_id="-", dtype="-", device="-", status=Status.CRASH
    )
    (tmp_path / "op.yaml").write_text("")
    record(tmp_path, RunReport({}, ops=[OpReport("op", "op.yaml", [crash])]))
    assert list(recorded(tmp_path)) == ["op/native::load[-]"]
    run = RunReport(
        {},
        ops=[
            OpReport(
                "op", "op.yaml", [_result("correctness", "a", Status.FAIL), _result("correctness", "b", Status.PASS)]
            )
        ],
    )
    record(tmp_path, run)
    assert recorded(tmp_path) == {"op/native::correctness[a]": "op.yaml"}
    (tmp_path / STORE).write_text("{not json")
    assert recorded(tmp_path) == {}


def test_markdown_summary_counts_per_op_and_shows_failures_with_worst_mismatch_and_repro():
    mismatch = Mismatch(
        output="result",
        index=(3,),
        got=1.5,
        expected=1.25,
        abs_error=0.25,
        rel_error=0.2,
        atol=1e-5,
        rtol=1.3e-6,
        mismatched=1,
        total=7,
    )
    bad = OpReport(
        "bad",
        "bad.yaml",
        [
            _result(
                "correctness",
                "x=7",
                Status.FAIL,
                message="outputs differ",
                mismatch=mismatch,
                seed=42,
                repro="opforge check bad.yaml -k x=7",
            ),
            _result("correctness", "x=0d", Status.PASS),
            _result("correctness", "x=5", Status.CRASH, message="the worker process died: SIGSEGV\n```\nframe"),
        ],
        seconds=2.0,
    )
    good = OpReport("good", "good.yaml", [_result("correctness", "x=7", Status.PASS)])
    text = render_markdown(RunReport({"torch": "2.13.0"}, ops=[bad, good], seed=3, seconds=4.25, incomplete=True))
    assert text.startswith("## opforge: FAILED (incomplete: interrupted)\n")
    assert text.splitlines()[2] == "2 pass, 1 fail, 1 crash in 4.2 s (torch 2.13.0, seed 3)"
    assert "| ❌ bad | 1 | 1 | · | 1 | · | · | · | · | 2.0 |" in text and "| ✅ good | 1 |" in text
    assert "**FAIL** `op/native::correctness[x=7]`" in text
    assert "worst mismatch in result at [3]: got 1.5, expected 1.25" in text
    assert "repro: `opforge check bad.yaml -k x=7`" in text
    assert text.count("```") == 4, "a fence inside a message must not break the summary's code blocks"


def test_markdown_summary_caps_the_failures_it_lists():
    op = OpReport("bad", "bad.yaml", [_result("correctness", str(i), Status.FAIL) for i in range(MAX_FAILURES + 5)])
    text = render_markdown(RunReport({}, ops=[op]))
    assert text.count("**FAIL**") == MAX_FAILURES and "... and 5 more failures" in text


def test_results_round_trip_through_json():
    mismatch = Mismatch(
        output="result",
        index=(1, 2),
        got=1.0,
        expected=2.0,
        abs_error=1.0,
        rel_error=0.5,
        atol=0.0,
        rtol=0.0,
        mismatched=1,
        total=4,
    )
    original = _result("gradcheck", "c", Status.TIMEOUT, mismatch=mismatch, warnings=("w",), seed=1, repro="r")
    assert result_from_json(json.loads(json.dumps(result_json(original)))) == original


def test_a_nan_in_a_mismatch_still_makes_a_strict_json_report(tmp_path):
    result = invoke("check", str(FIXTURES / "swallows_nan.yaml"), "--check", "special_values", "--json", "r.json")
    assert result.exit_code == 1, result.output

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    report = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    mismatches = [r["mismatch"] for op in report["ops"] for r in op["results"] if r["mismatch"]]
    assert any("nan" in (m["got"], m["expected"]) for m in mismatches), mismatches


def test_non_finite_floats_round_trip_as_strings():
    mismatch = Mismatch(
        output="result",
        index=(0,),
        got=0.0,
        expected=math.nan,
        abs_error=math.inf,
        rel_error=-math.inf,
        atol=0.0,
        rtol=0.0,
        mismatched=1,
        total=1,
    )
    original = _result("special_values", "c", Status.FAIL, mismatch=mismatch)
    data = json.loads(dumps_json(result_json(original)))
    assert (data["mismatch"]["expected"], data["mismatch"]["abs_error"], data["mismatch"]["rel_error"]) == (
        "nan",
        "inf",
        "-inf",
    )
    back = result_from_json(data).mismatch
    assert math.isnan(back.expected) and back.abs_error == math.inf and back.rel_error == -math.inf


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_reports_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_atomically(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == mode


@pytest.mark.parametrize("option", ["--json", "--junit", "--markdown"])
def test_an_unwritable_report_path_is_refused_before_the_run(tmp_path, option):
    (tmp_path / "a_file").write_text("")
    result = invoke(
        "check",
        str(FIXTURES / "good.yaml"),
        "--check",
        "correctness",
        "--junit",
        "ok.xml",
        option,
        str(tmp_path / "a_file" / "r.out"),
    )
    assert result.exit_code == 2, result.output
    assert f"{option}: expected a path a report can be written to" in result.output
    assert "Traceback" not in result.output and "OK:" not in result.output
    assert not (tmp_path / "ok.xml").exists()


def test_a_shard_run_keeps_the_failures_other_shards_recorded(tmp_path):
    """A --shard K/N run produces only its shard's ids: a failure of the same op in another shard is not stale."""
    (tmp_path / "op.yaml").write_text("")
    other_shard = RunReport({}, ops=[OpReport("op", "op.yaml", [_result("correctness", "a", Status.FAIL)])])
    record(tmp_path, other_shard, Filters(shard=(1, 2)))
    this_shard = RunReport({}, ops=[OpReport("op", "op.yaml", [_result("correctness", "b", Status.PASS)])])
    record(tmp_path, this_shard, Filters(shard=(2, 2)))
    assert recorded(tmp_path) == {"op/native::correctness[a]": "op.yaml"}
    record(tmp_path, this_shard, Filters())  # a whole run that no longer produces it forgets it
    assert recorded(tmp_path) == {}
