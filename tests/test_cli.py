"""The command line: exit codes, reports, and output that reads well in a CI log."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from xml.etree import ElementTree

import pytest
from helpers import FIXTURES, REPO, in_process
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.results import JSON_SCHEMA_VERSION

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def test_list_shows_bundled_specs():
    result = invoke("list")
    assert result.exit_code == 0
    assert "opforge::leaky_swish" in result.output and "opforge::custom_loss" in result.output


def test_passing_spec_exits_0_with_summary_table():
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness")
    assert result.exit_code == 0, result.output
    assert "correctness" in result.output and "pass" in result.output
    assert "OK:" in result.output


def test_failing_spec_exits_1_with_worst_mismatch_seed_and_repro():
    result = invoke("check", str(FIXTURES / "ignores_strides.yaml"), "--check", "correctness", "--dtype", "float32")
    assert result.exit_code == 1, result.output
    assert "worst mismatch in result at [" in result.output
    assert "seed:" in result.output and "repro: opforge check" in result.output
    assert "FAILED:" in result.output


def test_repro_command_reruns_exactly_that_case(tmp_path):
    report_path = tmp_path / "r.json"
    invoke("check", str(FIXTURES / "ignores_strides.yaml"), "--check", "correctness", "--json", str(report_path))
    failing = [r for op in json.loads(report_path.read_text())["ops"] for r in op["results"] if r["status"] == "fail"]
    repro = shlex.split(failing[0]["repro"])
    assert repro[:2] == ["opforge", "check"]
    rerun_path = tmp_path / "rerun.json"
    result = invoke(*repro[1:], "--json", str(rerun_path))
    assert result.exit_code == 1, result.output
    rerun = [r for op in json.loads(rerun_path.read_text())["ops"] for r in op["results"]]
    # The gaps of a strided view are uninitialized memory, so only the id and the inputs' seed must repeat.
    assert [(r["id"], r["seed"], r["status"]) for r in rerun] == [(failing[0]["id"], failing[0]["seed"], "fail")]


def test_json_and_junit_reports(tmp_path):
    json_path, junit_path = tmp_path / "out" / "r.json", tmp_path / "r.xml"
    result = invoke(
        "check",
        str(FIXTURES / "wrong_gradient.yaml"),
        "--check",
        "gradcheck",
        "--check",
        "correctness",
        "--json",
        str(json_path),
        "--junit",
        str(junit_path),
    )
    assert result.exit_code == 1
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == JSON_SCHEMA_VERSION and data["environment"]["torch"]
    rows = data["ops"][0]["results"]
    assert {r["check"] for r in rows} == {"gradcheck", "correctness"}
    assert all({"id", "status", "seconds", "seed", "dtype", "device", "case_id"} <= r.keys() for r in rows)
    suite = ElementTree.parse(junit_path).getroot().find("testsuite")
    assert int(suite.get("failures")) == sum(r["status"] == "fail" for r in rows) > 0
    assert suite.find("testcase/failure") is not None


def test_filters_dtype_device_check_and_keyword(tmp_path):
    path = tmp_path / "r.json"
    invoke(
        "check",
        str(FIXTURES / "good.yaml"),
        "--dtype",
        "float64",
        "--check",
        "correctness",
        "-k",
        "x=7",
        "--json",
        str(path),
    )
    rows = json.loads(path.read_text())["ops"][0]["results"]
    assert rows and all(r["dtype"] == "float64" and r["check"] == "correctness" and "x=7" in r["id"] for r in rows)


def test_unavailable_device_is_reported_as_skipped_not_dropped(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = tmp_path / "r.json"
    result = invoke("check", "custom_loss", "--device", "cuda", "--json", str(path))
    assert result.exit_code == 5, result.output  # every row skipped: nothing ran, never a pass
    rows = json.loads(path.read_text())["ops"][0]["results"]
    assert rows and {r["status"] for r in rows} == {"skip"}
    assert "CUDA is not available" in rows[0]["message"]


def test_fail_fast_stops_at_first_failure(tmp_path):
    path = tmp_path / "r.json"
    invoke("check", str(FIXTURES / "ignores_strides.yaml"), "--check", "correctness", "-x", "--json", str(path))
    rows = json.loads(path.read_text())["ops"][0]["results"]
    assert [r["status"] for r in rows].count("fail") == 1 and rows[-1]["status"] == "fail"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["check"], "an op name, a spec path or --all"),
        (["check", "no_such_op"], "Run `opforge list`"),
        (["check", "good", "--dtype", "float33"], "--dtype: expected one of"),
    ],
)
def test_bad_usage_exits_2_without_traceback(args, fragment):
    result = invoke(*args)
    assert result.exit_code == 2
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_bad_spec_exits_2_with_file_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIXTURES / "good.yaml").read_text().replace("dtypes:", "dtypez:"))
    result = invoke("check", str(bad))
    assert result.exit_code == 2
    assert f"{bad}:" in result.output and "unknown key 'dtypez'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_build_error_exits_3_with_first_compiler_error_and_log():
    result = invoke("check", str(FIXTURES / "build_error" / "broken.yaml"))
    assert result.exit_code == 3, result.output
    assert "broken.cpp:4:" in result.output and "error:" in result.output
    assert "build.log" in result.output
    assert result.output.count("expected the sources to compile") == 1, "a build error is printed once, not twice"


def test_build_command_reports_cached_library():
    result = invoke("build", "leaky_swish")
    assert result.exit_code == 0, result.output
    assert "leaky_swish" in result.output and ".so" in result.output


def test_python_dash_m_and_help_do_not_import_torch():
    code = (
        "import sys, runpy; sys.argv=['opforge', '--help']\n"
        "try:\n    runpy.run_module('opforge', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert "check" in out.stdout and out.stdout.strip().endswith("False")


COMMANDS = ["check", "fuzz", "bench", "build", "merge-reports", "profile", "new", "doctor", "list", "record", "scan"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_value_words_not_python_types(command):
    """Every option that takes a value names it with a word (its metavar), in every typer release: typer 0.29 would
    show the Python type (`<str>`, `<list[str]>`) where no metavar is given."""
    result = runner.invoke(app, [command, "--help"], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    option_lines = [line for line in result.output.splitlines() if re.match(r"^│\s+(--|-\w\b)", line)]
    assert option_lines, result.output
    typed = [line.strip() for line in option_lines if re.search(r"<(?!bool>)[a-zA-Z\[\]|]+>", line)]
    assert not typed, "options showing a Python type instead of a word (add metavar=...):\n" + "\n".join(typed)
    assert "Show this message and exit." in result.output


def test_unclaimed_dtype_that_works_is_noted_in_the_report():
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "dtypes")
    assert result.exit_code == 0, result.output
    assert (
        "note: native: int32 on cpu is not claimed, but works on all 10 cases of the spec (returns float32)"
        in result.output
    )


def test_large_index_is_skipped_as_opt_in_until_asked_for():
    import torch

    spec = str(FIXTURES / "cuda_ops" / "int32_index_swish.yaml")
    result = invoke("check", spec, "--check", "large_index")
    assert result.exit_code == 5, result.output  # its only row skipped: nothing ran
    assert "skip: opt-in: large_index needs ~8 GiB of GPU memory" in result.output
    asked = invoke("check", spec, "--check", "large_index", "--large")
    assert "opt-in" not in asked.output, asked.output
    # With a GPU the check runs and catches the fixture's int32 index; without one it is skipped as needing CUDA.
    assert asked.exit_code == (1 if torch.cuda.is_available() else 5), asked.output


def test_a_sanitizer_check_named_without_sanitize_says_which_flag_asks_for_it():
    # Seen on an H200: `--check memcheck` alone ran nothing and pointed at skip lines that were not there.
    spec = str(FIXTURES / "good.yaml")
    result = invoke("check", spec, "--check", "memcheck")
    assert result.exit_code == 5, result.output
    assert "--check memcheck: expected a check this run asked for" in result.output
    assert "add --sanitize memcheck" in result.output
    asked = invoke("check", spec, "--check", "memcheck", "--sanitize", "memcheck")
    assert "runs only when asked" not in asked.output, asked.output


def test_a_check_run_that_ends_in_an_error_leaves_no_heartbeat_printing(monkeypatch):
    """The run's heartbeat (a thread, without a terminal) stops however the run ends, not only when it completes."""
    import threading

    from opforge.core.errors import OpforgeError
    from opforge.engine import inprocess

    def fail(*args, **kwargs):
        raise OpforgeError("the run failed: expected it to. Nothing to do.")

    monkeypatch.setattr(inprocess, "run_in_process", fail)
    result = invoke("check", str(FIXTURES / "good.yaml"))
    assert result.exit_code == 2 and "the run failed" in result.output
    alive = [t.name for t in threading.enumerate() if t.name == "opforge-heartbeat"]
    assert not alive, "the heartbeat thread outlived its run"
