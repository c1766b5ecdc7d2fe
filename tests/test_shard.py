"""`--shard K/N` and `opforge merge-reports`: the shards of a run cover its tasks exactly once, their merged report is
the unsharded run's, and a merge that lacks a shard is refused (its tasks never ran)."""

from __future__ import annotations

import json

import pytest
from helpers import FIXTURES, in_process
from typer.testing import CliRunner

from opforge.building.op import load_op
from opforge.cli import app
from opforge.core.shard import owns, parse_shard
from opforge.engine.inprocess import run_op
from opforge.engine.plan import Filters
from opforge.loading.spec import load_spec

# The quick tier (`pytest -m "not slow"`) leaves these out. Whole runs, sharded and merged.
pytestmark = pytest.mark.slow

runner = CliRunner()
GOOD = str(FIXTURES / "good.yaml")
BENCH_GOOD = str(FIXTURES / "bench_good.yaml")
QUICK = ("--budget", "0.05", "--warmup", "0.01", "--min-reps", "4", "--noise", "0.5")


@pytest.fixture(autouse=True)
def fake_peak(tmp_path, monkeypatch):
    """As in test_bench.py: bench's peak bandwidth from a cache of this test's own, not a 256 MiB copy."""
    from opforge.bench import peak as peak_module

    monkeypatch.setattr(peak_module, "cache_file", lambda: tmp_path / "peak.json")
    monkeypatch.setattr(peak_module, "measure_copy", lambda device: (10.0, "fake copy", 1024))


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def statuses(report_path) -> dict[str, str]:
    data = json.loads(report_path.read_text())
    return {r["id"]: r["status"] for op in data["ops"] for r in op["results"]}


def test_the_shards_of_a_run_hold_each_of_its_results_once():
    loaded = load_op(load_spec(FIXTURES / "good.yaml"))
    full = {r.full_id for r in run_op(loaded, Filters(checks=("correctness", "opcheck"))).results}
    shards = [
        {r.full_id for r in run_op(loaded, Filters(checks=("correctness", "opcheck"), shard=(k, 3))).results}
        for k in (1, 2, 3)
    ]
    assert all(shards), "a shard of a 100-result run got nothing"
    assert set().union(*shards) == full and sum(map(len, shards)) == len(full)


def test_a_task_s_shard_is_stable_and_its_results_stay_together():
    # One planned task (opcheck on a case) reports several results: they are one unit of work.
    loaded = load_op(load_spec(FIXTURES / "good.yaml"))
    rows = run_op(loaded, Filters(checks=("opcheck",), shard=(2, 3))).results
    by_case: dict[str, set[str]] = {}
    for r in rows:
        by_case.setdefault(r.case_id, set()).add(r.check)
    assert by_case and all(len(checks) > 1 for checks in by_case.values())
    assert owns((1, 4), "good/native::correctness[float32-cpu-contiguous-x=7]") == owns(
        (1, 4), "good/native::correctness[float32-cpu-contiguous-x=7]"
    )


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_a_shard_that_is_no_k_of_n_is_a_usage_error(text):
    result = invoke("check", GOOD, "--shard", text)
    assert result.exit_code == 2, result.output
    assert "--shard: expected K/N with 1 <= K <= N" in result.output and "Traceback" not in result.output
    assert parse_shard(" 2 / 4 ") == (2, 4)


def test_merged_shards_are_the_unsharded_run(tmp_path):
    args = ("check", GOOD, "--check", "correctness", "--check", "opcheck")
    assert invoke(*args, "--json", str(tmp_path / "full.json")).exit_code == 0
    for k in (1, 2, 3):
        result = invoke(*args, "--shard", f"{k}/3", "--json", str(tmp_path / f"s{k}.json"))
        assert result.exit_code == 0, result.output
        assert f"(shard {k}/3: merge the shards' --json with opforge merge-reports)" in result.output
    shards = [str(tmp_path / f"s{k}.json") for k in (1, 2, 3)]
    merged = invoke("merge-reports", *shards, "--json", str(tmp_path / "m.json"), "--junit", str(tmp_path / "m.xml"))
    assert merged.exit_code == 0, merged.output
    assert statuses(tmp_path / "m.json") == statuses(tmp_path / "full.json")
    assert json.loads((tmp_path / "m.json").read_text())["shard"] is None
    assert (tmp_path / "m.xml").read_text().count("<testcase") == len(statuses(tmp_path / "full.json"))


