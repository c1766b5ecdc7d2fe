"""The terminal report at the widths people have: every word readable at 80 and 140 columns (no cell cut to "…"),
one table per device when both do not fit, one panel per root cause, repro commands on one line."""

from __future__ import annotations

import pytest
from helpers import FIXTURES, in_process
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.results import CaseResult, OpReport, RunReport, Status
from opforge.reporters import console as console_module

runner = CliRunner()


@pytest.fixture
def width(monkeypatch):
    def set_width(columns: int) -> None:
        monkeypatch.setattr(console_module.console, "width", columns)

    return set_width


def check(*args: str):
    return runner.invoke(app, in_process(("check", *args)), env={"NO_COLOR": "1"})


def table_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line[:1] in "┏┃┡│└"]


@pytest.mark.parametrize("columns", [80, 140])
def test_the_result_table_reads_whole_at_80_and_140_columns(width, columns):
    width(columns)
    # opcheck for its long row labels; dtypes for the folded "other" column.
    result = check(str(FIXTURES / "good.yaml"), "--check", "correctness", "--check", "opcheck", "--check", "dtypes")
    assert result.exit_code == 0, result.output
    lines = table_lines(result.output)
    assert lines and all(len(line) <= columns for line in lines), "\n".join(lines)
    assert "…" not in "\n".join(lines)
    header = " ".join(lines[:3])
    for name in ("impl", "check", "f32", "f64", "bf16", "other", "cpu"):
        assert name in header
    assert "opcheck:aot_dynamic" in result.output and "opcheck:autograd_reg" in result.output


def _result(device: str, dtype: str, check: str = "correctness", status: Status = Status.PASS) -> CaseResult:
    return CaseResult("op", "native", check, f"{dtype}-{device}-contiguous-x=7", dtype, device, status)


def test_two_devices_too_wide_for_the_terminal_get_a_table_each(width, capsys):
    from opforge.reporters.terminal import render_op

    dtypes = ("float32", "float64", "float16", "bfloat16")
    check = "opcheck:test_autograd_registration"  # the longest row label
    results = [_result(d, t, check) for d in ("cpu", "cuda") for t in dtypes]
    op = OpReport(op="op", spec_path="op.yaml", results=results)
    width(80)
    render_op(op)
    narrow = capsys.readouterr().out
    assert "op  (op.yaml)  on cpu" in narrow and "op  (op.yaml)  on cuda" in narrow
    assert all(len(line) <= 80 for line in table_lines(narrow)) and "…" not in narrow
    width(140)
    render_op(op)
    wide = capsys.readouterr().out
    assert " on cpu" not in wide and wide.count("pass 1") == 8


def test_ten_dtypes_too_wide_for_80_columns_split_into_tables_that_keep_every_column(width, capsys):
    """`COLUMNS=80 opforge check leaky_swish --check dtypes` cut the columns after int64 off, without an ellipsis:
    one device's columns now go into as many tables as fit, in order."""
    from opforge.checks.dtypes import TRIED_DTYPES
    from opforge.reporters.terminal import SHORT_DTYPES, render_op

    results = [_result("cpu", dtype, "dtypes") for dtype in TRIED_DTYPES]
    results += [CaseResult("op", "prototype", "dtypes", f"{d}-cpu", d, "cpu", Status.PASS) for d in TRIED_DTYPES]
    op = OpReport(op="op", spec_path="op.yaml", results=results)
    width(80)
    render_op(op)
    narrow = capsys.readouterr().out
    lines = table_lines(narrow)
    assert all(len(line) <= 80 for line in lines) and "…" not in narrow, narrow
    assert "op  (op.yaml)  on cpu, part 1 of 2" in narrow and "part 2 of 2" in narrow
    headers = " ".join(line for line in lines if line.startswith("┃"))
    assert all(SHORT_DTYPES.get(d, d) in headers for d in TRIED_DTYPES), headers
    assert narrow.count("pass") == 2 * len(TRIED_DTYPES)


