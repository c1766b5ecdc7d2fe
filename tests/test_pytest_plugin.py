"""The pytest plugin: `pytest --opforge` turns specs into one item per op x check x case, with opforge's ids and
failure text, and works with -k, --junitxml and pytest-xdist."""

from __future__ import annotations

import importlib.metadata
import shutil
from xml.etree import ElementTree

import pytest
from helpers import FIXTURES, REPO

# The quick tier (`pytest -m "not slow"`) leaves these out. Each test runs pytest in a subprocess.
pytestmark = pytest.mark.slow

pytest_plugins = ["pytester"]


def _installed_as_entry_point() -> bool:
    return any(ep.value == "opforge.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


# Installed (CI's venv), pytest loads the plugin through its pytest11 entry point, and naming it again would
# register it twice; run from a checkout, it is named with -p.
PLUGIN = [] if _installed_as_entry_point() else ["-p", "opforge.pytest_plugin"]


@pytest.fixture
def specs(pytester, monkeypatch):
    """good.yaml and ignores_strides.yaml next to the fixtures' module, in pytester's directory."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    for name in ("broken_ops.py", "good.yaml", "ignores_strides.yaml"):
        shutil.copy(FIXTURES / name, pytester.path / name)
    return pytester


def run(pytester, *args: str):
    # A subprocess: the fixtures' module registers torch ops on import, which pytester's in-process runs would
    # repeat once its snapshot of sys.modules is restored.
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args)


def test_items_have_opforge_ids_and_failures_show_the_worst_mismatch_and_repro(specs):
    result = run(
        specs,
        "--opforge",
        "good.yaml",
        "ignores_strides.yaml",
        "-k",
        "correctness and float32",
        "-rf",
        "--junitxml=report.xml",
        "-v",
    )
    result.stdout.fnmatch_lines(
        [
            "*good.yaml::good/native::correctness?float32-cpu-contiguous-x=7? PASSED*",
            "*ignores_strides.yaml::ignores_strides/native::correctness?float32-cpu-transposed-x=5x6? FAILED*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "FAIL: ignores_strides/native::correctness*",
            "worst mismatch in result at *",
            "seed: *",
            "repro: opforge check *",
        ]
    )
    outcomes = result.parseoutcomes()
    # good: 10 cases (4 contiguous, 3 offset, 3 strided); ignores_strides: 7 pass, its 3 strided cases fail.
    assert outcomes["passed"] == 10 + 7 and outcomes["failed"] == 3, result.stdout.str()
    assert result.ret == 1
    suite = ElementTree.parse(specs.path / "report.xml").getroot().find("testsuite")
    assert suite.get("tests") == "20" and suite.get("failures") == "3"
    failure = suite.find("testcase/failure")
    assert "worst mismatch in result" in failure.text


def test_skips_and_xfails_keep_their_meaning(specs):
    (specs.path / "ignores_strides.yaml").write_text(
        (FIXTURES / "ignores_strides.yaml").read_text() + "devices: [cpu, cuda]\n"
        "xfail: [{check: correctness, strict: false, reason: reads the storage linearly}]\n"
    )
    result = run(specs, "--opforge", "ignores_strides.yaml", "-k", "correctness and float32", "-rsx")
    import torch

    # Per device 7 pass (contiguous and offset) and 3 xfail; without a GPU the CUDA half is one skipped item.
    expected = {"passed": 14, "xfailed": 6} if torch.cuda.is_available() else {"passed": 7, "xfailed": 3, "skipped": 1}
    assert {k: v for k, v in result.parseoutcomes().items() if k not in ("deselected", "seconds")} == expected
    result.stdout.fnmatch_lines(["*reads the storage linearly*"])
    if not torch.cuda.is_available():
        result.stdout.fnmatch_lines(["SKIPPED*CUDA is not available*"])


def test_a_broken_spec_is_one_clean_collection_error(specs):
    (specs.path / "bad.yaml").write_text((FIXTURES / "good.yaml").read_text().replace("dtypes:", "dtypez:"))
    result = run(specs, "--opforge", "bad.yaml")
    result.stdout.fnmatch_lines(["*bad.yaml:*: dtypez: expected one of *unknown key 'dtypez'*"])
    assert "Traceback" not in result.stdout.str()
    assert result.ret == 2  # pytest's "interrupted by collection errors"


def test_without_the_flag_specs_are_not_collected(specs):
    (specs.path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    result = run(specs, ".")
    result.assert_outcomes(passed=1)


def test_xdist_spreads_the_items_over_workers(specs):
    pytest.importorskip("xdist")
    result = run(specs, "--opforge", "good.yaml", "-k", "float64 and (correctness or opcheck)", "-n", "2")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["created: 2/2 workers"])
    # 10 cases (3 of them offset); opcheck: the 7 others x 4 sub-tests (aligned inputs only).
    assert result.parseoutcomes()["passed"] == 10 + 7 * 4


def test_a_bad_check_option_value_is_a_usage_error_naming_it(specs):
    result = run(specs, "--opforge", "--opforge-sanitize", "memchek", "good.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--opforge-* option*--sanitize*memchek*"])


def test_one_item_is_selected_by_its_node_id(specs):
    node = "good.yaml::good/native::correctness[float64-cpu-contiguous-x=7]"
    result = run(specs, "--opforge", node, "-v")
    result.stdout.fnmatch_lines(["good.yaml::good/native::correctness?float64-cpu-contiguous-x=7? PASSED*"])
    assert result.parseoutcomes()["passed"] == 1, result.stdout.str()


def test_an_ops_items_run_in_one_context_so_compile_tasks_share_their_function():
    """As in the engine's workers, the compile tasks of one (implementation, dtype, device) find the function an
    earlier item compiled: one torch.compile per dtype, not one per item (and no dynamo reset in between)."""
    from opforge.core.results import Status
    from opforge.engine.plan import Filters
    from opforge.pytest_plugin import _Session
    from opforge.run import session as run_session
    from opforge.run.session import RunOptions

    path = REPO / "specs" / "leaky_swish.yaml"
    filters = Filters(dtypes=("float32",), devices=("cpu",), checks=("compile",), keyword="native")
    session = _Session(RunOptions(filters=filters, isolation=False))
    loaded = session.load(path)
    tasks = list(enumerate(run_session.plan(loaded, session.options).tasks))
    assert len(tasks) > 1
    results = [session.result(path, index, task, "compile") for index, task in tasks]
    assert all(r.status == Status.PASS for r in results), [r.message for r in results]
    assert list(session.contexts) == [path] and len(session.contexts[path].shared) == 1
    assert sum(int(r.detail.split()[0]) for r in results) > 8  # past dynamo's 8 graphs per function
