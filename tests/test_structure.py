"""The structure opforge keeps: a folder per layer (every module in one, but the named entry points), no import
cycles, lower layers never import higher ones, a check is one object that the catalog alone makes known to the spec
loader, the engine, every report format and `--check`, and a check's outcomes are checked against the result names it
declares."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO
from typer.testing import CliRunner

from opforge.checks.base import Check, all_cases
from opforge.checks.catalog import CATALOG
from opforge.core.outcomes import CheckFailure, PassNote
from opforge.core.results import Status

PACKAGE = REPO / "opforge"

# The layers, bottom first, one package (a folder of opforge/) each: a module's layer is its folder's, and it may
# import its own layer and those below, never above (docs/architecture.md says what lives in each).
LAYERS = [
    "core",
    "spec",
    "cases",
    "building",
    "ops",
    "checks",
    "loading",
    "engine",
    "bench",
    "fuzz",
    "tools",
    "reporters",
    "run",
    "commands",
]
# The only modules at the top of opforge/, outside every layer's folder: the package itself and the entry points that
# something outside opforge names by path (pyproject.toml's console script and pytest11 plugin, `python -m opforge`,
# the `opforge.recorded:samples` that `opforge record` writes into users' specs), each with the layer it belongs to.
ENTRY_POINTS = {
    "__init__": "core",
    "recorded": "core",
    "cli": "commands",
    "__main__": "commands",
    "pytest_plugin": "commands",
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the opforge modules it imports, at module level or inside functions."""
    edges = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found |= {t.removeprefix("opforge.") for t in targets if t.startswith("opforge.")} & modules.keys()
        edges[name] = found - {name}
    return edges


def _layer(module: str) -> int:
    """The index in LAYERS of a module's layer: its top folder's, or the one its entry point is named with."""
    layer = ENTRY_POINTS.get(module, module.split(".")[0])
    assert layer in LAYERS, f"{module} is in no layer's folder"
    return LAYERS.index(layer)


def test_every_module_is_in_a_layer_folder_or_a_named_entry_point():
    modules = _modules()
    loose = sorted(m for m in modules if "." not in m and m not in LAYERS and m not in ENTRY_POINTS)
    assert not loose, f"modules at the top of opforge/, in no layer: {loose} (move each into its layer's folder)"
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py")))
    assert folders == sorted(LAYERS), "every folder of Python modules under opforge/ is one layer of LAYERS"
    assert all((PACKAGE / layer / "__init__.py").is_file() for layer in LAYERS)
    assert all((PACKAGE / f"{name}.py").is_file() for name in ENTRY_POINTS)