def test_failures_with_one_cause_are_one_panel_with_their_count_and_a_repro_on_one_line(width):
    width(100)
    result = check(str(FIXTURES / "ignores_strides.yaml"), "--check", "correctness", "--dtype", "float32")
    assert result.exit_code == 1, result.output
    assert result.output.count("╭─ FAIL") == 1, result.output
    assert "FAIL ignores_strides/native::correctness (3 cases)" in result.output
    assert "3 cases: float32-cpu-transposed-x=5x6, float32-cpu-strided-x=7, float32-cpu-strided-x=5x6" in result.output
    assert "worst mismatch in result at [" in result.output
    [repro] = [line for line in result.output.splitlines() if line.startswith("repro: ")]
    assert (
        repro.endswith("--seed 0") and "-k 'ignores_strides/native::correctness[float32-cpu-transposed-x=5x6]'" in repro
    )
    assert len(repro) > 100  # longer than the terminal, and still one line


def test_different_failures_of_one_check_stay_apart():
    from opforge.reporters.terminal import group_failures

    mismatch = "result: 3 of 30 elements differ from the reference beyond tolerance."
    rows = [
        CaseResult("op", "native", "correctness", "a", "float32", "cpu", Status.FAIL, message=mismatch),
        CaseResult(
            "op", "native", "correctness", "b", "float32", "cpu", Status.FAIL, message=mismatch.replace("3", "7")
        ),
        CaseResult(
            "op", "native", "correctness", "c", "float32", "cpu", Status.FAIL, message="native raised ValueError"
        ),
        CaseResult("op", "native", "correctness", "d", "float32", "cpu", Status.CRASH, message=mismatch),
    ]
    assert [[r.case_id for r in g] for g in group_failures(rows).values()] == [["a", "b"], ["c"], ["d"]]


def test_more_kinds_of_failure_than_panels_are_counted(monkeypatch, capsys):
    from opforge.reporters import terminal

    monkeypatch.setattr(terminal, "MAX_FAILURE_PANELS", 1)
    rows = [
        CaseResult("op", "native", check, "a", "float32", "cpu", Status.FAIL, message=check)
        for check in ("correctness", "stream", "stream")
    ]
    terminal.render_failures(RunReport(environment={}, ops=[OpReport(op="op", spec_path="op.yaml", results=rows)]))
    assert "... and 1 more kinds of failure (2 results;" in capsys.readouterr().out


