"""`opforge scan NS`: on a small library written like outside code (tests/fixtures/scan_ops/scanlib.py: plain
torch.library, an op per missing piece), every op's kernels, fake kernel, formula, vmap rule and schema writes, and
exactly the flags each op earns: a test fails if a flag is missing or one is wrong. Then the table at 80 columns, the
specs that name an op with their last run, --json, and the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.errors import UsageError
from opforge.core.results import CaseResult, OpReport, RunReport, Status
from opforge.reporters.lastfailed import STORE, last_runs, record
from opforge.tools.scan import CEA, CIA, FlagKind, LastRun, ScannedOp, scan

LIBRARY = FIXTURES / "scan_ops"
NO_FAKE, CUDA_ONLY, MUTATION = FlagKind.NO_FAKE, FlagKind.CUDA_WITHOUT_CPU, FlagKind.UNDECLARED_MUTATION

# Every op of the fixture library and the flags it must get: no more, no fewer.
EXPECTED_FLAGS = {
    "no_fake": {NO_FAKE},
    "cuda_only": {CUDA_ONLY},
    "scale_": {MUTATION},
    "scale_declared_": set(),
    "add_out": {MUTATION},
    "clear": {MUTATION},
    "good": set(),
    "composite": set(),
    "autograd_only": {NO_FAKE},
    "custom": {NO_FAKE},
    "custom_with_fake": set(),
}


@pytest.fixture(autouse=True)
def _keep_sys_path(monkeypatch) -> None:
    """scan puts the current directory on sys.path, as `python -c` does: a test's tmp_path must not stay there."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def library(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(LIBRARY))


def scanned(**kwargs) -> dict[str, ScannedOp]:
    result = scan("scanlib", ["scanlib"], **kwargs)
    return {op.short_name: op for op in result.ops}


def test_every_op_of_the_namespace_is_a_row_with_exactly_the_flags_it_earns(library):
    ops = scanned()
    assert sorted(ops) == sorted(EXPECTED_FLAGS)
    got = {name: {f.kind for f in op.flags} for name, op in ops.items()}
    assert got == EXPECTED_FLAGS


def test_the_kernels_fake_formula_and_vmap_rule_of_each_op(library):
    ops = scanned()
    # name: (cpu, cuda, fake, autograd, vmap)
    expected = {
        "no_fake": ("CPU", None, None, None, None),
        "cuda_only": (None, "CUDA", "register_fake", None, None),
        "good": ("CPU", None, "register_fake", "Autograd", "FuncTorchBatched"),
        "composite": (CIA, CIA, CIA, CIA, CIA),
        "autograd_only": (None, None, None, "Autograd", None),
        # custom_op registers Meta and Autograd kernels whatever was given: scan reads what was registered.
        "custom": (CEA, CEA, None, None, None),
        "custom_with_fake": ("CPU", None, "register_fake", "register_autograd", "register_vmap"),
        # FakeTensor makes the result of an op that returns nothing and marks a write: no fake kernel needed.
        "scale_declared_": ("CPU", None, "trivial", None, None),
    }
    got = {
        name: (ops[name].cpu, ops[name].cuda, ops[name].fake, ops[name].autograd, ops[name].vmap) for name in expected
    }
    assert got == expected
    assert ops["good"].kernels == ("CPU", "Meta", "Autograd", "FuncTorchBatched")
    assert ops["composite"].kernels == (CIA,)
    assert ops["custom"].custom_op and not ops["good"].custom_op


