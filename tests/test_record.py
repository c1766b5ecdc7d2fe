"""`opforge record -- COMMAND` then `opforge check OUT/*.yaml` with no edits, as an outside user runs them: a small
library of custom ops (tests/fixtures/record/reclib.py: one fake with wrong strides, one op reading strided input as
contiguous, correct ones, one returning a list) called by a program (prog.py) the way user code calls them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES

from opforge.core.results import Status
from opforge.recorded import read_calls

RECORD = FIXTURES / "record"
OPFORGE = [sys.executable, "-m", "opforge"]


def record(
    out: Path, *args: str, options: tuple[str, ...] = (), program: str = "prog.py"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OPFORGE, "record", "--out", str(out), *options, "--", sys.executable, program, *args],
        cwd=RECORD,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_program_runs_unchanged_and_its_exit_status_is_passed_through(tmp_path):
    alone = subprocess.run([sys.executable, "prog.py", "3"], cwd=RECORD, capture_output=True, text=True, timeout=300)
    recorded = record(tmp_path / "out", "3")
    assert alone.returncode == recorded.returncode == 3
    assert recorded.stdout == alone.stdout  # opforge writes to stderr only, after the program
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    ops = ["float32_only", "reads_contiguous", "scale_rows", "segment_sum", "split_halves", "wrong_fake_strides"]
    assert written == sorted([f"reclib.{op}.yaml" for op in ops] + [f"reclib.{op}.calls.zip" for op in ops])
    # Two distinct calls each: the program's third step repeats its first one's shapes.
    calls = read_calls(tmp_path / "out" / "reclib.segment_sum.calls.zip")
    assert len(calls) == 2
    lengths = calls[0]["arguments"]["lengths"]
    assert lengths["dtype"] == "int64" and lengths["values"].tolist() == [1, 2, 1]
    spec = (tmp_path / "out" / "reclib.scale_rows.yaml").read_text()
    assert (
        "x: {requires_grad: true}" in spec
        and "differentiable: true" in spec
        and "reference:" not in spec.replace("# reference:", "")
    )


def test_checking_the_recorded_specs_flags_exactly_the_broken_ops_by_the_right_check(tmp_path):
    from typer.testing import CliRunner

    from opforge.cli import app

    out = tmp_path / "out"
    assert record(out).returncode == 0
    report = tmp_path / "report.json"
    specs = sorted(str(p) for p in out.glob("*.yaml"))
    result = CliRunner().invoke(app, ["check", *specs, "--no-isolation", "--json", str(report), "--seed", "0"])
    assert result.exit_code == 1, result.output
    import json

    failing: dict[str, set[str]] = {}
    for op in json.loads(report.read_text())["ops"]:
        failing[op["op"]] = {r["check"] for r in op["results"] if r["status"] not in ("pass", "skip")}
        passed = [r for r in op["results"] if r["status"] == "pass"]
        assert passed, op["op"]
    # Strided input read as contiguous: wrong values on non-contiguous layouts, and past the view's elements values
    # that change run to run; compile too, where the compiled graph's copy of the view reads other memory.
    assert "correctness" in failing.pop("reads_contiguous") <= {"correctness", "determinism", "compile"}
    assert failing == {
        "float32_only": set(),
        "scale_rows": set(),
        "segment_sum": set(),
        "split_halves": set(),
        # The fake's strides: what opcheck's fake-tensor test and compile (which trusts the fake) catch.
        "wrong_fake_strides": {"opcheck:test_faketensor", "compile"},
    }


def test_specs_written_inside_the_program_s_tree_load_it_by_a_relative_path_and_move_with_it(tmp_path):
    """`--out recorded` run from the project writes `load.path` relative to the spec; elsewhere it stays absolute."""
    import shutil

    from opforge.building.op import load_op
    from opforge.loading.spec import load_spec

    project = tmp_path / "project"
    shutil.copytree(RECORD, project, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [*OPFORGE, "record", "--out", "recorded", "--", sys.executable, "prog.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert 'path: [".."]' in (project / "recorded" / "reclib.scale_rows.yaml").read_text()
    moved = shutil.move(project, tmp_path / "moved")
    loaded = load_op(load_spec(Path(moved) / "recorded" / "reclib.scale_rows.yaml"))
    assert loaded.spec.name == "scale_rows"
    elsewhere = (tmp_path / "out").resolve()
    assert record(elsewhere).returncode == 0
    assert f"path: [{str(RECORD.resolve())!r}]".replace("'", '"') in (elsewhere / "reclib.scale_rows.yaml").read_text()


def test_the_command_names_each_spec_it_wrote_and_exits_with_the_program_s_status(tmp_path):
    from typer.testing import CliRunner

    from opforge.cli import app

    out = tmp_path / "out"
    program = [sys.executable, str(RECORD / "prog.py"), "3"]
    result = CliRunner().invoke(app, ["record", "--out", str(out), "--", *program], env={"COLUMNS": "300"})
    assert result.exit_code == 3, result.output
    assert f"opforge record: reclib::scale_rows: 2 call(s) -> {out / 'reclib.scale_rows.yaml'}" in result.output
    assert f"opforge record: next: opforge check {out}/*.yaml" in result.output


def test_a_crash_keeps_the_calls_recorded_before_it(tmp_path):
    done = record(tmp_path / "out", "crash")
    assert done.returncode == 128 + 11  # SIGSEGV, as a shell reports it
    assert done.stdout == "step 0: loss 1.2971\n"
    assert len(read_calls(tmp_path / "out" / "reclib.scale_rows.calls.zip")) == 1


def test_child_processes_record_too_and_max_calls_caps_each_op(tmp_path):
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import subprocess, sys\n"
        f"sys.exit(subprocess.run([sys.executable, 'prog.py'], cwd={str(RECORD)!r}).returncode)\n"
    )
    done = record(tmp_path / "out", options=("--max-calls", "1", "--namespace", "reclib"), program=str(parent))
    assert done.returncode == 0, done.stderr
    assert len(read_calls(tmp_path / "out" / "reclib.scale_rows.calls.zip")) == 1


def test_a_tensor_past_the_size_cap_is_kept_as_a_summary_and_still_checks(tmp_path):
    from helpers import run_spec

    out = tmp_path / "out"
    assert record(out, options=("--max-elements", "8", "--namespace", "reclib")).returncode == 0
    calls = read_calls(out / "reclib.segment_sum.calls.zip")
    values = calls[0]["arguments"]["values"]
    assert values["values"] is None and values["summary"]["max"] >= values["summary"]["min"]
    assert calls[0]["arguments"]["lengths"]["values"] is not None  # integers: 16 times the cap
    report = run_spec(out / "reclib.segment_sum.yaml", seed=0, checks=("correctness",))
    assert {r.status for r in report.results} == {Status.PASS}


def test_another_namespace_records_nothing(tmp_path):
    done = record(tmp_path / "out", options=("--namespace", "elsewhere"))
    assert done.returncode == 0
    assert "no custom-op call was recorded" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_opforge_checking_under_a_recording_records_nothing_of_its_own(tmp_path):
    spec = RECORD / "float32_only.yaml"
    done = subprocess.run(
        [*OPFORGE, "record", "--out", str(tmp_path / "out"), "--", *OPFORGE, "check", str(spec), "--no-isolation"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no custom-op call was recorded" in done.stderr
