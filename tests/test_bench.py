"""opforge bench end to end on CPU: wrong implementations are not timed, outputs, the peak cache, bytes moved, and
the regression gate (with a fake timer, so its verdicts do not depend on this machine's noise)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from helpers import FIXTURES, REPO, SPECS, requires_cuda
from test_bench_stats import noisy
from typer.testing import CliRunner

from opforge.bench import peak as peak_module
from opforge.bench.model import BASELINE, BENCH_SCHEMA_VERSION, IMPLEMENTATION, OK, BenchResult
from opforge.bench.timing import Timing, TimingOptions
from opforge.bench.trailing import trailing
from opforge.cli import app
from opforge.engine.events import Events

BENCH_GOOD = str(FIXTURES / "bench_good.yaml")
QUICK = ("--budget", "0.05", "--warmup", "0.01", "--min-reps", "4", "--noise", "0.5")
runner = CliRunner()
REAL_MEASURE_COPY = peak_module.measure_copy  # the autouse fixture below replaces it with a fake


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1"})


@pytest.fixture(autouse=True)
def fake_peak(tmp_path, monkeypatch):
    """A cache of this test's own and a 10 GB/s "measurement", so no test copies 256 MiB."""
    monkeypatch.setattr(peak_module, "cache_file", lambda: tmp_path / "peak.json")
    monkeypatch.setattr(peak_module, "measure_copy", lambda device: (10.0, "fake copy", 1024))


@pytest.fixture
def fake_timer(monkeypatch):
    """Replaces the timers: each contender gets 40 samples with the median and spread set in `state`."""
    state = {"median_s": 1e-3, "spread": 0.02, "seed": 0}

    def fake(call, device, options, reset=None):
        call()
        state["seed"] += 1
        return Timing(tuple(noisy(state["median_s"], state["spread"], n=40, seed=state["seed"])), "fake", 1, "noise")

    monkeypatch.setattr("opforge.bench.runner.time_callable", fake)
    return state


def results_by_id(path) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(path.read_text())["results"]}


# ------------------------------------------------------------------------------------- wrong is not timed


def test_wrong_implementations_are_reported_and_not_timed(tmp_path):
    out = tmp_path / "run.json"
    result = invoke(
        "bench",
        BENCH_GOOD,
        "--sizes",
        "256",
        "--contender",
        "native",
        "--contender",
        "scaled",
        "--contender",
        "wrong_gradient",
        "--contender",
        "eager",
        "--json",
        str(out),
        *QUICK,
    )
    assert result.exit_code == 1, result.output
    rows = results_by_id(out)
    fwd, bwd = "fwd-float32-cpu-n=2^8", "bwd-float32-cpu-n=2^8"
    for ident in (
        f"good/native[{fwd}]",
        f"good/native[{bwd}]",
        f"good/wrong_gradient[{fwd}]",
        f"good/eager[{fwd}]",
        f"good/eager[{bwd}]",
    ):
        assert rows[ident]["status"] == "ok" and rows[ident]["timing"]["samples"], ident
    for ident in (f"good/scaled[{fwd}]", f"good/scaled[{bwd}]", f"good/wrong_gradient[{bwd}]"):
        assert rows[ident]["status"] == "wrong" and rows[ident]["timing"] is None, ident
        assert rows[ident]["mismatch"]["mismatched"] > 0
    assert rows[f"good/scaled[{fwd}]"]["message"].startswith("correctness: result:")
    assert rows[f"good/wrong_gradient[{bwd}]"]["message"].startswith("grad_lowp: grad[x]:")
    assert "WRONG" in result.output and "worst mismatch in result at [" in result.output
    assert "FAILED: 5 timed, 3 wrong" in result.output


def junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    return {(c.get("classname", ""), c.get("name", "")): c for c in ET.parse(path).getroot().iter("testcase")}


def test_bench_junit_fails_a_wrong_case_and_passes_a_timed_one(tmp_path):
    out = tmp_path / "bench.xml"
    impls = ("--contender", "native", "--contender", "scaled")
    result = invoke("bench", BENCH_GOOD, "--sizes", "256", "--mode", "fwd", *impls, "--junit", str(out), *QUICK)
    assert result.exit_code == 1, result.output
    cases = junit_cases(out)
    wrong = cases["good.scaled.bench", "fwd-float32-cpu-n=2^8"].find("failure")
    assert wrong is not None and wrong.get("message", "").startswith("correctness: result:"), cases
    assert "worst mismatch in result at [" in (wrong.text or "")
    assert not list(cases["good.native.bench", "fwd-float32-cpu-n=2^8"])


@pytest.mark.slow
def test_compile_baseline_and_speedup_columns(tmp_path):
    out = tmp_path / "run.json"
    result = invoke(
        "bench",
        BENCH_GOOD,
        "--sizes",
        "256",
        "--mode",
        "fwd",
        "--contender",
        "native",
        "--contender",
        "compile",
        "--json",
        str(out),
        *QUICK,
    )
    assert result.exit_code == 0, result.output
    rows = results_by_id(out)
    assert rows["good/compile[fwd-float32-cpu-n=2^8]"]["status"] == "ok"
    assert "vs compile" in result.output and "x │" in result.output


