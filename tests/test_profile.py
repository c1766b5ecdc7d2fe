"""`opforge profile`: per implementation, what one call runs (operators or kernels, their time and share), the host
time, GB/s and a trace; the figures come from torch.profiler on the bench points."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FIXTURES, SPECS
from typer.testing import CliRunner

from opforge.cli import app

runner = CliRunner()
GOOD = str(FIXTURES / "good.yaml")


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1"})


def test_each_implementation_is_profiled_with_its_operators_bytes_and_trace(tmp_path):
    result = invoke(
        "profile", GOOD, "--sizes", "65536", "--dtype", "float32", "--mode", "fwd", "--calls", "3",
        "--trace", str(tmp_path / "t.json"), "--json", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "good  n=2^16  float32  fwd  cpu  (3 calls each)" in result.output
    figures = json.loads((tmp_path / "p.json").read_text())
    rows = {r["contender"]: r for r in figures["results"]}
    assert set(rows) == {"native", "eager", "compile"}
    for name, row in rows.items():
        assert row["error"] is None and row["wall_seconds"] > 0 and row["gb_per_s"] > 0, name
        assert row["kernels"] and abs(sum(k["share"] for k in row["kernels"]) - 1) < 1e-6, name
        trace = json.loads(Path(row["trace"]).read_text())
        assert trace["traceEvents"], name
    # The composite the fixture's op is: its own operators, each named, with a share of the time.
    assert any(k["name"].startswith("aten::") for k in rows["eager"]["kernels"])


def test_an_unknown_implementation_is_a_usage_error():
    result = invoke("profile", GOOD, "--sizes", "1024", "--contender", "nativ")
    assert result.exit_code == 2
    assert "--contender: expected one of native, eager, compile" in " ".join(result.output.split())


def test_a_device_this_machine_lacks_profiles_nothing_and_says_so():
    import torch

    if torch.cuda.is_available():
        return
    result = invoke("profile", "leaky_swish", "--device", "cuda", "--sizes", "1024")
    assert result.exit_code == 5, result.output
    assert "skip cuda: CUDA is not available" in result.output


def test_a_mutating_ops_figures_leave_out_the_restore_of_its_arguments_and_its_trace_labels_it(tmp_path):
    """Each profiled call of leaky_swish_ first copies self back (as bench's reps do); that copy was half of the
    native op's listed time. It stays in the trace, named, and out of the figures."""
    from opforge.tools.profile import RESTORE_LABEL

    result = invoke(
        "profile", str(SPECS / "leaky_swish_.yaml"), "--sizes", "4096", "--dtype", "float32", "--contender", "native",
        "--calls", "3", "--trace", str(tmp_path / "t.json"), "--json", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "p.json").read_text())["results"]
    assert [(k["name"], k["calls"]) for k in row["kernels"]] == [("opforge::leaky_swish_", 1.0)]
    assert row["wall_seconds"] > 0
    names = {e.get("name") for e in json.loads(Path(row["trace"]).read_text())["traceEvents"]}
    assert RESTORE_LABEL in names and "aten::copy_" in names