def test_what_each_schema_writes_and_why_a_mutation_is_flagged(library):
    ops = scanned()
    assert ops["scale_declared_"].writes == ("x",)
    assert ops["scale_"].writes == () and ops["add_out"].writes == ()
    assert [f.message for f in ops["scale_"].flags] == [
        "named in-place (ends in '_'); its schema marks no argument written"
    ]
    assert [f.message for f in ops["add_out"].flags] == [
        "named as an out variant (ends in _out) and takes Tensor out; its schema marks no argument written"
    ]
    assert ops["cuda_only"].flags[0].message.endswith("on CPU tensors it raises NotImplementedError")


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("f(Tensor x, *, Tensor out) -> Tensor", "an out= argument (out)"),
        ("f(Tensor grad, Tensor out) -> Tensor", None),  # ATen's attention backwards read their forward's out
        ("f.out(Tensor x, Tensor o) -> Tensor", "an out overload (.out)"),
        ("fOut(Tensor output, Tensor x) -> Tensor", "named as an out variant (ends in Out) and takes Tensor output"),
        (
            "f_out(Tensor x, Tensor? out_lengths) -> Tensor",
            "named as an out variant (ends in _out) and takes Tensor out_lengths",
        ),
        ("f_jagged_out(Tensor x, Tensor x_offsets) -> Tensor", None),  # fbgemm's sll ops: a jagged result
        ("fOut(Tensor x) -> Tensor", None),
        (
            "f(Tensor x) -> ()",
            "it returns nothing and torch.compile drops it as dead code (if it only checks, register it as effectful)",
        ),
        ("f(Tensor grad_output, Tensor output) -> Tensor", None),  # a backward reads its forward's output
        ("f(Tensor x, Tensor output_offsets) -> Tensor", None),
        ("f__(Tensor x) -> Tensor", None),
        ("f(int n) -> ()", None),
    ],
)
def test_what_looks_like_a_mutation_from_the_name_and_schema_alone(schema, why):
    import torch

    from opforge.tools.scan import _looks_mutating

    parsed = torch._C.parse_schema(f"scanlib::{schema}")
    assert _looks_mutating(parsed.name, parsed.overload_name, parsed) == why


def test_ops_that_return_nothing_and_torch_compile_keeps_are_not_flagged():
    """aten::_linalg_check_errors returns nothing and writes nothing; torch.compile keeps it (torch lists it as
    side-effectful), so it writes nothing unmarked that compile would lose."""
    import torch

    from opforge.tools.scan import _looks_mutating

    schema = torch.ops.aten._linalg_check_errors.default._schema
    assert _looks_mutating("aten::_linalg_check_errors", "", schema) is None
    assert _looks_mutating("scanlib::f", "", schema) is not None  # the same schema, an op torch knows nothing of