def test_json_csv_and_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the test extra installs it)")
    paths = {name: tmp_path / name for name in ("run.json", "run.csv", "run.png")}
    result = invoke(
        "bench",
        BENCH_GOOD,
        "--contender",
        "native",
        "--contender",
        "eager",
        "--mode",
        "fwd",
        "--json",
        str(paths["run.json"]),
        "--csv",
        str(paths["run.csv"]),
        "--plot",
        str(paths["run.png"]),
        *QUICK,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(paths["run.json"].read_text())
    assert data["kind"] == "bench" and data["schema_version"] == BENCH_SCHEMA_VERSION
    assert {"cpu_model", "torch_threads", "torch", "torch_cuda", "git_revision"} <= data["environment"].keys()
    assert data["peaks"]["cpu"]["gbps"] == 10.0 and data["options"]["budget_s"] == 0.05
    native = results_by_id(paths["run.json"])["good/native[fwd-float32-cpu-n=2^12]"]
    assert native["bytes"] == 2 * 4096 * 4  # the default: x read once, the result written once
    assert native["timing"]["threads"] >= 1 and native["timing"]["method"].startswith("torch.utils.benchmark")
    assert native["gbps"] == pytest.approx(native["bytes"] / native["median_s"] / 1e9)
    assert native["pct_of_peak"] == pytest.approx(10 * native["gbps"])
    with paths["run.csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and rows[0]["speedup_vs_eager"] and rows[0]["gbps"]
    assert paths["run.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_refused_before_timing(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    result = invoke("bench", BENCH_GOOD, "--plot", str(tmp_path / "run.png"), *QUICK)
    assert result.exit_code == 2, result.output
    assert "--plot: expected matplotlib to be importable" in result.output and "opforge[plot]" in result.output
    assert "peak bandwidth" not in result.output and not (tmp_path / "run.png").exists()


# ------------------------------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["bench", str(FIXTURES / "good.yaml")], "a `bench:` section"),
        (
            ["bench", BENCH_GOOD, "--contender", "nope"],
            "--contender: expected one of native, scaled, wrong_gradient, eager, compile",
        ),
        (["bench", BENCH_GOOD, "--sizes", "2**x"], "--sizes: expected element counts"),
        (["bench", BENCH_GOOD, "--dtype", "bfloat16"], "--dtype: expected one of float32, float64 (what good's spec"),
        (["bench", BENCH_GOOD, "--mode", "both"], "--mode: expected one of fwd, bwd, fwd+bwd"),
        (["bench", BENCH_GOOD, "--noise", "0"], "--noise: expected a fraction 0 < F < 1, got 0.0"),
        (["bench", BENCH_GOOD, "--budget", "-1"], "--budget: expected seconds > 0, got -1.0"),
        (["bench", BENCH_GOOD, "--min-reps", "0"], "--min-reps: expected an integer >= 1, got 0"),
        (["bench", BENCH_GOOD, "--threads", "0"], "--threads: expected an integer >= 1, got 0"),
        (["bench", BENCH_GOOD, "--max-regression", "-2"], "--max-regression: expected a percentage >= 0, got -2.0"),
        (["bench", BENCH_GOOD, "--max-slower", "-1"], "--max-slower: expected a percentage >= 0, got -1.0"),
        (
            ["bench", BENCH_GOOD, "--fail-slower-than", "native"],
            "--fail-slower-than: expected one of eager, compile, got 'native'",
        ),
        (["bench", BENCH_GOOD, "--contender-limit", "-1"], "--contender-limit: expected seconds >= 0, got -1.0"),
        (["bench", BENCH_GOOD, "--layout", "channels_last"], "--layout: expected one of contiguous (what good's spec"),
        (["bench", BENCH_GOOD, "--layout", "nhwc"], "--layout: expected one of contiguous, channels_last, got 'nhwc'"),
    ],
)
def test_bad_usage_exits_2(args, fragment):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_a_size_gives_a_row_op_rows_of_its_own_rank_not_a_1d_tensor_it_refuses(tmp_path):
    # Found on fbgemm's FloatToFused8BitRowwiseQuantized: `--sizes 2**16` gave every tensor input the shape (n,), and
    # an op written for rows refused it ("must have >= 2 dimension(s)"): a WRONG result for a correct op. Its spec
    # lists 2-D shapes only, so n elements now come as rows of its narrowest listed width: 256 rows of 16.
    from opforge.bench.plan import BenchFilters, size_points
    from opforge.loading.spec import load_spec

    row_op = FIXTURES / "cuda_ops" / "row_center.yaml"
    assert size_points(load_spec(row_op), BenchFilters(sizes=(4096,))) == [("n=2^12", (("x", (256, 16)),))]
    report = tmp_path / "bench.json"
    result = invoke(
        "bench",
        str(row_op),
        "--sizes",
        "4096",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--contender",
        "native",
        "--json",
        str(report),
        *QUICK,
    )
    assert result.exit_code == 0, result.output
    [native] = json.loads(report.read_text())["results"]
    assert (native["case"], native["status"]) == ("n=2^12", "ok"), native


@pytest.mark.slow
def test_an_op_whose_inputs_share_no_shape_is_skipped_by_a_sized_run_and_the_others_are_timed(tmp_path):
    # roi_pool_avg's input and rois share no shape, so a size has nothing to grow: it is skipped with what to write
    # (not built), and the run times the op that can take it; alone, nothing is timed and the run says why (exit 5).
    shared_none = str(FIXTURES / "real_ops" / "roi_pool_avg.yaml")
    row_op = str(FIXTURES / "cuda_ops" / "row_center.yaml")
    sized = ("--sizes", "4096", "--device", "cpu", "--dtype", "float32", "--contender", "native", *QUICK)
    both = invoke("bench", row_op, shared_none, *sized)
    assert both.exit_code == 0, both.output
    assert "skip roi_pool_avg: --sizes: expected tensor inputs that share a shape" in both.output, both.output
    alone = invoke("bench", shared_none, *sized)
    assert alone.exit_code == 5 and "Write the shapes to time in its spec's bench.shapes" in alone.output, alone.output

    # A spec's own bench.shapes still run where its bench.sizes cannot: only the sizes are left out, with the reason.
    from dataclasses import replace

    from opforge.bench.plan import BenchFilters, size_points, unsized
    from opforge.loading.spec import load_spec

    spec = load_spec(SPECS / "affine_leaky_swish.yaml")
    with_sizes = replace(spec, bench=replace(spec.bench, sizes=(4096,)))
    assert [label for label, _ in size_points(with_sizes, BenchFilters())] == [
        "x=32x256x56x56,scale=256,shift=256",
        "x=256x64x112x112,scale=64,shift=64",
    ]
    assert unsized(with_sizes, BenchFilters()).startswith("bench.sizes: expected tensor inputs that share a shape")


@pytest.mark.slow
def test_all_leaves_out_an_op_claiming_none_of_the_asked_choices_and_times_the_others(tmp_path, fake_timer):
    # `.ci/gpu bench`'s `opforge bench --all --device cuda` ended in a usage error (exit 2) on an H100 before timing
    # anything, because row_crc32 is CPU-only. With --all a choice narrows each op to what it claims; a named op that
    # does not claim it is still an error (test_bad_usage_exits_2).
    from opforge.bench.plan import BenchFilters, selected, unclaimed
    from opforge.loading.spec import load_spec

    crc, swish = load_spec(SPECS / "row_crc32.yaml"), load_spec(SPECS / "leaky_swish.yaml")
    asked = BenchFilters(devices=("cuda",), dtypes=("float32", "uint8"), every_spec=True)
    assert unclaimed(crc, asked) == "--device cuda: its spec claims cpu"
    assert unclaimed(swish, asked) == ""
    assert selected(swish, asked)[:2] == (("cuda",), ("float32",))
    on_cpu = BenchFilters(devices=("cpu",), dtypes=("float32", "uint8"), every_spec=True)
    assert (unclaimed(crc, on_cpu), selected(crc, on_cpu)[1]) == ("", ("uint8",))

    report = tmp_path / "bench.json"
    result = invoke("bench", "--all", "--dtype", "uint8", "--contender", "native", "--json", str(report), *QUICK)
    assert result.exit_code == 0, result.output
    assert "skip leaky_swish: --dtype uint8: its spec claims float32, float64, float16, bfloat16" in result.output
    timed = json.loads(report.read_text())["results"]
    assert {(r["op"], r["status"]) for r in timed} == {("row_crc32", "ok")}, timed
    named = invoke("bench", str(SPECS / "leaky_swish.yaml"), "--dtype", "uint8")
    assert named.exit_code == 2 and "--dtype: expected one of float32" in named.output, named.output


def test_cuda_graph_leaves_out_the_forwards_of_an_op_that_writes_its_arguments():
    # `opforge bench --all --device cuda --cuda-graph` (an H100, 2026-12-07) gave leaky_swish_ and leaky_swish.out
    # 24 ERROR rows: a graph cannot restore what the op writes between its replayed calls. Those points are now
    # left out with the reason; a backward, which does not call the op, is still timed, and so is a CPU point.
    from opforge.bench.plan import BenchFilters, plan_points, replayable
    from opforge.loading.spec import load_spec

    inplace, swish = load_spec(SPECS / "leaky_swish_.yaml"), load_spec(SPECS / "leaky_swish.yaml")
    sized = BenchFilters(sizes=(2**10,), dtypes=("float32",))
    written = plan_points(inplace, sized, ("cuda",))
    assert written and replayable(inplace, written, ("x",), cuda_graph=True) == (
        [],
        {
            "leaky_swish_": "--cuda-graph: its fwd on cuda writes x, which a graph's replays cannot restore between "
            "calls; time it without --cuda-graph"
        },
    )
    assert replayable(inplace, written, ("x",), cuda_graph=False) == (written, {})
    both = plan_points(swish, sized, ("cuda", "cpu"))
    kept, why = replayable(swish, both, ("x",), cuda_graph=True)
    assert {(p.mode, p.case.device) for p in kept} == {("bwd", "cuda"), ("fwd", "cpu"), ("bwd", "cpu")}
    assert list(why) == ["leaky_swish"] and why["leaky_swish"].startswith("--cuda-graph: its fwd on cuda writes x,")
    assert replayable(swish, both, (), cuda_graph=True) == (both, {})


def test_a_file_that_is_no_bench_run_is_refused_as_baseline(tmp_path):
    bad = tmp_path / "check.json"
    bad.write_text(json.dumps({"schema_version": 1, "tool": "opforge", "ops": []}))
    result = invoke("bench", BENCH_GOOD, "--baseline", str(bad))
    assert result.exit_code == 2 and "the --json of an `opforge bench` run" in result.output


# ------------------------------------------------------------------------------------------- the gate


def record_baseline(tmp_path, fake_timer) -> str:
    path = tmp_path / "old.json"
    result = invoke(
        "bench",
        BENCH_GOOD,
        "--sizes",
        "256",
        "--mode",
        "fwd",
        "--contender",
        "native",
        "--contender",
        "eager",
        "--json",
        str(path),
    )
    assert result.exit_code == 0, result.output
    return str(path)


def gate(baseline: str, *extra: str):
    return invoke(
        "bench",
        BENCH_GOOD,
        "--sizes",
        "256",
        "--mode",
        "fwd",
        "--contender",
        "native",
        "--contender",
        "eager",
        "--baseline",
        baseline,
        "--max-regression",
        "5",
        *extra,
    )


def test_gate_passes_identical_samples(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    fake_timer["seed"] = 0  # the same samples again
    result = gate(baseline)
    assert result.exit_code == 0, result.output
    assert "### opforge bench: ✅ no regression" in result.output
    assert "| `good/native[fwd-float32-cpu-n=2^8]` | 1 ms | 1 ms | 1.000 |" in result.output


def test_gate_fails_a_twenty_percent_slower_run(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    fake_timer["median_s"] = 1.2e-3
    summary = tmp_path / "summary.md"
    result = gate(baseline, "--markdown", str(summary))
    assert result.exit_code == 1, result.output
    text = summary.read_text()
    assert text.startswith("### opforge bench: ❌ 1 regression\n")
    assert "| `good/native[fwd-float32-cpu-n=2^8]` | 1 ms | 1.2 ms | 1.200 |" in text and "| **regression** |" in text
    # The eager baseline slowed down too: shown, but only the op's own implementations gate.
    assert "regression (baseline, not gated)" in text
    assert "FAILED: 2 timed, 1 regression(s)" in result.output


def test_bench_junit_fails_a_regressed_implementation_not_a_slower_baseline(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    fake_timer["median_s"] = 1.2e-3
    result = gate(baseline, "--junit", str(tmp_path / "gate.xml"))
    assert result.exit_code == 1, result.output
    cases = junit_cases(tmp_path / "gate.xml")
    regressed = cases["good.native.bench", "fwd-float32-cpu-n=2^8"].find("failure")
    assert regressed is not None and regressed.get("message", "").startswith("regression: new/old median 1.2"), cases
    assert not list(cases["good.eager.bench", "fwd-float32-cpu-n=2^8"])


def test_gate_passes_a_noisy_run_whose_interval_includes_the_threshold(tmp_path, fake_timer):
    fake_timer["spread"] = 0.15
    baseline = record_baseline(tmp_path, fake_timer)
    fake_timer["median_s"] = 1.06e-3
    result = gate(baseline)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("| `good/native"))
    ratio, interval = row.split(" | ")[3:5]
    low, high = (float(v) for v in interval.strip("[]").split(", "))
    assert float(ratio) == pytest.approx(1.06, abs=1e-3) and low < 1.05 < high


def test_gate_warns_when_the_environments_differ(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    data = json.loads(Path(baseline).read_text())
    data["environment"]["torch"] = "2.0.0"
    data["environment"]["cpu_model"] = "another CPU"
    Path(baseline).write_text(json.dumps(data))
    result = gate(baseline)
    assert result.exit_code == 0, result.output
    assert "warning: environment differs from the baseline: torch: '2.0.0' ->" in result.output
    assert (
        "> **Warning: the environments differ**" in result.output and "> - cpu_model: 'another CPU' ->" in result.output
    )


def test_gate_warns_about_baseline_cases_not_run_and_fails_when_none_ran(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    result = invoke(
        "bench", BENCH_GOOD, "--sizes", "256", "--mode", "fwd", "--contender", "native", "--baseline", baseline
    )
    assert result.exit_code == 0, result.output
    assert "warning: 1 case(s) of the baseline were not run: good/eager[fwd-float32-cpu-n=2^8]" in result.output
    result = invoke(
        "bench", BENCH_GOOD, "--sizes", "512", "--mode", "fwd", "--contender", "native", "--baseline", baseline
    )
    assert result.exit_code == 1, result.output
    assert "### opforge bench: ❌ nothing compared" in result.output
    assert "--baseline: expected at least one case compared with" in result.output


def test_gate_does_not_compare_cases_timed_differently(tmp_path, fake_timer):
    baseline = record_baseline(tmp_path, fake_timer)
    data = json.loads(Path(baseline).read_text())
    for row in data["results"]:
        if row["contender"] == "native":
            row["timing"]["threads"] = 64
            row["timing"]["samples"] = [s * 2 for s in row["timing"]["samples"]]  # would be a regression
    Path(baseline).write_text(json.dumps(data))
    fake_timer["seed"] = 0
    result = gate(baseline)
    assert result.exit_code == 0, result.output
    assert (
        "good/native[fwd-float32-cpu-n=2^8] was timed differently from the baseline (threads: 64 -> None): "
        "not gated" in result.output
    )
    assert "> - `good/native[fwd-float32-cpu-n=2^8]`: threads: 64 -> None" in result.output
    assert "| `good/native" not in result.output and "| `good/eager[fwd-float32-cpu-n=2^8]` |" in result.output


# ---------------------------------------------------------------------------------------- peak and bytes


def test_gpu_is_named_to_nvidia_smi_by_uuid():
    from types import SimpleNamespace

    from opforge.bench.environment import gpu_smi_id, nvidia_smi

    uuid = "58f2d6e2-1c0b-4e5b-9a8e-0f5c3c2d1a00"
    assert gpu_smi_id(SimpleNamespace(uuid=uuid)) == f"GPU-{uuid}"
    assert gpu_smi_id(SimpleNamespace(uuid=f"GPU-{uuid}")) == f"GPU-{uuid}"
    assert gpu_smi_id(SimpleNamespace()) is None and nvidia_smi(None) == {}


def test_plot_series_separate_shapes_from_sizes():
    from opforge.bench.model import BenchResult
    from opforge.reporters.plot import series_label

    def row(case: str) -> BenchResult:
        return BenchResult("custom_loss", "native", "implementation", "cpu", "float32", "fwd", case, 2**24, "ok")

    assert series_label(row("n=2^24")) == series_label(row("n=2^20")) == "native"
    assert series_label(row("pred=4096x4096,target=4096")) == "native (pred=4096x4096,target=4096)"


def test_peak_is_measured_once_per_device_and_cached(tmp_path):
    measured = []

    def measure(device):
        measured.append(device)
        return 12.5, "fake", 64

    env = {"cpu_model": "X", "torch_threads": 2, "torch": "2.13.0"}
    path = tmp_path / "cache" / "peak.json"
    first = peak_module.peak_bandwidth("cpu", env, path=path, measure=measure)
    again = peak_module.peak_bandwidth("cpu", env, path=path, measure=measure)
    assert (first.cached, again.cached, again.gbps, measured) == (False, True, 12.5, ["cpu"])
    peak_module.peak_bandwidth("cpu", {**env, "torch_threads": 1}, path=path, measure=measure)
    peak_module.peak_bandwidth("cpu", env, path=path, measure=measure, refresh=True)
    assert measured == ["cpu"] * 3
    path.write_text("{not json")
    assert not peak_module.peak_bandwidth("cpu", env, path=path, measure=measure).cached


@pytest.mark.slow
def test_cpu_copy_peak_is_a_real_measurement():
    gbps, method, nbytes = REAL_MEASURE_COPY("cpu")
    assert gbps > 0 and nbytes == peak_module.CPU_COPY_BYTES and method.startswith("memcpy copy of 256 MiB")


def test_bytes_of_a_broadcasting_two_input_op():
    from opforge.bench.bytes import bytes_moved
    from opforge.bench.plan import BenchFilters, plan_points
    from opforge.building.op import load_op
    from opforge.cases.arguments import make_inputs
    from opforge.loading.spec import load_spec

    loaded = load_op(load_spec(SPECS / "custom_loss.yaml"))
    point = next(p for p in plan_points(loaded.spec, BenchFilters(), ("cpu",)) if "target=4096" in p.label)
    assert point.label == "pred=4096x4096,target=4096" and point.elements == 4096 * 4096
    from dataclasses import replace

    case = replace(point.case, shapes=(("pred", (64, 32)), ("target", (32,))))
    fwd = make_inputs(loaded.spec, loaded.arguments, case, 0)
    bwd = make_inputs(loaded.spec, loaded.arguments, case, 0, requires_grad=True)
    assert bytes_moved(loaded, "fwd", fwd) == (2048 + 32 + 2048) * 4
    assert bytes_moved(loaded, "bwd", bwd) == (2048 + 2048 + 32 + 2048 + 32) * 4
    assert bytes_moved(loaded, "fwd+bwd", bwd) == (2 * 2048 + 32 + 3 * 2048 + 64) * 4


def copy_fixture(tmp_path, name: str, edit=lambda text: text):
    import shutil

    for module in ("broken_ops.py", "bench_ops.py"):
        shutil.copy(FIXTURES / module, tmp_path / module)
    path = tmp_path / name
    path.write_text(edit((FIXTURES / name).read_text()))
    return path


def test_a_bytes_expression_using_a_gradient_in_fwd_is_refused_at_load(tmp_path):
    from opforge.core.errors import SpecError
    from opforge.loading.spec import load_spec

    path = copy_fixture(
        tmp_path,
        "bench_good.yaml",
        lambda text: text.replace(
            "  modes: [fwd, bwd]\n", "  modes: [fwd, bwd]\n  bytes: 'x.nbytes + grad_x.nbytes'\n"
        ),
    )
    # A forward has no gradients: the spec is refused before anything is timed, at the expression's line.
    with pytest.raises(
        SpecError,
        match=r"bench_good.yaml:18: bench.bytes: expected an arithmetic expression .*, "
        r"got the unknown name 'grad_x': use one of result, x",
    ):
        load_spec(path)


def test_a_bytes_expression_a_point_cannot_evaluate_is_an_error_result_not_an_abort(tmp_path):
    # grad_indices passes the load-time check (an output's gradient) but int64 indices have none: each bwd result of
    # the point is an ERROR naming file:line and key, the fwd results are timed, and the JSON is written.
    path = copy_fixture(tmp_path, "bench_sort.yaml", lambda text: text + "  bytes: {bwd: 'grad_indices.nbytes'}\n")
    out = tmp_path / "run.json"
    result = invoke("bench", str(path), "--contender", "native", "--contender", "eager", "--json", str(out), *QUICK)
    assert result.exit_code == 1, result.output
    rows = results_by_id(out)
    assert rows["sort_values/native[fwd-float32-cpu-n=2^10]"]["status"] == "ok"
    bwd = rows["sort_values/native[bwd-float32-cpu-n=2^10]"]
    assert bwd["status"] == "error" and bwd["timing"] is None
    assert (
        "bench_sort.yaml:13: bench.bytes.bwd: expected an expression this point can evaluate, got the unknown "
        "name 'grad_indices': use one of grad_values, grad_x, indices, values, x." in bwd["message"]
    )


@pytest.mark.parametrize(
    "bytes_line, fragments",
    [
        # A mapping's error names the mode's key.
        ("  bytes: {fwd: 'x.nbytes / 0'}", ("bench_sort.yaml:13: bench.bytes.fwd: expected", "division by zero")),
        # A tensor used as a number is an ERROR result, not an internal error.
        (
            "  bytes: '2 * x'",
            (
                "bench.bytes: expected an expression this point can evaluate, got x is a tensor: use "
                "x.nbytes or x.numel()",
            ),
        ),
    ],
)
def test_a_bytes_expression_failing_on_a_point_is_an_error_result(tmp_path, bytes_line, fragments):
    path = copy_fixture(tmp_path, "bench_sort.yaml", lambda text: text + bytes_line + "\n")
    out = tmp_path / "run.json"
    result = invoke("bench", str(path), "--mode", "fwd", "--contender", "native", "--json", str(out), *QUICK)
    assert result.exit_code == 1, result.output
    message = results_by_id(out)["sort_values/native[fwd-float32-cpu-n=2^10]"]["message"]
    for fragment in fragments:
        assert fragment in message


def loaded_point(spec_path, mode: str = "fwd", sizes=(1024,)):
    from opforge.bench.plan import BenchFilters, plan_points
    from opforge.building.op import load_op
    from opforge.loading.spec import load_spec

    loaded = load_op(load_spec(spec_path))
    point = plan_points(loaded.spec, BenchFilters(sizes=sizes, modes=(mode,)), ("cpu",))[0]
    return loaded, point


def default_bytes(spec_path, mode: str) -> int:
    from opforge.bench.bytes import bytes_moved
    from opforge.bench.runner import input_source

    loaded, point = loaded_point(spec_path, mode)
    return bytes_moved(loaded, mode, input_source(loaded, point, 0)())


@pytest.mark.parametrize(
    "fixture, mode, expected",
    [
        # In place: x read and written; the returned alias of x is x itself, not a second write.
        ("scale_.yaml", "fwd", 2 * 4096),
        ("bench_scale_ret.yaml", "fwd", 2 * 4096),
        # out=-style: the default cannot tell a write-only argument from an in-place one (docs/bench.md says to state
        # bench.bytes for such ops): out counts as read and written.
        ("swish_out.yaml", "fwd", 3 * 4096),
        # Two outputs: values (float32) and indices (int64) written; the backward reads only the floating output's
        # gradient, the input, and writes the input's gradient.
        ("bench_sort.yaml", "fwd", 4096 + 4096 + 8192),
        ("bench_sort.yaml", "bwd", 3 * 4096),
        ("bench_sort.yaml", "fwd+bwd", 4096 + 4096 + 8192 + 3 * 4096),
    ],
)
def test_default_bytes_of_mutating_out_and_multi_output_ops(fixture, mode, expected):
    assert default_bytes(FIXTURES / fixture, mode) == expected


def test_only_floating_outputs_have_gradient_names(tmp_path):
    from opforge.bench.bytes import _sizes
    from opforge.bench.runner import input_source

    loaded, point = loaded_point(FIXTURES / "bench_sort.yaml", "bwd")
    names = set(_sizes(loaded, input_source(loaded, point, 0)(), with_gradients=True))
    assert names == {"x", "values", "indices", "grad_values", "grad_x"}


def test_a_mutating_op_gets_fresh_inputs_per_contender():
    import torch

    from opforge.bench.runner import input_source

    loaded, point = loaded_point(FIXTURES / "scale_.yaml")
    source = input_source(loaded, point, 0)
    first = source()
    before = first.args[0].clone()
    loaded.overload(*first.args, **first.kwargs)  # what the first contender's reps do to its inputs
    second = source()
    assert not torch.equal(first.args[0], before) and torch.equal(second.args[0], before)
    # An op that mutates nothing shares one set: no contender can change it.
    loaded, point = loaded_point(FIXTURES / "bench_sort.yaml")
    source = input_source(loaded, point, 0)
    assert source() is source()


def test_a_mutating_op_gets_its_arguments_restored_between_reps():
    import torch

    from opforge.bench.runner import argument_restorer, input_source, mode_callable

    loaded, point = loaded_point(FIXTURES / "scale_.yaml")
    inputs = input_source(loaded, point, 0)()
    before = inputs.args[0].clone()
    call = mode_callable(loaded, loaded.overload, inputs, "fwd", 0)
    restore = argument_restorer(loaded, inputs, "fwd")
    call()
    call()
    assert not torch.equal(inputs.args[0], before)
    restore()
    assert torch.equal(inputs.args[0], before)
    # Nothing to restore for an op that mutates nothing, nor for a backward alone (it does not call the op).
    assert argument_restorer(loaded, inputs, "bwd") is None
    loaded, point = loaded_point(FIXTURES / "bench_sort.yaml")
    assert argument_restorer(loaded, input_source(loaded, point, 0)(), "fwd") is None


def test_a_backward_gets_its_gradient_in_the_outputs_layout():
    # As the next layer's backward hands it in a channels_last network; a contiguous gradient would make every
    # contender time a layout conversion.
    import torch

    from opforge.bench.runner import input_source, mode_callable

    loaded, point = loaded_point(FIXTURES / "bench_good.yaml", "bwd")
    inputs = input_source(loaded, point, 0)()
    layouts = []

    def channels_last_op(x):
        y = (x * 2).reshape(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)
        y.register_hook(lambda g: layouts.append(g.is_contiguous(memory_format=torch.channels_last)))
        return y

    mode_callable(loaded, channels_last_op, inputs, "bwd", 0)()
    assert layouts == [True]


def test_bench_of_a_mutating_op_times_every_contender(tmp_path):
    out = tmp_path / "run.json"
    result = invoke(
        "bench",
        str(FIXTURES / "scale_.yaml"),
        "--sizes",
        "1024",
        "--dtype",
        "float32",
        "--contender",
        "native",
        "--contender",
        "wrong",
        "--contender",
        "eager",
        "--json",
        str(out),
        *QUICK,
    )
    assert result.exit_code == 1, result.output  # `wrong` scales by 1.01 s: WRONG, not timed
    rows = results_by_id(out)
    assert rows["scale_/native[fwd-float32-cpu-n=2^10]"]["status"] == "ok"
    assert rows["scale_/native[fwd-float32-cpu-n=2^10]"]["bytes"] == 2 * 4096
    assert rows["scale_/eager[fwd-float32-cpu-n=2^10]"]["status"] == "ok"
    assert rows["scale_/wrong[fwd-float32-cpu-n=2^10]"]["status"] == "wrong"


# ------------------------------------------------------------------------------ contenders that raise


def test_a_contender_raising_while_verified_or_timed_costs_its_result(tmp_path, monkeypatch):
    from dataclasses import replace

    from opforge.bench import runner as bench_runner
    from opforge.checks.catalog import CATALOG
    from opforge.core.outcomes import CheckSkipped

    real_check, real_timer = CATALOG.get("correctness").run, bench_runner.time_callable

    def correctness(context, implementation, case):  # what a check can raise besides a mismatch
        if implementation.name == "scaled":
            raise MemoryError("out of memory cloning the inputs (simulated)")
        if implementation.name == "wrong_gradient":
            raise CheckSkipped("not enough memory for this case (simulated)")
        return real_check(context, implementation, case)

    def timer(call, device, options, reset=None):  # the second contender timed, the eager baseline, runs out of memory
        timer.calls += 1
        if timer.calls == 2:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_timer(call, device, options, reset)

    timer.calls = 0
    monkeypatch.setitem(CATALOG._checks, "correctness", replace(CATALOG.get("correctness"), run=correctness))
    monkeypatch.setattr(bench_runner, "time_callable", timer)
    out = tmp_path / "run.json"
    result = invoke(
        "bench",
        BENCH_GOOD,
        "--sizes",
        "64",
        "--mode",
        "fwd",
        "--contender",
        "native",
        "--contender",
        "scaled",
        "--contender",
        "wrong_gradient",
        "--contender",
        "eager",
        "--json",
        str(out),
        *QUICK,
    )
    assert result.exit_code == 1, result.output
    rows = results_by_id(out)
    assert rows["good/native[fwd-float32-cpu-n=2^6]"]["status"] == "ok"
    scaled = rows["good/scaled[fwd-float32-cpu-n=2^6]"]
    assert (
        scaled["status"] == "error"
        and scaled["timing"] is None
        and scaled["message"]
        == "scaled raised MemoryError: out of memory cloning the inputs (simulated) while being verified"
    )
    skipped = rows["good/wrong_gradient[fwd-float32-cpu-n=2^6]"]
    assert (
        skipped["status"] == "skip"
        and skipped["message"] == "correctness skipped: not enough memory for this case (simulated)"
    )
    eager = rows["good/eager[fwd-float32-cpu-n=2^6]"]
    assert (
        eager["status"] == "error"
        and eager["message"] == "eager raised RuntimeError: CUDA out of memory (simulated) while being timed"
    )
    assert "FAILED: 1 timed, 2 error, 1 skip" in result.output and "Traceback" not in result.output


def test_a_contender_past_its_time_limit_is_cut_off_with_a_note_and_the_run_goes_on(tmp_path):
    path = copy_fixture(
        tmp_path, "bench_good.yaml", lambda text: text.replace("broken_ops:reference", "bench_ops:slow_reference")
    )
    out = tmp_path / "run.json"
    args = ("bench", str(path), "--sizes", "64", "--mode", "fwd", "--contender", "native", "--contender", "eager")
    result = invoke(*args, "--contender-limit", "1", "--json", str(out), *QUICK)
    assert result.exit_code == 0, result.output
    rows = results_by_id(out)
    assert rows["good/native[fwd-float32-cpu-n=2^6]"]["status"] == "ok"
    eager = rows["good/eager[fwd-float32-cpu-n=2^6]"]
    assert eager["status"] == "skip" and eager["message"].startswith("cut off after 1 s (--contender-limit): eager")
    assert "cut off after 1 s" in result.output and "OK: 1 timed, 1 skip" in result.output


@pytest.mark.slow
def test_the_op_itself_is_never_cut_off(tmp_path, monkeypatch):
    """Verifying a large case in float64 takes minutes on a CPU: the op's results run to the end, only baselines are
    cut. Here the op's implementation is the slow one."""
    from opforge.bench import runner as bench_runner

    path = copy_fixture(
        tmp_path, "bench_good.yaml", lambda text: text.replace("bench_ops:scaled", "bench_ops:slow_reference")
    )
    out = tmp_path / "run.json"
    args = ("bench", str(path), "--sizes", "64", "--mode", "fwd", "--contender", "scaled")

    def one_slow_call(call, device, options, reset=None) -> Timing:
        call()
        return Timing((5.0,), "fake", 1, "budget")

    monkeypatch.setattr(bench_runner, "time_callable", one_slow_call)
    result = invoke(*args, "--contender-limit", "1", "--json", str(out), *QUICK)
    assert result.exit_code == 0, result.output
    assert results_by_id(out)["good/scaled[fwd-float32-cpu-n=2^6]"]["status"] == "ok"


# --------------------------------------------------------------------------------------- nothing timed


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_a_run_that_times_nothing_fails_and_says_why(tmp_path):
    plot = tmp_path / "run.png"
    path = copy_fixture(
        tmp_path,
        "bench_good.yaml",
        lambda text: text.replace("dtypes: [float32, float64]\n", "dtypes: [float32, float64]\ndevices: [cpu, cuda]\n"),
    )
    result = invoke(
        "bench", str(path), "--device", "cuda", "--plot", str(plot), "--json", str(tmp_path / "r.json"), *QUICK
    )
    assert result.exit_code == 5, result.output  # nothing timed: never a pass, and no failure either
    assert "opforge bench: expected at least one timed case, got none (skip cuda:" in result.output
    assert "not written, no case has a GB/s figure" in result.output and not plot.exists()
    assert "internal error" not in result.output


def test_default_modes_are_fwd_only_without_an_input_that_requires_grad(tmp_path):
    from opforge.bench.plan import BenchFilters, selected
    from opforge.core.errors import UsageError
    from opforge.loading.spec import load_spec

    path = copy_fixture(
        tmp_path,
        "bench_good.yaml",
        lambda text: text.replace("requires_grad: true", "requires_grad: false").replace("  modes: [fwd, bwd]\n", ""),
    )
    spec = load_spec(path)
    assert selected(spec, BenchFilters())[2] == ("fwd",)
    with pytest.raises(UsageError, match="--mode: expected one of fwd "):
        selected(spec, BenchFilters(modes=("bwd",)))


# --------------------------------------------------------------------------------------------- the timers


def test_cpu_timer_records_samples_and_threads_and_honours_max_reps():
    import torch

    from opforge.bench.timing import time_cpu

    x = torch.randn(1024)
    # A noise target no timer reaches: only max_reps can stop it (the budget is far away).
    timing = time_cpu(lambda: x * 2, TimingOptions(budget_s=60.0, warmup_s=0.0, noise_target=1e-9, max_reps=6))
    assert timing.stopped == "max_reps" and len(timing.samples) == 6 and all(s > 0 for s in timing.samples)
    assert timing.threads == torch.get_num_threads() and timing.calls_per_sample >= 1
    assert timing.method == "torch.utils.benchmark.Timer.timeit"


def test_cpu_timer_honours_min_reps_before_the_noise_target():
    import torch

    from opforge.bench.timing import time_cpu

    x = torch.randn(1024)
    # Any sample set passes a noise target of 1e9: the minimums alone decide how many samples there are.
    timing = time_cpu(
        lambda: x * 2, TimingOptions(budget_s=60.0, warmup_s=0.0, noise_target=1e9, min_reps=30, min_time_s=0.0)
    )
    # Batches of 4, 8, 16, 32: the first total past 30 is 60.
    assert timing.stopped == "noise" and len(timing.samples) == 60


def test_cpu_block_grows_tenfold_until_it_lasts_the_block_time():
    from opforge.bench.timing import CPU_BLOCK_S, cpu_block_calls

    assert cpu_block_calls(lambda calls: calls * CPU_BLOCK_S / 50) == 100
    assert cpu_block_calls(lambda calls: 1.0) == 1


@requires_cuda
@pytest.mark.parametrize("graph", [False, True])
def test_cuda_timer(graph):
    import torch

    from opforge.bench.timing import LAUNCH_COVER_MIN_S, L2Flush, time_cuda

    x = torch.randn(2**20, device="cuda")
    timing = time_cuda(lambda: x * 2, TimingOptions(budget_s=0.2, warmup_s=0.05, cuda_graph=graph))
    assert timing.samples and all(s > 0 for s in timing.samples)
    if graph:
        assert timing.method == "cuda-graph" and timing.flush_bytes is None and timing.calls_per_sample > 1
    else:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        assert timing.method == "cuda-events" and timing.flush_bytes >= 2 * l2
        assert timing.launch_cover_s >= LAUNCH_COVER_MIN_S
        assert L2Flush("cuda").buffer.numel() * 4 == timing.flush_bytes


def test_graph_input_copies_add_up_to_a_flush_worth_of_bytes():
    from opforge.bench.timing import GRAPH_MAX_CALLS, MIN_FLUSH_BYTES, graph_input_copies

    l2 = 60 * 2**20  # H200: the flush is then MIN_FLUSH_BYTES (256 MiB)
    assert graph_input_copies(2**20, l2) == MIN_FLUSH_BYTES // 2**20
    assert graph_input_copies(3 * 2**20, l2) == -(-MIN_FLUSH_BYTES // (3 * 2**20))  # rounded up: never short
    assert graph_input_copies(2**30, l2) == 1
    assert graph_input_copies(4, l2) == GRAPH_MAX_CALLS
    assert graph_input_copies(None, l2) == 1


def test_graph_rotation_goes_round_every_copy_in_turn():
    from opforge.bench.runner import graph_rotation

    seen = []
    call = graph_rotation(lambda: seen.append(0), [lambda: seen.append(1), lambda: seen.append(2)])
    for _ in range(7):
        call()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


@requires_cuda
def test_cuda_graph_bench_goes_round_cold_copies_of_the_inputs(tmp_path):
    import torch

    from opforge.bench.timing import graph_input_copies, l2_bytes

    out = tmp_path / "run.json"
    result = invoke(
        "bench",
        "leaky_swish",
        "--device",
        "cuda",
        "--cuda-graph",
        "--sizes",
        "2**16",
        "--mode",
        "fwd",
        "--contender",
        "native",
        "--json",
        str(out),
        *QUICK,
    )
    assert result.exit_code == 0, result.output
    row = results_by_id(out)["leaky_swish/native[fwd-float32-cuda-n=2^16]"]
    copies = graph_input_copies(row["bytes"], l2_bytes(torch.cuda.current_device()))
    assert copies > 1 and row["timing"]["method"] == f"cuda-graph, inputs rotated over {copies} copies", row


@requires_cuda
def test_cuda_graph_captures_a_backward_whose_forward_it_built(tmp_path):
    # On an H100 (2026-12-07) the first backward timed with --cuda-graph, custom_loss's, failed its capture
    # (cudaErrorStreamCaptureInvalidated): its forward had run on the default stream, the capture on another. A
    # fresh process, as there: the backward timed first.
    out = tmp_path / "run.json"
    command = [sys.executable, "-m", "opforge", "bench", str(SPECS / "custom_loss.yaml"), "--device", "cuda"]
    command += ["--cuda-graph", "--sizes", "2**20", "--mode", "bwd", "--dtype", "float32", "--contender", "native"]
    result = subprocess.run([*command, "--json", str(out), *QUICK], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert results_by_id(out)["custom_loss/native[bwd-float32-cuda-n=2^20]"]["status"] == "ok"


def test_a_declared_xfail_is_timed_with_a_note(tmp_path):
    import shutil

    for name in ("broken_ops.py", "bench_ops.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    spec_path = tmp_path / "bench_good.yaml"
    spec_path.write_text(
        (FIXTURES / "bench_good.yaml").read_text()
        + "xfail:\n  - {check: correctness, implementation: scaled, reason: 1% off on purpose}\n"
    )
    out = tmp_path / "run.json"
    result = invoke(
        "bench", str(spec_path), "--sizes", "64", "--mode", "fwd", "--contender", "scaled", "--json", str(out), *QUICK
    )
    assert result.exit_code == 0, result.output
    row = results_by_id(out)["good/scaled[fwd-float32-cpu-n=2^6]"]
    assert row["status"] == "ok" and row["timing"]["samples"]
    assert row["message"] == "correctness xfail: 1% off on purpose"


# ------------------------------------------------------------------------------------ the fidelity script


def fidelity(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_fidelity.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def fake_run(path, median_s: float):
    path.write_text(
        json.dumps(
            {
                "kind": "bench",
                "results": [
                    {
                        "id": "good/native[fwd-float32-cuda-n=2^24]",
                        "status": "ok",
                        "median_s": median_s,
                        "elements": 2**24,
                    }
                ],
            }
        )
    )
    return str(path)


def test_fidelity_script_exits_1_when_the_spread_target_is_missed(tmp_path):
    runs = [fake_run(tmp_path / f"run{i}.json", m) for i, m in enumerate((1.0e-3, 1.01e-3, 0.99e-3))]
    assert fidelity("spread", *runs).returncode == 0
    runs.append(fake_run(tmp_path / "slow.json", 1.2e-3))
    result = fidelity("spread", *runs)
    assert result.returncode == 1 and "target missed: spread: expected every case within ±3%" in result.stderr


def test_fidelity_script_reports_a_missing_run_cleanly(tmp_path):
    result = fidelity("spread", fake_run(tmp_path / "run1.json", 1e-3), str(tmp_path / "missing.json"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "missing.json: expected the --json of an `opforge bench` run, got FileNotFoundError" in result.stderr


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import would: dataclasses look their module up there.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_fidelity_do_bench_target_leaves_out_only_cases_do_bench_timed_on_the_cpu():
    script = load_benchmark("bench_fidelity")
    flush = 70e-6
    ours = {"gpu-bound": 30e-6, "host-bound": 30e-6, "near": 39.5e-6}
    # CPU 80 us a rep < 90% of flush + median (90 us): do_bench timed the GPU, and 30 us against 40 us misses.
    lines, misses = script.do_bench_comparison(
        ours, {"gpu-bound": (40e-6, 80e-6), "host-bound": (90e-6, 110e-6)}, flush
    )
    assert misses == ["do_bench: expected opforge's medians within 5% of do_bench's, got a ratio of 0.750"]
    assert "| `host-bound` | 0.03 ms | 0.09 ms | 0.333 | 110 µs | host-bound, not counted |" in lines
    assert "worst ratio: 0.750 over 1 cases (1 host-bound left out)" in "\n".join(lines)
    # The same GPU-bound case within 5%: met, whatever the host-bound one reads.
    _, misses = script.do_bench_comparison(ours, {"gpu-bound": (31e-6, 80e-6), "host-bound": (90e-6, 110e-6)}, flush)
    assert misses == []
    # A CPU just short of the GPU's rep (105 against 109.5 us) drains the queue when a rep runs slow, as the H100's
    # leaky_swish bfloat16 backward at 2^24 did (do_bench 1.65x opforge): left out, not a miss of opforge's.
    lines, misses = script.do_bench_comparison(ours, {"gpu-bound": (31e-6, 80e-6), "near": (65.4e-6, 105e-6)}, flush)
    assert misses == []
    assert "| `near` | 0.0395 ms | 0.0654 ms | 0.604 | 105 µs | host-bound, not counted |" in lines
    # Nothing left to compare is a miss, not a pass.
    _, misses = script.do_bench_comparison(ours, {"host-bound": (90e-6, 110e-6)}, flush)
    assert misses == ["do_bench: expected cases timed by both where do_bench times the GPU, got none (1 host-bound)"]


def test_fidelity_reads_the_cpus_time_per_rep_from_do_bench_s_own_loop():
    script = load_benchmark("bench_fidelity")
    ticks = iter(range(0, 10_000, 7))
    calls = []
    noted, starts = script.noting_starts(lambda: calls.append(1) or "result", clock=lambda: next(ticks) * 1e-6)
    assert [noted() for _ in range(3)] == ["result"] * 3 and len(calls) == 3
    assert starts == [0.0, 7e-6, 14e-6]
    # A warmup of short gaps, then reps 50 us apart with one slow rep: the median of the reps' gaps.
    warmup = [i * 10e-6 for i in range(4)]
    reps = [warmup[-1] + 1e-3 + i * 50e-6 for i in range(6)]
    reps[3] += 400e-6
    reps[4:] = [t + 400e-6 for t in reps[4:]]
    assert script.cpu_seconds_per_rep(warmup + reps) == pytest.approx(50e-6)
    with pytest.raises(ValueError, match="at least 3 times, got 2"):
        script.cpu_seconds_per_rep([0.0, 1.0])


def test_fidelity_times_the_same_cases_as_opforge_bench_with_its_timer_swapped():
    """The do_bench half runs only on a GPU; its opforge side (filters, run_bench, ids) runs here with a fake
    timer, so a renamed field of BenchFilters fails on CPU CI instead of after a device call."""
    from opforge.bench.timing import Timing

    script = load_benchmark("bench_fidelity")
    timed = []

    def timer(call, device, options, reset):
        call()
        timed.append(device)
        return Timing((2e-3,), "fake", 1, "noise", host_s=1e-5)

    medians = script.medians_timed_by(timer, "leaky_swish", "2**4", ("float32",), ("native",), "cpu")
    assert medians == {
        "leaky_swish/native[fwd-float32-cpu-n=2^4]": (2e-3, 1e-5),
        "leaky_swish/native[bwd-float32-cpu-n=2^4]": (2e-3, 1e-5),
    }
    assert timed == ["cpu", "cpu"]


def test_fidelity_reuses_runs_already_in_its_folder(tmp_path):
    """--reuse-runs reads run<i>.json that a cut call left and times only the missing ones; here none is missing,
    so it goes straight to do_bench (which then stops here: it needs triton and a GPU)."""
    for i in (1, 2, 3):
        fake_run(tmp_path / f"run{i}.json", 1e-3)
    result = fidelity("gpu", "--out", str(tmp_path), "--reuse-runs")
    assert [line for line in result.stdout.splitlines() if line.startswith("reusing")] == [
        f"reusing {tmp_path / f'run{i}.json'}" for i in (1, 2, 3)
    ]
    assert "opforge bench" not in result.stdout


# ------------------------------------------------------------------------------------ the peers script


def test_peers_copy_reference_is_the_median_over_separate_allocations():
    script = load_benchmark("rms_norm_peers")
    copied_into = []

    class FakeTimer:
        device = "cpu"
        times_ms = iter([1.0, 4.0, 2.0])

        def median_ms(self, fn):
            copied_into.append(fn().data_ptr())
            return next(self.times_ms), []

    nbytes = 2 * 10**6
    # One slow allocation (4 ms) must not set the reference: the median of 1, 4 and 2 ms is 2 ms.
    assert script.copy_gbps(FakeTimer(), nbytes) == pytest.approx(nbytes / 2.0 / 1e6)
    assert len(set(copied_into)) == script.COPY_ALLOCATIONS == 3


# ------------------------------------------------------------------------------------ the timeline script


def test_timeline_script_stamps_only_rms_norms_backward_kernel():

    script = load_benchmark("rms_norm_timeline")
    source = (REPO / "opforge" / "csrc" / "cuda" / "rms_norm.cu").read_text()
    stamped = script.instrument(source)
    kernel = stamped.index(script.KERNEL)
    body = stamped[kernel : stamped.index("__global__", kernel)]
    assert [body.count(f"opforge_timeline[{point}] = now;") for point in range(7)] == [1] * 7
    assert body.index("opforge_timeline[7] = {}") < body.index("opforge_timeline[0] = now")
    assert body.count('printf("TIMELINE') == 1
    # Nothing outside the kernel changed.
    assert stamped.replace(body, "") == source.replace(source[kernel : source.index("__global__", kernel)], "")


def test_timeline_script_says_which_anchor_moved():
    script = load_benchmark("rms_norm_timeline")
    source = f"{script.KERNEL}) {{\n  __shared__ wide_t scratch[2];\n}}\n__global__ void next() {{}}\n"
    with pytest.raises(SystemExit, match="expected one 'wide_t dw\\[S::kN\\]\\[S::kVec\\];'"):
        script.instrument(source)


def test_timeline_script_without_a_gpu_says_so_and_builds_nothing(monkeypatch, capsys):
    import torch

    script = load_benchmark("rms_norm_timeline")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(script.subprocess, "run", lambda *a, **k: pytest.fail("built or ran without a GPU"))
    assert script.main([]) == 1
    assert "rms_norm_timeline: expected a CUDA device, found none." in capsys.readouterr().err


def test_timeline_script_stamps_the_column_sum_once_per_point():

    script = load_benchmark("rms_norm_timeline")
    source = (REPO / "opforge" / "csrc" / "cuda" / "column_sums.cuh").read_text()
    stamped = script.instrument_sums(source)
    assert [stamped.count(f"{script.SUM_ARRAY}[blockIdx.x][{slot}] = now;") for slot in range(2)] == [1, 1]
    assert stamped.count(f"__device__ unsigned long long {script.SUM_ARRAY}[") == 1
    # The tile's barrier stays where it was, before the stamp that says every slice is in shared memory.
    assert stamped.count("__syncthreads();") == source.count("__syncthreads();")
    assert stamped.index("__syncthreads();\n    if (threadIdx.x == 0") < stamped.index("[blockIdx.x][1] = now;")
    kernel = script.instrument((REPO / "opforge" / "csrc" / "cuda" / "rms_norm.cu").read_text())
    assert kernel.count(f"{script.SUM_ARRAY}[blockIdx.x][0] = {script.SUM_ARRAY}[blockIdx.x][1] = 0;") == 1


def test_timeline_script_says_which_column_sum_anchor_moved():
    script = load_benchmark("rms_norm_timeline")
    anchor = "expected one '// xor partners hold the same columns' in column_sums.cuh"
    with pytest.raises(SystemExit, match=re.escape(anchor)):
        script.instrument_sums("namespace opforge::cuda {\n}\n")


def test_timeline_summary_of_stamped_blocks_and_of_none():
    script = load_benchmark("rms_norm_timeline")
    # rows hidden block, then the nine stamps in ns: two blocks 1 us apart at the start, 2 us apart at the end; the
    # second had no column tile (its sum stamps are 0).
    lines = [
        "TIMELINE 4096 4096 0 1000 2000 3000 10000 11000 12000 12500 13000 14000 7",
        "TIMELINE 4096 4096 1 2000 3000 4000 12000 12500 12000 0 0 16000 9",
    ]
    summary = script.summarize(lines)
    assert "2 blocks" in summary
    assert "start:    0.00 /    0.50 /    1.00" in summary
    assert "end:   13.00 /   14.00 /   15.00" in summary
    assert "partial write:   0.50 /   0.75 /   1.00 us" in summary
    assert "slices added:   11.50 /   11.50 /   11.50" in summary
    assert "partial sums loaded:   0.50 /   0.50 /   0.50 us" in summary
    assert "partial rows' sum:   2.00 /   3.00 /   4.00 us" in summary
    assert "expected a line per block from backward_kernel, got none" in script.summarize([])
    assert "slices added: no block" in script.summarize([lines[1]])


class _Recorded(Events):
    def __init__(self) -> None:
        self.heard: list[tuple] = []

    def task_started(self, name):
        self.heard.append(("started", name))

    def task_finished(self, name):
        self.heard.append(("finished", name))

    def planned(self, op, total):
        self.heard.append(("planned", op, total))

    def result(self, op, result):
        self.heard.append(("result", op, result.contender))

    def finish(self, run):
        self.heard.append(("finish", len(run.results)))


def test_a_bench_run_reports_through_the_one_declaration_of_events():
    from opforge.bench.plan import BenchFilters
    from opforge.bench.runner import run_bench
    from opforge.loading.spec import load_spec

    recorded = _Recorded()
    filters = BenchFilters(dtypes=("float32",), modes=("fwd",), sizes=(64,), contenders=("scaled",))
    timing = TimingOptions(budget_s=0.05, warmup_s=0.01, min_reps=4, noise_target=0.5)
    run = run_bench([load_spec(BENCH_GOOD)], filters, timing, events=recorded)
    assert recorded.heard == [
        ("started", "loading good"),
        ("finished", "loading good"),
        ("started", "peak bandwidth of cpu"),
        ("finished", "peak bandwidth of cpu"),
        ("planned", "bench", len(run.results)),
        *[("result", "bench", r.contender) for r in run.results],
        ("finish", len(run.results)),
    ]


def test_a_bench_task_that_fails_still_ends_for_its_subscribers(tmp_path):
    from opforge.bench.plan import BenchFilters
    from opforge.bench.runner import run_bench
    from opforge.core.errors import OpforgeError
    from opforge.loading.spec import load_spec

    # The spinner of a load that raises must stop: task_finished follows task_started whatever happens in it.
    path = copy_fixture(tmp_path, "bench_good.yaml", lambda text: text.replace("bench_ops:scaled", "bench_ops:gone"))
    recorded = _Recorded()
    with pytest.raises(OpforgeError):
        run_bench([load_spec(path)], BenchFilters(), TimingOptions(), events=recorded)
    assert recorded.heard == [("started", "loading good"), ("finished", "loading good")]


# ------------------------------------------------------------------------------ slower than a baseline


def timed(contender: str, median_s: float, spread: float = 0.02, seed: int = 1) -> BenchResult:
    role = BASELINE if contender in ("eager", "compile") else IMPLEMENTATION
    samples = tuple(noisy(median_s, spread, n=40, seed=seed))
    return BenchResult(
        "good", contender, role, "cpu", "float32", "fwd", "n=2^8", 256, OK, timing=Timing(samples, "fake", 1, "noise")
    )


@pytest.mark.parametrize(
    ("native_s", "spread", "tolerance_pct", "slower"),
    [
        (1.2e-3, 0.02, 0.0, True),  # 20% slower, 2% noise
        (1.0e-3, 0.02, 0.0, False),  # the same time, other samples
        (0.8e-3, 0.02, 0.0, False),  # faster
        (1.03e-3, 0.3, 0.0, False),  # slower by less than the noise explains
        (1.2e-3, 0.02, 30.0, False),  # slower by less than the tolerance
    ],
)
def test_a_point_is_slower_than_a_baseline_only_beyond_the_noise_and_the_tolerance(
    native_s, spread, tolerance_pct, slower
):
    results = [timed("native", native_s, spread, seed=1), timed("compile", 1e-3, spread, seed=2)]
    trails = trailing(results, tolerance_pct)
    assert [t.baseline for t in trails] == (["compile"] if slower else [])
    if slower:
        assert trails[0].result == "good/native[fwd-float32-cpu-n=2^8]"
        assert trails[0].interval.ratio == pytest.approx(native_s / 1e-3, rel=0.02) and trails[0].interval.low > 1


def test_only_implementations_are_judged_a_baseline_slower_than_another_is_not_listed():
    assert trailing([timed("native", 1e-3), timed("eager", 2e-3, seed=2), timed("compile", 1e-3, seed=3)]) == []


@pytest.fixture
def timer_in_order(monkeypatch):
    """Replaces the timers: the n-th contender timed gets 40 samples around medians[n % len(medians)], 2% noise."""
    state = {"medians": [1e-3], "calls": 0}

    def fake(call, device, options, reset=None):
        call()
        median_s = state["medians"][state["calls"] % len(state["medians"])]
        state["calls"] += 1
        return Timing(tuple(noisy(median_s, 0.02, n=40, seed=state["calls"])), "fake", 1, "noise")

    monkeypatch.setattr("opforge.bench.runner.time_callable", fake)
    return state


def bench_native_and_eager(tmp_path, *extra: str):
    args = ["bench", BENCH_GOOD, "--sizes", "256", "--mode", "fwd", "--contender", "native", "--contender", "eager"]
    return invoke(*args, "--json", str(tmp_path / "run.json"), "--junit", str(tmp_path / "run.xml"), *extra)


def test_fail_slower_than_fails_a_point_slower_than_that_baseline_and_says_by_how_much(tmp_path, timer_in_order):
    timer_in_order["medians"] = [1.3e-3, 1e-3]  # native, then eager
    result = bench_native_and_eager(tmp_path, "--fail-slower-than", "eager")
    assert result.exit_code == 1, result.output
    assert "slower than a baseline of this run, beyond its noise:" in result.output
    assert "good/native[fwd-float32-cpu-n=2^8]: 1.3" in result.output and "x the time of eager" in result.output
    assert "FAILED: 2 timed, 1 slower than a baseline" in result.output
    run = json.loads((tmp_path / "run.json").read_text())
    [trail] = run["trailing"]
    assert trail["baseline"] == "eager" and trail["low"] > 1 and trail["ratio"] == pytest.approx(1.3, rel=0.02)
    failure = junit_cases(tmp_path / "run.xml")["good.native.bench", "fwd-float32-cpu-n=2^8"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("slower than eager: 1.3"), result.output


def test_a_point_slower_than_a_baseline_not_gated_is_listed_and_passes(tmp_path, timer_in_order):
    timer_in_order["medians"] = [1.3e-3, 1e-3]
    result = bench_native_and_eager(tmp_path)
    assert result.exit_code == 0, result.output
    assert "good/native[fwd-float32-cpu-n=2^8]: 1.3" in result.output and "OK: 2 timed, 1 slower" in result.output


def test_fail_slower_than_passes_an_implementation_that_keeps_up(tmp_path, timer_in_order):
    timer_in_order["medians"] = [0.9e-3, 1e-3]
    result = bench_native_and_eager(tmp_path, "--fail-slower-than", "eager")
    assert result.exit_code == 0, result.output
    assert "slower than a baseline" not in result.output
    assert json.loads((tmp_path / "run.json").read_text())["trailing"] == []


def test_the_commands_default_tolerance_is_the_named_one():
    import inspect

    from opforge.bench.trailing import DEFAULT_MAX_SLOWER_PCT
    from opforge.commands.bench import bench

    assert inspect.signature(bench).parameters["max_slower"].default == DEFAULT_MAX_SLOWER_PCT


def test_fail_slower_than_a_baseline_that_was_not_timed_judges_nothing_and_fails(tmp_path, timer_in_order):
    timer_in_order["medians"] = [1e-3, 1e-3]
    result = bench_native_and_eager(tmp_path, "--fail-slower-than", "compile")
    assert result.exit_code == 1, result.output
    assert (
        "--fail-slower-than compile: expected points where an implementation and compile were both timed, got none"
        in (" ".join(result.output.split()))
    )
    gate = junit_cases(tmp_path / "run.xml")["baseline.-.regression_gate", "-"].find("failure")
    assert gate is not None and "--fail-slower-than compile" in gate.get("message", "")


def with_slower(tmp_path, entry: str):
    """bench_good.yaml with one `bench.slower` entry (YAML flow mapping)."""
    return copy_fixture(
        tmp_path,
        "bench_good.yaml",
        lambda text: text.replace("  modes: [fwd, bwd]\n", f"  modes: [fwd, bwd]\n  slower: [{entry}]\n"),
    )


@pytest.mark.parametrize(
    ("entry", "gated"),
    [
        ("{than: eager, case: 'fwd-*-n=2^8', reason: reads one more tensor}", False),  # covers the point
        ("{than: eager, reason: reads one more tensor}", False),  # every point
        ("{than: eager, case: 'bwd-*', reason: reads one more tensor}", True),  # another mode
        ("{than: compile, reason: reads one more tensor}", True),  # another baseline
        ("{than: eager, implementation: scaled, reason: reads one more tensor}", True),  # another implementation
    ],
)
def test_a_point_the_spec_declares_slower_is_listed_with_its_reason_and_not_failed(
    tmp_path, timer_in_order, entry, gated
):
    timer_in_order["medians"] = [1.3e-3, 1e-3]  # native, then eager
    spec = with_slower(tmp_path, entry)
    args = ["bench", str(spec), "--sizes", "256", "--mode", "fwd", "--contender", "native", "--contender", "eager"]
    result = invoke(*args, "--json", str(tmp_path / "run.json"), "--fail-slower-than", "eager")
    assert result.exit_code == (1 if gated else 0), result.output
    [trail] = json.loads((tmp_path / "run.json").read_text())["trailing"]
    assert trail["declared"] == ("" if gated else "reads one more tensor"), trail
    if not gated:
        assert "declared in its spec: reads one more tensor" in result.output
        assert "OK: 2 timed, 1 slower than a baseline (1 declared)" in result.output


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("{than: inductor, reason: x}", "bench.slower[0].than: expected one of eager, compile, got str 'inductor'"),
        ("{than: eager}", "bench.slower[0].reason: expected a 'reason' entry, got none"),
        (
            "{than: eager, reason: x, case: '*', why: y}",
            "bench.slower[0].why: expected one of than, case, implementation, reason, got unknown key 'why'",
        ),
        (
            "{than: eager, reason: x, implementation: fast}",
            "bench.slower[0].implementation: expected one of native, scaled",
        ),
    ],
)
def test_a_bench_slower_entry_is_checked_at_load(tmp_path, entry, fragment):
    from opforge.core.errors import SpecError
    from opforge.loading.spec import load_spec

    with pytest.raises(SpecError) as raised:
        load_spec(with_slower(tmp_path, entry))
    message = " ".join(str(raised.value).split())
    assert fragment in message and "bench_good.yaml:" in message, message


def test_peers_compile_every_point_afresh_instead_of_falling_back_to_eager_past_dynamos_recompile_limit(monkeypatch):
    """One compiled reference across 3 shapes x 3 dtypes x fwd/bwd needs 18 graphs; past dynamo's limit of 8 it ran
    eagerly under the name compile. Counted with a backend that records each graph it is given."""
    import torch
    from torch._dynamo.testing import CompileCounter

    script = load_benchmark("rms_norm_peers")
    counter = CompileCounter()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compile_(fn, backend=counter, **options))
    args = ["--device", "cpu", "--contender", "compile", "--shapes", "4x16,8x16,8x32", "--reps", "2", "--warmup", "1"]
    assert script.main([*args, "--dtypes", "float32,bfloat16,float16"]) == 0
    assert counter.frame_count == 18