def test_no_module_imports_one_that_imports_it_back():
    edges = _imports(_modules())

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if reaches(b, a)})
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_no_lower_layer_imports_a_higher_one():
    edges = _imports(_modules())
    upward = [
        f"{a} ({LAYERS[_layer(a)]}) imports {b} ({LAYERS[_layer(b)]})"
        for a, targets in edges.items()
        for b in targets
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.slow
def test_an_isolated_run_keeps_the_parent_torch_free():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from opforge.cli import app\n"
        f"result = CliRunner().invoke(app, ['check', {str(FIXTURES / 'good.yaml')!r}, '--check', 'correctness', "
        "'--dtype', 'float64'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "the parent of an isolated run imported torch"


# ------------------------------------------------------------------------------------ a check through the catalog


def _toy_run(context, implementation, case):
    """Result toy:small passes with a note; result toy:even fails on every 2-D case."""
    two_d = any(len(shape) == 2 for _, shape in case.shapes)
    return {"toy:small": PassNote("toy note"), "toy:even": CheckFailure("toy failure") if two_d else None}


def _spec_listing(tmp_path: Path, checks: str) -> Path:
    """good.yaml with its own `checks:` list, next to a copy of its module."""
    text = (FIXTURES / "good.yaml").read_text()
    start = text.index("checks: [")
    end = text.index("]", start) + 1
    path = tmp_path / "good.yaml"
    path.write_text(text[:start] + f"checks: [{checks}]" + text[end:])
    (tmp_path / "broken_ops.py").write_text((FIXTURES / "broken_ops.py").read_text())
    return path


@pytest.fixture
def toy_check(monkeypatch):
    """A new check known to the catalog alone: no other module names it."""
    toy = Check("toy", "a toy check", all_cases, _toy_run, results=("toy:small", "toy:even"))
    monkeypatch.setattr(CATALOG, "_checks", {**CATALOG._checks, "toy": toy})
    monkeypatch.setattr(CATALOG, "_by_result", {**CATALOG._by_result, "toy:small": toy, "toy:even": toy})
    return toy


def test_a_check_added_to_the_catalog_alone_is_planned_run_reported_and_selectable(toy_check, tmp_path):
    from opforge.cli import app

    spec = _spec_listing(tmp_path, "correctness, toy")
    args = ["check", str(spec), "--no-isolation", "--dtype", "float64", "--check", "toy"]
    reports = ["--json", "r.json", "--junit", "r.xml", "--markdown", "r.md"]
    result = CliRunner().invoke(app, args + reports, env={"NO_COLOR": "1"})
    assert result.exit_code == 1, result.output
    # The terminal: its rows in the table, the failure with its rerun command selecting the check.
    assert "toy:small" in result.output and "toy:even" in result.output
    assert "--check toy -k " in result.output
    data = json.loads((tmp_path / "r.json").read_text())
    rows = [r for op in data["ops"] for r in op["results"]]
    assert {r["check"] for r in rows} == {"toy:small", "toy:even"}
    assert {r["status"] for r in rows if r["check"] == "toy:small"} == {"pass"}
    failed = [r for r in rows if r["status"] == "fail"]
    assert failed and all(r["check"] == "toy:even" and "x=5x6" in r["case_id"] for r in failed)
    assert "toy failure" in (tmp_path / "r.xml").read_text()
    assert "good/native::toy:even[" in (tmp_path / "r.md").read_text()
    recorded = json.loads((tmp_path / ".opforge" / "lastfailed.json").read_text())["failed"]
    assert set(recorded) == {r["id"] for r in failed}
    # One of its results on its own.
    only = CliRunner().invoke(app, [*args[:-1], "toy:small"], env={"NO_COLOR": "1"})
    assert only.exit_code == 0 and "toy:even" not in only.output, only.output


def test_a_spec_may_list_a_check_the_catalog_knows(toy_check, tmp_path):
    from opforge.loading.spec import load_spec

    assert load_spec(_spec_listing(tmp_path, "correctness, toy")).checks == ("correctness", "toy")


@pytest.mark.parametrize(
    "outcomes, expected",
    [
        (
            {"toy:small": None, "toy:evn": None},
            "returned no outcome for result toy:even (it returned result names it does not ",
        ),
        ({"toy:small": None}, "returned no outcome for result toy:even: a bug in the check"),
        ({"toy:small": None, "toy:even": "fine"}, "returned str for result toy:even, expected None, a PassNote or"),
        (None, "returned NoneType, expected a dict of outcomes by result name"),
    ],
    ids=["typo", "forgotten", "not-an-outcome", "not-a-dict"],
)
def test_a_missing_or_unknown_outcome_is_an_error_result_never_a_pass(toy_check, outcomes, expected, tmp_path):
    from opforge.engine.inprocess import run_op
    from opforge.engine.plan import Filters
    from opforge.loading.checked import load_checked as load
    from opforge.loading.spec import load_spec

    broken = replace(toy_check, run=lambda context, implementation, case: outcomes)
    CATALOG._checks["toy"] = broken
    CATALOG._by_result.update({"toy:small": broken, "toy:even": broken})
    spec = load_spec(_spec_listing(tmp_path, "toy"))
    report = run_op(load(spec), Filters(checks=("toy",), dtypes=("float64",)))
    even = [r for r in report.results if r.check == "toy:even" and r.implementation == "native"]
    assert even and {r.status for r in even} == {Status.ERROR}
    assert all(expected in r.message for r in even), even[0].message


# A check with a command-line option of its own, in a module of its own, joined to the catalog by one line: the
# bootstrap below stands for that line (the catalog is rebound before anything imports it by name).
_TOY_OPTION_MODULE = """
from dataclasses import dataclass

from opforge.checks.base import Check, CheckOption, OptIn, SpecSection, all_cases
from opforge.core.outcomes import CheckFailure
from opforge.spec.reader import Reader, read_number

LOUD = CheckOption("toy-loud", "Also run toy_loud, which fails loudly.")


@dataclass(frozen=True)
class Loudness:
    level: float


def read_loudness(r, spec):
    section = Reader(r.path, r.child("toy_loud"), "toy_loud", ("level",), required=("level",))
    level = section.get("level", read_number)
    if level <= 0:
        raise section.fail(section.child("level"), "toy_loud.level", "a level > 0", repr(level), "Turn it up.")
    return Loudness(level)


def _run(context, implementation, case):
    level = context.loaded.spec.section("toy_loud").level
    return {"toy_loud": CheckFailure(f"loud: {context.opt_ins.get(LOUD.name)!r} at {level}")}


CHECKS = (Check("toy_loud", "a toy check run only when asked", all_cases, _run,
                opt_in=OptIn(lambda o: bool(o.get(LOUD.name))), rerun_flags=(LOUD.flag,), options=(LOUD,),
                claim="toy_loud", section=SpecSection("toy_loud", read_loudness)),)
"""
_TOY_BOOTSTRAP = (
    "import sys\n"
    "sys.path.insert(0, {where!r})\n"
    "import opforge.checks.catalog as catalog, toy_loud\n"
    "catalog.CATALOG = catalog.Catalog((*catalog.CATALOG, *toy_loud.CHECKS))\n"
)


def test_a_check_brings_its_own_option_and_spec_section_to_the_cli_the_plugin_and_the_loader(tmp_path):
    """One module and one catalog line: its flag in `opforge check --help` and `pytest --help`, its section read
    (with file:line errors) and handed to its run, and its tasks run when asked."""
    (tmp_path / "toy_loud.py").write_text(_TOY_OPTION_MODULE)
    spec = _spec_listing(tmp_path, "correctness")
    spec.write_text(spec.read_text() + "toy_loud: {level: 11}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(spec.read_text().replace("toy_loud: {level: 11}", "toy_loud:\n  level: -1"))
    bootstrap = _TOY_BOOTSTRAP.format(where=str(tmp_path))
    load_bad = (
        "from opforge.loading.spec import load_spec\n"
        f"try:\n    load_spec({str(bad)!r})\nexcept Exception as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", bootstrap + load_bad], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    line = bad.read_text().splitlines().index("  level: -1") + 1
    assert f"bad.yaml:{line}: toy_loud.level: expected a level > 0, got -1.0. Turn it up." in done.stdout, done
    cli = bootstrap + (
        "from typer.testing import CliRunner\n"
        "from opforge.cli import app\n"
        "env = {'NO_COLOR': '1', 'COLUMNS': '200'}\n"
        "print(CliRunner().invoke(app, ['check', '--help'], env=env).output)\n"
        f"args = ['check', {str(spec)!r}, '--no-isolation', '--dtype', 'float64', '--check', 'toy_loud']\n"
        "print(CliRunner().invoke(app, args, env=env).output)\n"
        "print(CliRunner().invoke(app, [*args, '--toy-loud'], env=env).output)\n"
    )
    done = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    help_text, unasked, asked = _three(done.stdout)
    assert "--toy-loud" in help_text and "Also run toy_loud" in help_text
    assert "add --toy-loud" in unasked, unasked
    assert "loud: True at 11.0" in asked and "--toy-loud" in asked.split("repro:")[-1], asked
    plugin = bootstrap + "import pytest\nsys.exit(pytest.main(['--help', '-p', 'no:cacheprovider']))\n"
    done = subprocess.run([sys.executable, "-c", plugin], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "--opforge-toy-loud" in done.stdout, done.stdout + done.stderr


def _three(output: str) -> tuple[str, str, str]:
    """The help, then the two runs' outputs, split at each run's first line (the op's table title)."""
    first = output.index("good  (")
    second = output.index("good  (", first + 1)
    return output[:first], output[first:second], output[second:]


# ------------------------------------------------------------------------------- a check as an oracle of fuzz


@pytest.fixture
def toy_oracle(toy_check, monkeypatch):
    """The toy check, declaring that it judges one example: nothing under opforge/fuzz/ names it."""
    from opforge.checks.base import OneExample

    toy = replace(toy_check, one_example=OneExample())
    monkeypatch.setattr(CATALOG, "_checks", {**CATALOG._checks, "toy": toy})
    monkeypatch.setattr(CATALOG, "_by_result", {**CATALOG._by_result, "toy:small": toy, "toy:even": toy})
    return toy


def test_a_check_that_judges_one_example_is_an_oracle_of_fuzz_through_the_catalog_alone(toy_oracle, tmp_path):
    """Its applicability comes from where `opforge check` takes it (the spec's checks), `--check` selects it by its
    name or a result's, its failure is its oracle's, and the spec's xfail entries declare it as they do for check."""
    from opforge.building.op import load_op
    from opforge.cases.matrix import kept_case
    from opforge.fuzz.oracles import Judge
    from opforge.fuzz.search import oracles_for
    from opforge.loading.spec import load_spec
    from opforge.spec.model import Regression

    spec = load_spec(_spec_listing(tmp_path, "correctness, toy"))
    assert oracles_for(spec, "cpu") == ("correctness", "toy")
    assert oracles_for(spec, "cpu", ("toy:even",)) == oracles_for(spec, "cpu", ("toy",)) == ("toy",)
    assert "toy" not in oracles_for(load_spec(_spec_listing(tmp_path, "correctness")), "cpu")
    two_d = Regression("float64", "cpu", "contiguous", (("x", (5, 6)),), (), "", 0)
    one_d = replace(two_d, shapes=(("x", (7,)),))
    judge = Judge(load_op(spec, None))
    failed = judge(kept_case(spec, two_d, "fuzz"), ("correctness", "toy"))
    assert (failed.status, failed.oracle, failed.message) == (Status.FAIL, "toy", "toy failure"), failed
    assert judge(kept_case(spec, one_d, "fuzz"), ("correctness", "toy")).status == Status.PASS
    path = spec.path
    path.write_text(path.read_text() + "xfail:\n  - {check: toy, reason: a toy bug}\n")
    declared = load_spec(path)
    known = Judge(load_op(declared, None))(kept_case(declared, two_d, "fuzz"), ("toy",))
    assert (known.status, known.message) == (Status.XFAIL, "expected failure (a toy bug): toy failure"), known


@pytest.mark.parametrize(
    "names",
    [["opcheck"], ["opcheck:test_faketensor"], ["correctness", "determinism"], []],
    ids=["a-check", "a-result", "two-checks", "none"],
)
def test_check_selects_the_same_in_check_and_fuzz(tmp_path, names):
    """What `opforge check --check` runs, of the results fuzz can judge an example by, is what `opforge fuzz --check`
    judges by."""
    from opforge.cli import app

    spec = str(FIXTURES / "fuzz_ops" / "doubles.yaml")
    selection = [arg for name in names for arg in ("--check", name)]
    report = tmp_path / "check.json"
    check = CliRunner().invoke(
        app, ["check", spec, "--no-isolation", "--dtype", "float32", "--json", str(report), *selection]
    )
    assert check.exit_code == 0, check.output
    ran = {r["check"] for op in json.loads(report.read_text())["ops"] for r in op["results"]}
    example = '{"shapes": {"x": [7]}}'
    fuzz = CliRunner().invoke(app, ["fuzz", spec, "--example", example, *selection], env={"COLUMNS": "300"})
    assert fuzz.exit_code == 0, fuzz.output
    judged = fuzz.output.split("pass (")[1].split(")")[0].split(", ")
    assert sorted(judged) == sorted(ran & set(CATALOG.oracles)), (judged, ran)


def test_fuzz_still_reads_check_fake_and_says_what_to_write_instead():
    from opforge.cli import app

    example = '{"shapes": {"x": [7]}}'
    args = ["fuzz", str(FIXTURES / "fuzz_ops" / "doubles.yaml"), "--example", example, "--check", "fake"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "--check fake is deprecated: write --check opcheck:test_faketensor" in result.output
    assert "pass (opcheck:test_faketensor)" in result.output


# A check that judges one example, in a module of its own, joined to the catalog in every process of the run (the
# fuzz worker, the fork server) by a sitecustomize that stands for its catalog line.
_TOY_ORACLE_MODULE = """
from opforge.checks.base import Check, OneExample, all_cases
from opforge.core.outcomes import CheckFailure


def _run(context, implementation, case):
    wide = any(shape and shape[-1] > 6 for _, shape in case.shapes)
    return {"toy_wide": CheckFailure("toy: too wide") if wide else None}


CHECKS = (Check("toy_wide", "a toy check fuzz judges by", all_cases, _run, one_example=OneExample()),)
"""
_TOY_SITECUSTOMIZE = (
    "import opforge.checks.catalog as catalog, toy_wide\n"
    "catalog.CATALOG = catalog.Catalog((*catalog.CATALOG, *toy_wide.CHECKS))\n"
)


def test_a_check_module_with_one_example_is_searched_by_opforge_fuzz_end_to_end(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "toy_wide.py").write_text(_TOY_ORACLE_MODULE)
    (site / "sitecustomize.py").write_text(_TOY_SITECUSTOMIZE)
    spec = _spec_listing(tmp_path, "correctness, toy_wide")
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1"}
    args = ["fuzz", str(spec), "--seed", "0", "--max-examples", "40", "-x", "--json", str(tmp_path / "f.json")]
    command = [sys.executable, "-m", "opforge", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["oracles"] == ["correctness", "toy_wide"], data["oracles"]
    assert [(f["check"], f["message"]) for f in data["failures"]] == [("toy_wide", "toy: too wide")], data["failures"]