def test_a_merge_keeps_a_shard_s_failure(tmp_path):
    spec = str(FIXTURES / "ignores_offset.yaml")
    codes = [
        invoke("check", spec, "--check", "correctness", "--shard", f"{k}/2", "--json", str(tmp_path / f"s{k}.json"))
        for k in (1, 2)
    ]
    assert 1 in {c.exit_code for c in codes}
    merged = invoke("merge-reports", str(tmp_path / "s1.json"), str(tmp_path / "s2.json"))
    assert merged.exit_code == 1 and "FAILED" in merged.output, merged.output


def test_a_merge_without_every_shard_is_refused(tmp_path):
    for k in (1, 2, 3):
        invoke("check", GOOD, "--check", "correctness", "--shard", f"{k}/3", "--json", str(tmp_path / f"s{k}.json"))
    missing = invoke("merge-reports", str(tmp_path / "s1.json"), str(tmp_path / "s3.json"))
    assert missing.exit_code == 2
    assert "expected each of the shards 1/3 .. 3/3 once, got missing 2/3" in " ".join(missing.output.split())
    doubled = invoke("merge-reports", *(str(tmp_path / f"s{k}.json") for k in (1, 2, 3, 3)))
    assert doubled.exit_code == 2 and "twice 3/3" in doubled.output


def test_a_shard_that_gets_no_tasks_is_no_pass(tmp_path):
    # One task, in whichever shard of 2 owns it: the other shard ran nothing.
    row = "good/native::correctness[float32-cpu-contiguous-x=7]"
    empty = 2 if owns((1, 2), row) else 1
    result = invoke(
        "check", GOOD, "--check", "correctness", "-k", "float32-cpu-contiguous-x=7]", "--shard", f"{empty}/2"
    )
    assert result.exit_code == 5, result.output


def test_bench_shards_split_points_and_merge_into_one_baseline(tmp_path):
    base = (
        "bench",
        BENCH_GOOD,
        "--contender",
        "native",
        "--contender",
        "eager",
        "--mode",
        "fwd",
        "--sizes",
        "64,128,256,512",
    )
    for k in (1, 2):
        result = invoke(*base, "--shard", f"{k}/2", "--json", str(tmp_path / f"b{k}.json"), *QUICK)
        assert result.exit_code == 0, result.output
    halves = [json.loads((tmp_path / f"b{k}.json").read_text())["results"] for k in (1, 2)]
    assert all(halves) and {r["id"] for r in halves[0]}.isdisjoint(r["id"] for r in halves[1])
    merged = invoke(
        "merge-reports", str(tmp_path / "b1.json"), str(tmp_path / "b2.json"), "--json", str(tmp_path / "b.json")
    )
    assert merged.exit_code == 0, merged.output
    data = json.loads((tmp_path / "b.json").read_text())
    assert len(data["results"]) == 8 and "shard" not in data["options"]
    # A shard gated on the merged baseline compares its own points and does not call the others' missing.
    gated = invoke(*base, "--shard", "1/2", "--baseline", str(tmp_path / "b.json"), *QUICK)
    assert "of the baseline were not run" not in gated.output, gated.output


def test_merged_bench_shards_keep_every_shards_points_slower_than_a_baseline(tmp_path):
    base = ("bench", BENCH_GOOD, "--contender", "native", "--contender", "eager", "--mode", "fwd", "--sizes", "64,128")
    for k in (1, 2):
        assert invoke(*base, "--shard", f"{k}/2", "--json", str(tmp_path / f"b{k}.json"), *QUICK).exit_code == 0
        path = tmp_path / f"b{k}.json"
        data = json.loads(path.read_text())
        native = next(r["id"] for r in data["results"] if r["contender"] == "native")
        data["trailing"] = [{"result": native, "baseline": "eager", "ratio": 1.5, "low": 1.4, "high": 1.6}]
        path.write_text(json.dumps(data))
    paths = [str(tmp_path / f"b{k}.json") for k in (1, 2)]
    assert invoke("merge-reports", *paths, "--json", str(tmp_path / "b.json")).exit_code == 0
    merged = json.loads((tmp_path / "b.json").read_text())["trailing"]
    assert len(merged) == 2 and merged[0]["result"] != merged[1]["result"]


def test_check_and_bench_reports_do_not_merge_together(tmp_path):
    invoke("check", GOOD, "--check", "correctness", "--json", str(tmp_path / "c.json"))
    invoke(
        "bench",
        BENCH_GOOD,
        "--contender",
        "native",
        "--mode",
        "fwd",
        "--sizes",
        "64",
        "--json",
        str(tmp_path / "b.json"),
        *QUICK,
    )
    result = invoke("merge-reports", str(tmp_path / "c.json"), str(tmp_path / "b.json"))
    assert result.exit_code == 2 and "expected reports of one kind" in result.output
