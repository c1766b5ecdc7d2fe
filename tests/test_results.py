"""One result model (issue 41, item 1): one place builds a CaseResult, and fuzz's searches and bench's runs become
results that the JUnit, Markdown and JSON reports render as they do a check run's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree as ET

from helpers import in_process
from typer.testing import CliRunner

import opforge
from opforge.cli import app
from opforge.core.results import JSON_SCHEMA_VERSION, Mismatch, Status, Verdict
from opforge.fuzz.search import Failure, FuzzReport
from opforge.reporters.fuzz_report import FuzzJsonReport
from opforge.reporters.junit import JunitReport
from opforge.reporters.markdown import render_markdown
from opforge.spec.model import Regression

runner = CliRunner()
MINIMAL = Regression("float32", "cpu", "contiguous", (("x", (7,)),), (), "", 3)
SHRUNK_FROM = Regression("float32", "cpu", "contiguous", (("x", (4, 7)),), (), "", 3)
MISMATCH = Mismatch("result", (6,), 0.0, 12.0, 12.0, 1.0, 1e-5, 1.3e-6, 1, 7)


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def a_search(failures: int = 1, judged: int = 40) -> FuzzReport:
    failure = Failure(
        "correctness",
        "result: 1 of 7 elements differ",
        MINIMAL,
        Verdict(Status.FAIL, "result: 1 of 7 elements differ", MISMATCH, oracle="correctness", cause="wrong values"),
        1.5,
        12,
        SHRUNK_FROM,
    )
    return FuzzReport(
        "doubles_short_tail",
        Path("doubles_short_tail.yaml"),
        "cpu",
        ("correctness", "fake"),
        examples=50,
        judged=judged,
        failures=[failure] * failures,
        seconds=4.0,
    )


def junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    root = ET.parse(path).getroot()
    return {(case.get("classname", ""), case.get("name", "")): case for case in root.iter("testcase")}


def test_only_results_builds_a_case_result():
    package = Path(opforge.__file__).parent
    builders = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bCaseResult\(", line)
    ]
    assert [b.split(":")[0] for b in builders] == ["core/results.py"], builders


def test_a_fuzz_failure_is_a_failed_testcase_named_by_its_oracle_and_minimal_example(tmp_path):
    run = a_search().run_report()
    (op,) = run.ops
    failed, passed = op.results
    assert (failed.check, failed.case_id, failed.status) == ("correctness", "float32-cpu-x=7-contiguous", Status.FAIL)
    assert failed.mismatch == MISMATCH and failed.seed == 3 and "(wrong values)" in failed.message
    assert failed.repro is not None and failed.repro.startswith("opforge fuzz doubles_short_tail.yaml --example ")
    assert (passed.check, passed.case_id, passed.status) == ("fake", "search", Status.PASS)
    JunitReport(tmp_path / "fuzz.xml").finish(a_search())
    cases = junit_cases(tmp_path / "fuzz.xml")
    failure = cases["doubles_short_tail.native.correctness", "float32-cpu-x=7-contiguous"].find("failure")
    assert failure is not None and "worst mismatch in result at [6]" in (failure.text or "")
    assert not list(cases["doubles_short_tail.native.fake", "search"])


def test_a_search_that_judged_too_few_examples_is_skipped_never_passed():
    run = a_search(failures=0, judged=2).run_report()
    assert {r.status for r in run.results()} == {Status.SKIP} and run.nothing_ran
    assert render_markdown(run).startswith("## opforge: NOTHING RAN")


def test_fuzz_json_holds_check_results_that_merge_reports_reads(tmp_path):
    FuzzJsonReport(tmp_path / "fuzz.json").finish(a_search())
    data = json.loads((tmp_path / "fuzz.json").read_text())
    assert data["kind"] == "fuzz" and data["schema_version"] == JSON_SCHEMA_VERSION
    assert data["failures"][0]["check"] == "correctness" and data["counts"]["fail"] == 1
    result = invoke("merge-reports", str(tmp_path / "fuzz.json"), "--junit", str(tmp_path / "merged.xml"))
    assert result.exit_code == 1, result.output
    assert ("doubles_short_tail.native.correctness", "float32-cpu-x=7-contiguous") in junit_cases(
        tmp_path / "merged.xml"
    )


def test_merge_reports_still_reads_a_version_2_report(tmp_path):
    run = a_search(failures=0).run_report().to_json()
    counts = {k: v for k, v in run["counts"].items() if k not in ("reject", "discard")}
    (tmp_path / "v2.json").write_text(json.dumps({**run, "schema_version": 2, "counts": counts}))
    result = invoke("merge-reports", str(tmp_path / "v2.json"), "--json", str(tmp_path / "merged.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "merged.json").read_text())["schema_version"] == JSON_SCHEMA_VERSION