def test_the_table_fits_80_columns_marks_each_flagged_cell_and_exits_1(tmp_path):
    """As a user runs it: a fresh process, an 80-column terminal, the library importable from the directory."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "PYTHONPATH": str(LIBRARY)}
    done = subprocess.run(
        [sys.executable, "-m", "opforge", "scan", "scanlib", "--import", "scanlib"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    rows = {line.split()[1] if line.startswith("!") else line.split()[0]: line for line in lines[2:13]}
    assert sorted(rows) == sorted(EXPECTED_FLAGS)
    cells = {name: row.split()[1:] if not row.startswith("!") else row.split()[2:] for name, row in rows.items()}
    #                 CPU    CUDA  fake    grad   vmap   writes
    assert cells["no_fake"] == ["y", "-", "NONE", "-", "-", "-"]
    assert cells["cuda_only"] == ["NONE", "y", "fake", "-", "-", "-"]
    assert cells["scale_"] == ["y", "-", "fake", "-", "-", "NONE"]
    assert cells["good"] == ["y", "-", "fake", "y", "y", "-"]
    assert cells["composite"] == ["CIA", "CIA", "CIA", "CIA", "CIA", "-"]
    assert cells["autograd_only"] == ["-", "-", "NONE", "y", "-", "-"]
    assert cells["scale_declared_"] == ["y", "-", "auto", "-", "-", "x"]
    flagged = {name for name, row in rows.items() if row.startswith("!")}
    assert flagged == {name for name, flags in EXPECTED_FLAGS.items() if flags}
    text = " ".join(done.stdout.split())
    assert "! fake NONE (3 ops): no fake kernel" in text
    assert "1 of them: its only kernel is Autograd, which fake tensors reach outside torch.inference_mode" in text
    assert "! CPU NONE (1 op): a CUDA kernel and no CPU or composite one" in text
    assert "! writes NONE (3 ops)" in text and "scale_: named in-place (ends in '_')" in text
    assert "11 ops, 7 flagged (no-fake 3, cuda-without-cpu 1, undeclared-mutation 3)" in text


def test_specs_that_name_an_op_and_their_last_run(library, tmp_path, monkeypatch):
    specs = tmp_path / "specs"
    (specs / "nested").mkdir(parents=True)
    (specs / "good.yaml").write_text("op: scanlib::good\nschema: whatever\n")
    (specs / "nested" / "good_again.yml").write_text("op: scanlib::good.default\n")
    (specs / "no_fake.yaml").write_text("op: scanlib::no_fake\n")
    (specs / "not_a_spec.yaml").write_text("- a list\n")
    (specs / "broken.yaml").write_text("op: [unclosed\n")
    monkeypatch.chdir(tmp_path)
    report = RunReport(
        environment={},
        ops=[
            OpReport("scanlib::good", "specs/good.yaml", [result(Status.PASS)] * 10 + [result(Status.FAIL)] * 2),
            OpReport("scanlib::good", "specs/nested/good_again.yml", [result(Status.PASS)] * 3),
        ],
    )
    record(tmp_path, report)
    assert json.loads((tmp_path / STORE).read_text())["runs"] == {
        "specs/good.yaml": {"results": 12, "failed": 2},
        "specs/nested/good_again.yml": {"results": 3, "failed": 0},
    }
    runs = last_runs(tmp_path)
    assert runs[(specs / "good.yaml").resolve()] == LastRun(12, 2)

    result_ = scan("scanlib", ["scanlib"], Path("specs"), runs)
    ops = {op.short_name: op for op in result_.ops}
    assert [(c.spec, c.results, c.failed) for c in ops["good"].specs or ()] == [
        ("specs/good.yaml", 12, 2),
        ("specs/nested/good_again.yml", 3, 0),
    ]
    assert [(c.spec, c.results) for c in ops["no_fake"].specs or ()] == [("specs/no_fake.yaml", None)]
    assert ops["composite"].specs == ()
    assert result_.unreadable_specs == ("specs/broken.yaml",)

    out = CliRunner().invoke(
        app,
        ["scan", "scanlib", "--import", "scanlib", "--specs", "specs", "--json", "scan.json"],
        env={"NO_COLOR": "1"},
    )
    assert out.exit_code == 1, out.output
    rows = {
        line.split()[1] if line.startswith("!") else line.split()[0]: line.split()[-2:]
        for line in out.output.splitlines()[2:13]
    }
    assert rows["good"] == ["2/15", "fail"]
    assert rows["no_fake"][-2:] == ["not", "run"]
    assert rows["composite"][-1] == "-"
    assert "2 named by a spec in specs" in " ".join(out.output.split())
    data = json.loads((tmp_path / "scan.json").read_text())
    assert data["kind"] == "scan" and data["namespace"] == "scanlib"
    assert data["counts"] == {"ops": 11, "flagged": 7, "no-fake": 3, "cuda-without-cpu": 1, "undeclared-mutation": 3}
    by_name = {op["name"]: op for op in data["ops"]}
    assert by_name["scanlib::no_fake"]["flags"] == [
        {"kind": "no-fake", "message": "no register_fake, Meta or composite kernel"}
    ]
    assert by_name["scanlib::good"]["specs"][0] == {"spec": "specs/good.yaml", "results": 12, "failed": 2}


def result(status: Status) -> CaseResult:
    return CaseResult("scanlib::good", "native", "correctness", "x", "float32", "cpu", status)


def test_a_namespace_without_ops_says_so_and_suggests_import(library):
    out = CliRunner().invoke(app, ["scan", "scanlibb"], env={"NO_COLOR": "1"})
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "scan scanlibb: expected operators registered in namespace 'scanlibb', got none." in text
    assert "Pass --import MODULE for the module that registers them" in text
    with pytest.raises(UsageError, match="Namespaces with ops now include scanlib"):
        scan("scanlibb", ["scanlib"])


def test_an_import_that_fails_names_the_module_and_the_error(tmp_path):
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no GPU library here')\n")
    out = CliRunner().invoke(app, ["scan", "x", "--import", "no_such_module_anywhere"], env={"NO_COLOR": "1"})
    assert out.exit_code == 2
    assert "--import no_such_module_anywhere: expected a module Python can import, got ModuleNotFoundError" in " ".join(
        out.output.split()
    )
    # The current directory is importable, as with `python -c`.
    out = CliRunner().invoke(app, ["scan", "x", "--import", "raises_on_import"], env={"NO_COLOR": "1"})
    assert out.exit_code == 2
    assert "got RuntimeError: no GPU library here" in " ".join(out.output.split())


def test_specs_must_be_a_directory(library, tmp_path):
    with pytest.raises(UsageError, match="expected a directory of spec files, got no such directory"):
        scan("scanlib", ["scanlib"], tmp_path / "missing")


def test_scan_is_in_the_help_and_the_readme():
    assert "scan" in CliRunner().invoke(app, ["--help"], env={"NO_COLOR": "1"}).output
    assert "opforge scan " in (REPO / "README.md").read_text()
