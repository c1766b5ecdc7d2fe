"""Crash isolation and time limits: a segfault, an abort or a hang costs one task, the run goes on and its reports are
complete; Ctrl-C leaves an incomplete but well-formed report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import pytest
from helpers import FIXTURES, REPO, requires_cuda
from typer.testing import CliRunner

from opforge.building.op import load_op
from opforge.cli import app
from opforge.core.child import describe_exit, stderr_excerpt
from opforge.core.errors import SpecError, WorkerInternalError
from opforge.core.protocol import Loaded, TaskHeader
from opforge.core.results import OpReport, RunReport, Status
from opforge.engine.events import Events
from opforge.engine.inprocess import run_op
from opforge.engine.isolated import (
    DEFAULT_CHECK_TIMEOUT,
    Isolation,
    Supervisor,
    _OpRun,
    gpus_per_slot,
    multi_gpu_note,
    threads_per_worker,
    time_limit,
    visible_gpus,
)
from opforge.engine.plan import CheckJob, Filters, RunSettings
from opforge.loading.spec import load_spec
from opforge.spec.model import Regression

# The quick tier (`pytest -m "not slow"`) leaves these out. Worker processes, each importing torch and loading an
# op: seconds per test.
pytestmark = pytest.mark.slow

runner = CliRunner()
SEVEN_FLOATS = Regression("float32", "cpu", "contiguous", (("x", (7,)),), (), "", 0)


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1"})


def rows_of(report: dict, op: str) -> dict[str, dict]:
    """Results of one op by the shape part of their case id (x=0d, x=7, x=5x6)."""
    [entry] = [o for o in report["ops"] if o["op"] == op]
    return {r["case_id"].rsplit("-", 1)[-1]: r for r in entry["results"]}


@pytest.fixture(scope="module")
def misbehaving_run(tmp_path_factory):
    """One run, two at a time, over ops that segfault, abort and hang on their 7-element case, then a correct op."""
    out = tmp_path_factory.mktemp("reports")
    specs = [str(FIXTURES / f"{name}.yaml") for name in ("segfaults", "aborts", "hangs", "good")]
    # Module-scoped, so conftest's per-test temporary directory does not apply: the failures it records go here.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(out)
        result = invoke(
            "check",
            *specs,
            "--check",
            "correctness",
            "-k",
            "contiguous",  # not the offset cases: one crash or hang per op is the point
            "-j",
            "2",
            "--json",
            str(out / "r.json"),
            "--junit",
            str(out / "r.xml"),
            "--markdown",
            str(out / "summary.md"),
        )
    return result, json.loads((out / "r.json").read_text()), out


@pytest.mark.parametrize("op, signal_name", [("segfaults", "SIGSEGV"), ("aborts", "SIGABRT")])
def test_a_crash_is_one_crash_result_naming_the_signal_and_the_stack(misbehaving_run, op, signal_name):
    _, report, _ = misbehaving_run
    rows = rows_of(report, op)
    assert {k: r["status"] for k, r in rows.items()} == {"x=0d": "pass", "x=7": "crash", "x=5x6": "pass"}
    crash = rows["x=7"]
    assert crash["id"] == f"{op}/native::correctness[float32-cpu-contiguous-x=7]"
    assert f"died: {signal_name}" in crash["message"]
    # The stderr tail is faulthandler's account, innermost frame first: the line of the op that crashed.
    assert "Fatal Python error" in crash["message"] and "broken_ops.py" in crash["message"]
    assert crash["repro"].startswith("opforge check") and crash["seed"] is not None


def test_a_hang_is_killed_at_the_specs_time_limit_and_the_op_goes_on(misbehaving_run):
    _, report, _ = misbehaving_run
    rows = rows_of(report, "hangs")
    assert {k: r["status"] for k, r in rows.items()} == {"x=0d": "pass", "x=7": "timeout", "x=5x6": "pass"}
    assert "time limit of 10 s" in rows["x=7"]["message"]
    assert rows["x=7"]["seconds"] >= 10


def test_the_run_completes_fails_and_every_report_says_why(misbehaving_run):
    result, report, out = misbehaving_run
    assert result.exit_code == 1, result.output
    assert [o["op"] for o in report["ops"]] == ["segfaults", "aborts", "hangs", "good"]
    assert not report["incomplete"]
    assert report["counts"]["crash"] == 2 and report["counts"]["timeout"] == 1
    assert {r["status"] for r in report["ops"][3]["results"]} == {"pass"}
    assert "CRASH" in result.output and "TIMEOUT" in result.output and "FAILED:" in result.output
    suites = {s.get("name"): s for s in ElementTree.parse(out / "r.xml").getroot()}
    assert suites["segfaults"].get("errors") == "1" and suites["hangs"].get("errors") == "1"
    assert suites["good"].get("errors") == "0"
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## opforge: FAILED")
    assert "| ❌ segfaults | 2 | · | · | 1 |" in summary and "| ✅ good | 12 |" in summary
    assert "**CRASH** `segfaults/native::correctness[float32-cpu-contiguous-x=7]`" in summary
    assert "repro: `opforge check" in summary


@pytest.fixture
def own_servers(monkeypatch):
    """Fork servers of the test's own, closed after it; this process's are back afterwards, still running."""
    from opforge.engine import forkserver

    monkeypatch.setattr(forkserver, "_shared", {})
    yield
    forkserver.close_shared_servers()


def started_children(monkeypatch) -> list[str]:
    """The modules of the children started as processes of their own (not forked) from here on, in order."""
    from opforge.core import child
    from opforge.engine import forkserver

    started: list[str] = []
    start = child.start_in_session

    def recording(module, *args, **kwargs):
        started.append(module)
        return start(module, *args, **kwargs)

    for module in (child, forkserver):  # the fork server's own start too
        monkeypatch.setattr(module, "start_in_session", recording)
    return started


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("forked", marks=pytest.mark.skipif(sys.platform != "linux", reason="forks workers on Linux only")),
        "started",
        "server_did_not_start",
        "server_died",
    ],
)
def test_forked_and_started_workers_report_alike(tmp_path, monkeypatch, request, how):
    """A run forks its workers from a fork server that imported torch once; where it cannot (not Linux, or the
    server did not start or died), each worker starts as a process of its own. The same results either way, a crash's
    fresh worker included."""
    from opforge.engine import forkserver

    started = started_children(monkeypatch)
    monkeypatch.setattr(forkserver, "forks_children", lambda: how != "started")
    if how == "server_did_not_start":
        request.getfixturevalue("own_servers")  # one that has to start
        monkeypatch.setattr(forkserver.ForkServer, "wait_ready", lambda self, limit=0: False)
    if how == "server_died":  # before the first fork: the run goes on without it

        def dead(self, *args):
            raise WorkerInternalError("the fork server has ended: killed")

        monkeypatch.setattr(forkserver.ForkServer, "spawn", dead)
    specs = [str(FIXTURES / "segfaults.yaml"), str(FIXTURES / "good.yaml")]
    result = invoke(
        "check", *specs, "--check", "correctness", "-k", "float32-cpu-contiguous", "-j", "1", "--json", "r.json"
    )
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert {k: r["status"] for k, r in rows_of(report, "segfaults").items()} == {
        "x=0d": "pass",
        "x=7": "crash",
        "x=5x6": "pass",
    }
    assert "SIGSEGV" in rows_of(report, "segfaults")["x=7"]["message"]
    assert {r["status"] for r in rows_of(report, "good").values()} == {"pass"}
    # segfaults' worker, its fresh one after the crash, good's: none started as a process when forked.
    workers = [module for module in started if module == "opforge.engine.worker"]
    assert workers == ([] if how == "forked" else ["opforge.engine.worker"] * 3)


@pytest.mark.skipif(sys.platform != "linux", reason="forks workers on Linux only")
def test_runs_and_fuzz_searches_of_one_process_fork_from_one_server(tmp_path, monkeypatch, own_servers):
    """The fork server outlives a run: the next run's workers and a fuzz search's worker are forked from it (one
    import of torch for all of them), each in the directory it was asked from (the server started elsewhere)."""
    from opforge.fuzz.process import FuzzWorker

    started = started_children(monkeypatch)
    # -j 1: the workers' environment is then the fuzz worker's (-j 2 gives workers OMP_NUM_THREADS, and a server).
    assert invoke("check", str(FIXTURES / "good.yaml"), "-k", "float32-cpu-contiguous", "-j", "1").exit_code == 0
    elsewhere = tmp_path / "elsewhere"  # the server started in tmp_path
    elsewhere.mkdir()
    shutil.copy(FIXTURES / "good.yaml", elsewhere / "good.yaml")
    shutil.copy(FIXTURES / "broken_ops.py", elsewhere / "broken_ops.py")
    monkeypatch.chdir(elsewhere)  # the spec and its module by relative paths, from here
    result = invoke("check", "good.yaml", "-k", "float32-cpu-contiguous", "-j", "1", "--json", "r.json")
    assert result.exit_code == 0, result.output
    assert {r["status"] for r in rows_of(json.loads(Path("r.json").read_text()), "good").values()} == {"pass"}
    worker = FuzzWorker(Path("good.yaml"), None, time_limit=60.0)
    try:
        assert worker.run(SEVEN_FLOATS, ("correctness",)).status == "pass"
    finally:
        worker.close()
    assert started == ["opforge.engine.forkserver"]


def test_a_server_serves_one_environment_and_a_dead_one_is_replaced(monkeypatch, own_servers):
    from opforge.engine import forkserver

    monkeypatch.setattr(forkserver, "forks_children", lambda: True)
    started = []
    monkeypatch.setattr(forkserver, "ForkServer", lambda environ: started.append(environ) or FakeServer())
    base = {"PATH": "/bin", "PYTEST_CURRENT_TEST": "a"}
    first = forkserver.shared_server(base)
    assert forkserver.shared_server({**base, "PYTEST_CURRENT_TEST": "b"}) is first  # pytest's per-test name
    second = forkserver.shared_server({**base, "OMP_NUM_THREADS": "1"})
    assert second is not first and forkserver.shared_server(base) is first
    first.dead = True
    assert forkserver.shared_server(base) not in (first, second) and first.closed
    assert len(started) == 3 and "PYTEST_CURRENT_TEST" not in started[0]
    forkserver.shared_server({"PATH": "/usr/bin"})  # a third environment: the least recently used one goes
    assert second.closed


class FakeServer:
    def __init__(self):
        self.dead = self.closed = False

    def wait_ready(self) -> bool:
        return True

    def alive(self) -> bool:
        return not self.dead

    def close(self) -> None:
        self.closed = True


def _dead(pid: int) -> bool:
    """Killed: gone, or a zombie (orphaned, it waits for init to reap it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(sys.platform != "linux", reason="forks workers on Linux only")
def test_a_forked_worker_whose_server_died_is_killed_and_its_lost_end_is_an_internal_error():
    from opforge.core.child import with_this_opforge
    from opforge.engine.forkserver import ForkedProcess, ForkServer
    from opforge.engine.isolated import Worker

    server = ForkServer(with_this_opforge(os.environ))
    try:
        assert server.wait_ready()
        job = CheckJob(str(FIXTURES / "hangs.yaml"), Filters(keyword="x=7"), RunSettings(), 0, 600.0)
        worker = Worker(job, with_this_opforge(os.environ), server)
        assert isinstance(worker.proc, ForkedProcess)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        with pytest.raises(WorkerInternalError, match="the fork server has ended"):
            worker.close()
        assert _dead(worker.proc.pid), "the worker outlived its closing"
    finally:
        server.close()


def test_cli_timeout_overrides_the_spec(tmp_path):
    path = tmp_path / "r.json"
    result = invoke(
        "check", str(FIXTURES / "hangs.yaml"), "-k", "contiguous-x=7", "--timeout", "0.5", "--json", str(path)
    )
    assert result.exit_code == 1, result.output
    [row] = json.loads(path.read_text())["ops"][0]["results"]
    assert row["status"] == "timeout" and "time limit of 0.5 s" in row["message"]


@pytest.mark.parametrize("mode", [[], ["--no-isolation"]], ids=["workers", "in-process"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_writes_an_incomplete_report_and_exits_130(tmp_path, signum, mode):
    marker, report_path = tmp_path / "hanging", tmp_path / "r.json"
    env = {**os.environ, "OPFORGE_TEST_MARKER": str(marker), "NO_COLOR": "1"}
    # One worker: the second op has not started when the first hangs (with more, its results would be in the report).
    timeout = [] if mode else ["--timeout", "300", "-j", "1"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opforge",
            "check",
            str(FIXTURES / "hangs.yaml"),
            str(FIXTURES / "good.yaml"),
            *timeout,
            *mode,
            "--json",
            str(report_path),
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C's default action, whatever this test run inherited: a shell starts background jobs with SIGINT
        # ignored, and a Python started that way keeps ignoring it (the SIGINT cases then hang).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for(marker, proc)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    report = json.loads(report_path.read_text())
    assert report["incomplete"] is True
    assert [o["op"] for o in report["ops"]] == ["hangs"]
    assert [r["status"] for r in report["ops"][0]["results"]] == ["pass"]  # the result that finished before Ctrl-C
    assert "interrupted" in output and "(incomplete)" in output
    worker = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


def test_an_interrupt_keeps_the_results_a_worker_sent_before_it(tmp_path, monkeypatch):
    # Seen in a loaded suite run: Ctrl-C came while the parent was an event behind, and the result the worker had
    # finished before hanging was missing from the incomplete report. Here the parent reads nothing until the op
    # hangs, then is interrupted.
    from opforge.engine import isolated

    marker = tmp_path / "hanging"
    real_select = isolated.select.select
    interrupted = []

    def behind_then_interrupted(readers, writers, errors, timeout):
        if interrupted:
            return real_select(readers, writers, errors, timeout)
        if not marker.exists():
            time.sleep(0.05)
            return [], [], []
        interrupted.append(True)
        raise KeyboardInterrupt

    monkeypatch.setattr(isolated, "select", SimpleNamespace(select=behind_then_interrupted))
    run = RunReport(environment={})
    environ = {**os.environ, "OPFORGE_TEST_MARKER": str(marker)}
    supervisor = isolated.Supervisor(
        [load_spec(FIXTURES / "hangs.yaml")],
        Filters(),
        RunSettings(),
        Isolation(jobs=1, timeout=300),
        run,
        Events(),
        environ,
    )
    with pytest.raises(KeyboardInterrupt):
        supervisor.execute()
    assert [r.status for r in run.ops[0].results] == [Status.PASS]


def _wait_for(marker: Path, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the hanging op never started"
        time.sleep(0.1)


def test_in_process_mode_still_runs_and_refuses_what_needs_workers(tmp_path):
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness", "--no-isolation")
    assert result.exit_code == 0, result.output
    result = invoke("check", "good", "--no-isolation", "-j", "2")
    assert result.exit_code == 2 and "only worker processes can run in parallel" in result.output


@pytest.mark.parametrize("option", [["--timeout", "0"], ["--timeout", "nan"], ["-j", "0"]])
def test_bad_run_options_exit_2(option):
    result = invoke("check", str(FIXTURES / "good.yaml"), *option)
    assert result.exit_code == 2 and "expected" in result.output and "Traceback" not in result.output


def test_a_load_error_in_a_worker_is_one_error_result_and_the_other_ops_still_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIXTURES / "good.yaml").read_text().replace("broken_ops:reference", "broken_ops:nope"))
    result = runner.invoke(
        app,
        [
            "check",
            str(bad),
            str(FIXTURES / "good.yaml"),
            "--check",
            "correctness",
            "-j",
            "2",
            "--json",
            "r.json",
            "--markdown",
            "summary.md",
        ],
        env={"NO_COLOR": "1", "PYTHONPATH": str(FIXTURES)},
    )
    assert result.exit_code == 2, result.output
    assert f"{bad}:6: reference: expected a callable 'nope'" in result.output and "Traceback" not in result.output
    report = json.loads((tmp_path / "r.json").read_text())
    [load] = report["ops"][0]["results"]
    assert (load["check"], load["status"], report["ops"][0]["load_exit_code"]) == ("load", "error", 2)
    assert "expected a callable 'nope'" in load["message"]
    assert {r["status"] for r in report["ops"][1]["results"]} == {"pass"}
    assert (tmp_path / "summary.md").read_text().startswith("## opforge: FAILED")


def test_a_crash_while_loading_is_a_crash_load_result(tmp_path):
    (tmp_path / "dies_on_import.py").write_text("import ctypes\nctypes.string_at(0)\n")
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path)  # the spec's reference, found before anything is imported
    spec = tmp_path / "dies.yaml"
    spec.write_text((FIXTURES / "good.yaml").read_text().replace("python: [broken_ops]", "python: [dies_on_import]"))
    result = invoke("check", str(spec), str(FIXTURES / "good.yaml"), "--check", "correctness", "--json", "r.json")
    assert result.exit_code == 1, result.output
    [died, good] = json.loads((tmp_path / "r.json").read_text())["ops"]
    [load] = died["results"]
    assert (load["id"], load["status"]) == ("good/native::load[-]", "crash")
    assert "SIGSEGV" in load["message"] and "while loading the op" in load["message"]
    assert "dies_on_import.py" in load["message"]  # faulthandler's frame of the import that crashed
    assert load["repro"] == f"opforge check {spec} --no-isolation"
    assert {r["status"] for r in good["results"]} == {"pass"}


def test_a_bug_in_a_worker_is_an_internal_error_with_its_traceback_only_under_debug(monkeypatch):
    from dataclasses import asdict

    # A worker that cannot read its job: what a parent and a worker of different opforge versions would do.
    monkeypatch.setattr(Filters, "to_json", lambda self: {**asdict(self), "from_the_future": 1})
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness")
    assert result.exit_code == 4, result.output
    assert "internal error: WorkerInternalError: TypeError" in result.output and "from_the_future" in result.output
    assert "Traceback" not in result.output and "rerun with --debug" in result.output.lower()
    debug = runner.invoke(
        app, ["--debug", "check", str(FIXTURES / "good.yaml"), "--check", "correctness"], env={"NO_COLOR": "1"}
    )
    assert "the worker's traceback:\nTraceback (most recent call last)" in debug.output
    assert type(debug.exception).__name__ == "WorkerInternalError"


def test_a_package_in_the_working_directory_does_not_shadow_opforge_in_a_worker(tmp_path):
    (tmp_path / "opforge").mkdir()
    (tmp_path / "opforge" / "__init__.py").write_text("raise SystemExit('the cwd shadowed opforge')\n")
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness", "--dtype", "float64")
    assert result.exit_code == 0, result.output


def test_fail_fast_stops_the_ops_running_beside_the_one_that_failed(tmp_path):
    result = invoke(
        "check",
        str(FIXTURES / "ignores_strides.yaml"),
        str(FIXTURES / "hangs.yaml"),
        "-j",
        "2",
        "-x",
        "--check",
        "correctness",
        "--dtype",
        "float32",
        "--timeout",
        "300",
        "--json",
        "r.json",
    )
    assert result.exit_code == 1, result.output
    ops = {op["op"]: op["results"] for op in json.loads((tmp_path / "r.json").read_text())["ops"]}
    assert [r["status"] for r in ops["ignores_strides"]].count("fail") == 1
    # Without the stop, its 7-element case would hang for the 300 s limit and be a TIMEOUT result.
    assert "timeout" not in {r["status"] for r in ops["hangs"]}


def test_a_fresh_worker_that_plans_other_tasks_crashes_the_rest_of_the_op_not_the_run():
    class Closed:
        def close(self):
            pass

    spec = load_spec(FIXTURES / "good.yaml")
    run = RunReport({})
    supervisor = Supervisor([], Filters(), RunSettings(), Isolation(), run, Events(), environ={})
    row = TaskHeader(
        implementation="native",
        case_id="c",
        dtype="float32",
        device="cuda",
        layout="contiguous",
        seed=1,
        results=("correctness",),
        group=0,
    )
    op = _OpRun(spec, OpReport("good", str(spec.path)), 10.0, 0, tasks=(row, row, row), next_index=1, spawned=Closed())
    supervisor.active[0] = op
    supervisor._loaded(op, Loaded(count=2))
    assert [r.status for r in op.report.results] == [Status.CRASH, Status.CRASH]
    assert "planned 2 tasks where the first one planned 3" in op.report.results[0].message
    assert not supervisor.active


@requires_cuda
def test_a_cuda_device_assert_does_not_fail_the_tasks_after_it(tmp_path):
    path = tmp_path / "r.json"
    invoke("check", str(FIXTURES / "poisons_cuda.yaml"), str(FIXTURES / "good.yaml"), "--json", str(path))
    report = json.loads(path.read_text())
    [op, good] = report["ops"]
    statuses = {r["case_id"]: r["status"] for r in op["results"]}
    # Every layout's 7-element case fails (the assert, and on the CPU an IndexError); every other case passes.
    assert {r["device"] for r in op["results"]} == {"cpu", "cuda"}
    assert statuses == {case: "fail" if case.endswith("-x=7") else "pass" for case in statuses}
    assert {"float32-cpu-contiguous-x=7", "float32-cuda-contiguous-x=5x6"} <= statuses.keys()
    cuda_failure = next(r for r in op["results"] if r["device"] == "cuda" and r["status"] == "fail")
    assert "device-side assert" in cuda_failure["message"] or "CUDA error" in cuda_failure["message"]
    assert {r["status"] for r in good["results"]} == {"pass"}


def test_the_cuda_fixture_fails_only_its_own_case_on_cpu(tmp_path):
    path = tmp_path / "r.json"
    invoke("check", str(FIXTURES / "poisons_cuda.yaml"), "--device", "cpu", "--json", str(path))
    rows = rows_of(json.loads(path.read_text()), "poisons_cuda")
    assert {k: r["status"] for k, r in rows.items()} == {"x=0d": "pass", "x=7": "fail", "x=5x6": "pass"}
    assert "IndexError" in rows["x=7"]["message"]


# ----------------------------------------------------------------------------------------------- the pieces


def test_worker_slots_get_disjoint_gpu_sets():
    assert gpus_per_slot(2, ["0", "1", "2", "3"]) == ["0,2", "1,3"]
    assert gpus_per_slot(2, ["3", "5", "7"]) == ["3,7", "5"]
    assert gpus_per_slot(4, ["0", "1"]) == ["0", "1", "0", "1"]  # more slots than GPUs: shared, one each
    assert gpus_per_slot(3, []) == [None, None, None]


def test_an_explicit_jobs_splits_the_gpus_and_the_default_count_shares_them_all():
    run, environ = RunReport(environment={}), {"CUDA_VISIBLE_DEVICES": "0,1"}
    split = Supervisor([], Filters(), RunSettings(), Isolation(jobs=2), run, Events(), environ=environ)
    shared = Supervisor([], Filters(), RunSettings(), Isolation(jobs=2, split_gpus=False), run, Events(), environ)
    assert split.gpus == ["0", "1"] and shared.gpus == [None, None]  # None: the environment's, both GPUs


def test_a_slot_too_small_for_multi_gpu_is_noted():
    spec = load_spec(REPO / "specs" / "leaky_swish.yaml")
    assert "multi_gpu" in spec.checks and "cuda" in spec.devices
    note = multi_gpu_note([spec], Filters(), gpus_per_slot(8, [str(i) for i in range(8)]))
    assert note and "leaves a worker 1 of the 8 visible GPUs" in note and "-j 4" in note
    assert multi_gpu_note([spec], Filters(), gpus_per_slot(4, [str(i) for i in range(8)])) is None
    assert multi_gpu_note([spec], Filters(checks=("correctness",)), gpus_per_slot(8, list("01234567"))) is None
    assert multi_gpu_note([spec], Filters(), gpus_per_slot(2, ["0"])) is None  # one GPU: it skips anyway


def test_visible_gpus_keep_the_ids_the_user_gave():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5d1a,GPU-77ff"}) == ["GPU-5d1a", "GPU-77ff"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_cpu_workers_share_the_cores():
    assert threads_per_worker(2, 2) == 1 and threads_per_worker(4, 64) == 16 and threads_per_worker(8, 2) == 1


def test_exit_descriptions():
    assert describe_exit(-11) == "SIGSEGV (signal 11)" and describe_exit(-6) == "SIGABRT (signal 6)"
    assert describe_exit(3) == "exit code 3"


def test_stderr_excerpt_prefers_the_fatal_error_and_its_innermost_frames():
    text = (
        "noise\n" * 50
        + "Fatal Python error: Segmentation fault\n\nCurrent thread (most recent call first):\n"
        + "".join(f'  File "f{i}.py", line {i}\n' for i in range(40))
        + "\nExtension modules: a, b\n(total: 2)\n"
    )
    excerpt = stderr_excerpt(text).splitlines()
    assert excerpt[0] == "Fatal Python error: Segmentation fault" and '"f0.py"' in excerpt[2]
    assert len(excerpt) == 20 and not any("Extension" in line for line in excerpt)
    assert stderr_excerpt("a\nb\n" * 30).splitlines() == ["a", "b"] * 10


def test_time_limit_cli_over_spec_over_default(tmp_path):
    spec = load_spec(FIXTURES / "hangs.yaml")
    assert time_limit(spec, None) == 10 and time_limit(spec, 2.5) == 2.5
    assert time_limit(load_spec(FIXTURES / "good.yaml"), None) == DEFAULT_CHECK_TIMEOUT


@pytest.mark.parametrize("value", ["0", "-3", "soon", ".inf", "[1]"])
def test_spec_timeout_must_be_positive_seconds(tmp_path, value):
    path = tmp_path / "t.yaml"
    text = (FIXTURES / "good.yaml").read_text()
    path.write_text(text + f"timeout: {value}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.key == "timeout" and info.value.line == text.count("\n") + 1
    assert "seconds" in str(info.value) or "a number" in str(info.value)


def test_a_raising_reference_errors_its_cases_and_the_others_still_run(tmp_path):
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    spec = tmp_path / "good.yaml"
    spec.write_text(
        (FIXTURES / "good.yaml").read_text().replace("broken_ops:reference", "broken_ops:reference_raising_on_7")
    )
    report = run_op(load_op(load_spec(spec)), Filters(checks=("correctness",), dtypes=("float32",)))
    statuses = {r.case_id: r.status for r in report.results}
    assert statuses == {
        "float32-cpu-contiguous-x=0d": Status.PASS,
        "float32-cpu-contiguous-x=0": Status.PASS,
        "float32-cpu-contiguous-x=7": Status.ERROR,
        "float32-cpu-contiguous-x=5x6": Status.PASS,
        "float32-cpu-offset-x=0d": Status.PASS,
        "float32-cpu-offset-x=7": Status.ERROR,
        "float32-cpu-offset-x=5x6": Status.PASS,
        "float32-cpu-transposed-x=5x6": Status.PASS,
        "float32-cpu-strided-x=7": Status.ERROR,
        "float32-cpu-strided-x=5x6": Status.PASS,
    }
    error = next(r for r in report.results if r.status == Status.ERROR)
    assert "ZeroDivisionError: the reference divided by zero" in error.message


def test_the_last_op_shares_its_tasks_between_the_free_workers_and_reports_as_one_worker_would(tmp_path, monkeypatch):
    from opforge.engine import isolated

    parts = []
    start = isolated.Supervisor._start

    def recording(self, job, env, own_gpus):
        parts.append((job.part, job.parts))
        return start(self, job, env, own_gpus)

    monkeypatch.setattr(isolated.Supervisor, "_start", recording)
    spec = str(FIXTURES / "segfaults.yaml")
    for jobs in ("1", "2"):
        result = invoke("check", spec, "-k", "contiguous", "-j", jobs, "--json", f"j{jobs}.json")
        assert result.exit_code == 1, result.output

    def rows(name):
        [op] = json.loads((tmp_path / name).read_text())["ops"]
        return [(r["id"], r["status"]) for r in op["results"]]

    assert rows("j2.json") == rows("j1.json")
    assert ("segfaults/native::correctness[float32-cpu-contiguous-x=7]", "crash") in rows("j2.json")
    # -j 1: one worker, then a fresh one after the crash; -j 2: both parts, and the crashed part's fresh worker.
    assert parts[:2] == [(0, 1), (0, 1)] and {(0, 2), (1, 2)} <= set(parts[2:])
    parts.clear()  # one task: the second part has nothing to run, and no worker starts for it
    assert invoke("check", spec, "-k", "contiguous-x=0d", "-j", "2").exit_code == 0
    assert parts == [(0, 2)]


@pytest.mark.skipif(sys.platform != "linux", reason="forks workers on Linux only")
def test_a_process_forked_from_one_that_holds_a_server_leaves_it_running(own_servers):
    from opforge.core.child import with_this_opforge
    from opforge.engine import forkserver

    server = forkserver.shared_server(with_this_opforge(os.environ))
    assert server is not None
    pid = os.fork()
    if pid == 0:  # exits as a Python program does, its atexit handlers run
        code = 0 if not forkserver._shared else 1
        forkserver.close_shared_servers()
        os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert server.alive()


def test_a_child_finds_this_opforge_where_it_is_not_installed(tmp_path):
    """A GPU machine runs the tests from a checkout that pip never installed: a worker finds opforge only by the
    PYTHONPATH with_this_opforge gives it (site-packages off here, so that an editable install cannot hide a wrong
    path: it pointed one folder above the checkout, and every worker died importing opforge)."""
    from opforge.core.child import with_this_opforge

    env = with_this_opforge({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    found = subprocess.run(
        [sys.executable, "-S", "-c", "import opforge; print(opforge.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).parent == REPO / "opforge"


@pytest.mark.slow
def test_a_run_in_this_process_plans_as_many_results_as_it_reports():
    # Found renaming rows: --no-isolation planned one per task while its progress counted results, so good.yaml's
    # opcheck (four results a task) read "28/7 results done".
    from opforge.core.results import RunReport
    from opforge.engine.inprocess import run_in_process
    from opforge.loading.spec import load_spec

    planned: dict[str, int] = {}
    reported: dict[str, int] = {}
    events = Events(
        planned=lambda op, total: planned.__setitem__(op, total),
        result=lambda op, result: reported.__setitem__(op, reported.get(op, 0) + 1),
    )
    filters = Filters(checks=("opcheck",), dtypes=("float32",))
    run = RunReport(environment={})
    run_in_process([load_spec(FIXTURES / "good.yaml")], filters, RunSettings(), None, run, events)
    (op,) = run.ops
    assert planned == reported == {op.op: len(op.results)}, (planned, reported)


@pytest.mark.slow
@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_two_specs_of_one_op_keep_their_progress_apart(tmp_path, isolated):
    # Found on the fbgemm bed: pack_segments and pack_segments_strided_lengths were one op to the progress line,
    # which then read "248/12 results done".
    from opforge.core.results import RunReport
    from opforge.engine.inprocess import run_in_process
    from opforge.engine.isolated import run_isolated
    from opforge.loading.spec import load_spec

    narrow = tmp_path / "good_float32_only.yaml"
    narrow.write_text(
        (FIXTURES / "good.yaml").read_text().replace("dtypes: [float32, float64, bfloat16]", "dtypes: [float32]")
    )
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    shutil.copy(FIXTURES / "good.yaml", tmp_path / "good.yaml")
    specs = [load_spec(tmp_path / "good.yaml"), load_spec(narrow)]
    planned: dict[str, int] = {}
    reported: dict[str, int] = {}
    events = Events(
        planned=lambda op, total: planned.__setitem__(op, total),
        result=lambda op, result: reported.__setitem__(op, reported.get(op, 0) + 1),
    )
    run = RunReport(environment={})
    filters = Filters(checks=("correctness",))
    if isolated:
        run_isolated(specs, filters, RunSettings(), Isolation(), run, events)
    else:
        run_in_process(specs, filters, RunSettings(), None, run, events)
    results = {report.spec_path: len(report.results) for report in run.ops}
    assert sorted(planned.values()) == sorted(reported.values()) == sorted(results.values()), (planned, results)
    assert len(planned) == 2 and len(set(results.values())) == 2, planned