def _heartbeat_lines(capsys, count: int) -> list[str]:
    """The next `count` heartbeat lines printed (waiting up to 5 s for them)."""
    import time

    printed, deadline = "", time.monotonic() + 5
    while sum(line.startswith("... ") for line in printed.splitlines()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
        printed += capsys.readouterr().out
    return [line for line in printed.splitlines() if line.startswith("... ")][:count]


def test_without_a_terminal_progress_is_one_heartbeat_saying_where_the_run_is(capsys):
    """One timed heartbeat for the whole run: the step under way, then the results done and the last one, and nothing
    after the run ends."""
    import time

    from opforge.reporters.terminal import TerminalReport

    report = TerminalReport(heartbeat_interval=0.02)
    report.start()  # pytest's capture is no terminal: no bar
    report.step("compiling op.cpp")
    assert _heartbeat_lines(capsys, 1)[0].startswith("... still compiling op.cpp (")
    report.planned("op", 3)
    report.result("op", _result("cpu", "float32"))
    report.result("op", _result("cpu", "float64", status=Status.FAIL))
    capsys.readouterr()
    line = _heartbeat_lines(capsys, 1)[0]
    assert line.startswith("... op: 2/3 results done, 1 failed; last correctness [float64-cpu-contiguous-x=7] ("), line
    report.finish(RunReport(environment={}, ops=[]))
    capsys.readouterr()
    time.sleep(0.1)
    assert "... " not in capsys.readouterr().out, "the heartbeat went on after the run ended"


def test_without_a_terminal_a_long_step_prints_a_heartbeat_until_it_ends(capsys):
    """A compile or a slow contender is one long call: the heartbeat comes from a thread of its own."""
    import time

    from opforge.reporters.console import Heartbeat

    printed = ""
    with Heartbeat(lambda: "still compiling op.cpp", interval=0.02):
        deadline = time.monotonic() + 5
        while printed.count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            printed += capsys.readouterr().out
    printed += capsys.readouterr().out
    time.sleep(0.1)
    assert capsys.readouterr().out == "", "the heartbeat went on after its step ended"
    beats = printed.splitlines()
    assert len(beats) >= 2 and all(line.startswith("... still compiling op.cpp (") for line in beats), beats


def test_a_bench_result_whose_spread_is_large_against_its_median_is_flagged_noisy():
    from opforge.reporters.bench_terminal import noise_note

    assert noise_note(1e-3, 0.5e-4) == ""
    assert noise_note(1e-3, 2.3e-4) == "noisy: IQR 23% of median"
    assert noise_note(None, None) == ""


def _bench_run():
    from opforge.bench.model import BASELINE, IMPLEMENTATION, OK, BenchResult, BenchRun
    from opforge.bench.timing import Timing

    def timed(impl, role, median_s, case, dtype="bfloat16", spread=0.0) -> BenchResult:
        timing = Timing((median_s * (1 - spread), median_s, median_s * (1 + spread)), "cuda-events", 1, "noise")
        bytes_moved = 154_140_672
        return BenchResult(
            "op", impl, role, "cuda", dtype, "bwd", case, 1, OK, bytes_moved, timing=timing, peak_gbps=4246.3
        )

    small = "x=32x256x56x56,scale=256,shift=256,channels_last"
    large = "x=256x64x112x112,scale=64,shift=64,channels_last"
    results = [timed("native", IMPLEMENTATION, 51.9e-6, small), timed("eager", BASELINE, 417e-6, small)]
    results += [timed("compile", BASELINE, 96.6e-6, small), timed("native", IMPLEMENTATION, 320e-6, large)]
    # A second dtype keeps the dtype column; a noisy row brings a long note.
    results += [timed("native", IMPLEMENTATION, 604e-6, large, "float32", spread=0.2)]
    return BenchRun({}, {}, results), (small, large)


@pytest.mark.parametrize("columns", [80, 100, 120, 140])
def test_the_bench_table_never_cuts_a_number_at_80_to_140_columns(width, capsys, columns):
    # A GPU run's log (140 columns) showed "27…" for 2753 GB/s: long case labels took the width from the numbers.
    from opforge.reporters.bench_terminal import render_bench

    run, labels = _bench_run()
    width(columns)
    render_bench(run)
    out = capsys.readouterr().out
    lines = table_lines(out)
    assert lines and all(len(line) <= columns for line in lines), "\n".join(lines)
    assert all(line[-1] in "┓┃┩│┘" for line in lines), "a table's right edge was cut:\n" + out
    assert "…" not in out
    for number in ("51.9 µs", "2970", "69.9", "8.03x", "1.86x", "0.23x", "320 µs", "11.3", "604 µs"):
        assert number in out, out
    # The labels every row shares go to the title. A case label reads whole, or breaks after its commas (never inside
    # a size), or, where even that does not fit, heads a table of its own with its dtype.
    assert "opforge bench op (bwd, cuda)" in out and "│ bwd " not in out
    for label in labels:
        assert all(piece in out for piece in label.split(",")), out
    if columns <= 100:
        words = " ".join(out.split())  # a title longer than the console wraps
        assert f"{labels[0]} bfloat16" in words and f"{labels[1]} float32" in words, out


def test_the_spec_list_folds_long_names_at_80_columns_instead_of_cutting_them(width):
    width(80)
    result = runner.invoke(app, ["list"], env={"NO_COLOR": "1"})
    assert result.exit_code == 0 and "…" not in result.output, result.output
    assert all(len(line) <= 80 for line in table_lines(result.output))
    folded = "".join(line.split("│")[1].strip() for line in table_lines(result.output) if line.startswith("│"))
    assert "opforge::affine_leaky_swish" in folded
