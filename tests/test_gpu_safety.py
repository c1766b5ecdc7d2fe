"""GPU memory safety: the misaligned (offset) layout, compute-sanitizer's reports turned into results, the grid-size
case past 2^24 elements, launch errors blamed on their own case, and ops that cannot be graph-captured. What needs a
GPU runs on one (tests/fixtures/cuda_ops/memory_bugs.*, .ci/gpu checks); here, everything a CPU can prove."""

from __future__ import annotations

import json

import pytest
from helpers import FIXTURES, describe, failures_by_check, in_process, requires_cuda, run_spec, run_spec_isolated
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.results import Status

CUDA_OPS = FIXTURES / "cuda_ops"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


# ----------------------------------------------------------------------------------------------- offset layout


def test_a_kernel_that_reads_from_the_storage_start_fails_only_the_offset_cases():
    report = run_spec(FIXTURES / "ignores_offset.yaml")
    failed = failures_by_check(report)["correctness"]
    assert failed and {r.case_id.split("-")[2] for r in failed} == {"offset"}
    offset_rows = [r for r in report.results if "-offset-" in r.case_id]
    assert {r.case_id.split("-", 3)[3] for r in offset_rows} == {"x=0d", "x=7", "x=5x6"}  # empty: nothing to offset


def test_offset_cases_are_a_contiguous_view_one_element_into_its_storage():
    import torch

    from opforge.cases.arguments import in_layout

    view = in_layout(torch.arange(6.0).reshape(2, 3), "offset", torch.float32, "cpu")
    assert view.is_contiguous() and view.storage_offset() == 1 and view.data_ptr() % 16 != 0
    assert view.equal(torch.arange(6.0).reshape(2, 3))


def test_the_correct_op_passes_its_offset_cases():
    report = run_spec(FIXTURES / "good.yaml", checks=("correctness", "grad_lowp"))
    offset = [r for r in report.results if "-offset-" in r.case_id]
    assert offset and all(r.status == Status.PASS for r in offset), describe(offset)


# ------------------------------------------------------------------------------------------- compute-sanitizer

MEMCHECK_OUTPUT = """========= COMPUTE-SANITIZER
OPFORGE-SANITIZE-CASE float32-cuda-contiguous-x=7
OPFORGE-SANITIZE-CASE float32-cuda-contiguous-x=1000003
========= Invalid __global__ read of size 4 bytes
=========     at void unchecked_bounds_kernel<float>(const T1 *, T1 *, long)+0x80 in memory_bugs.cu:52
=========     by thread (35,0,0) in block (7812,0,0)
=========     Address 0x7f2a4c00000c is out of bounds
=========
========= Invalid __global__ write of size 4 bytes
=========     at void unchecked_bounds_kernel<float>(const T1 *, T1 *, long)+0xb0 in memory_bugs.cu:52
=========
OPFORGE-SANITIZE-CASE float16-cuda-contiguous-x=7
========= ERROR SUMMARY: 2 errors
"""
RACECHECK_OUTPUT = """OPFORGE-SANITIZE-CASE float32-cuda-contiguous-x=33x65
========= Error: Race reported between Write access at void racy_row_sum<float>(const T1 *, T1 *, long)+0x2a0
=========     and Read access at void racy_row_sum<float>(const T1 *, T1 *, long)+0x280 [1536 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_sanitizer_reports_are_blamed_on_the_case_that_was_running():
    from opforge.checks.sanitize import parse_reports

    reports = parse_reports(MEMCHECK_OUTPUT)
    assert [(r.what, r.case_id) for r in reports] == [
        ("Invalid __global__ read of size 4 bytes", "float32-cuda-contiguous-x=1000003"),
        ("Invalid __global__ write of size 4 bytes", "float32-cuda-contiguous-x=1000003"),
    ]
    assert reports[0].where.endswith("in memory_bugs.cu:52")
    [race] = parse_reports(RACECHECK_OUTPUT)
    assert race.what.startswith("Error: Race reported between Write access") and race.case_id.endswith("x=33x65")
    assert parse_reports("OPFORGE-SANITIZE-CASE a\n========= ERROR SUMMARY: 0 errors\n") == []


def test_a_sanitizer_failure_names_kernel_access_case_and_the_log(tmp_path):
    from opforge.checks.sanitize import describe_reports, parse_reports

    message = describe_reports("memcheck", parse_reports(MEMCHECK_OUTPUT), 12, tmp_path / "memcheck.log")
    assert "memcheck: 2 report(s) in 1 of 12 CUDA cases" in message
    assert "Invalid __global__ read of size 4 bytes at void unchecked_bounds_kernel" in message
    assert "(case float32-cuda-contiguous-x=1000003)" in message and str(tmp_path / "memcheck.log") in message
    # The same two reports in a second case: one line each, with the count and both cases.
    reports = MEMCHECK_OUTPUT[
        MEMCHECK_OUTPUT.index("========= Invalid") : MEMCHECK_OUTPUT.index("OPFORGE-SANITIZE-CASE float16")
    ]
    repeated = parse_reports(MEMCHECK_OUTPUT.replace("x=7\n", "x=7\n" + reports, 1))
    grouped = describe_reports("memcheck", repeated, 12, tmp_path / "memcheck.log")
    assert "4 report(s) in 2 of 12" in grouped
    assert "- 2x Invalid __global__ read of size 4 bytes at void unchecked_bounds_kernel" in grouped
    assert "(cases float32-cuda-contiguous-x=7, float32-cuda-contiguous-x=1000003)" in grouped
    no_lines = describe_reports("racecheck", parse_reports(RACECHECK_OUTPUT), 3, tmp_path / "r.log")
    assert "No source lines in the reports: build the op's CUDA sources with -lineinfo" in no_lines


@pytest.mark.slow
def test_sanitizer_tools_run_only_when_asked_and_skip_without_a_gpu(tmp_path):
    import torch

    spec = str(FIXTURES / "good.yaml")
    plain = invoke("check", spec, "--json", str(tmp_path / "plain.json"))
    rows = json.loads((tmp_path / "plain.json").read_text())["ops"][0]["results"]
    assert rows and not {"memcheck", "racecheck"} & {r["check"] for r in rows}, plain.output
    if torch.cuda.is_available():
        return
    bundled = "leaky_swish"  # a compiled op that claims CUDA; its spec's `checks:` does not need to list the tools
    asked = invoke("check", bundled, "--sanitize", "memcheck,racecheck", "--check", "memcheck", "--check", "racecheck")
    assert asked.exit_code == 5, asked.output  # the only rows asked for are skipped: nothing ran
    assert "CUDA is not available" in asked.output


def test_a_check_no_selected_spec_lists_is_named_when_nothing_runs():
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "stream")
    assert result.exit_code == 5
    assert "--check stream: expected a check some selected spec runs" in " ".join(result.output.split())


def test_an_unknown_sanitizer_tool_is_a_usage_error():
    result = invoke("check", str(FIXTURES / "good.yaml"), "--sanitize", "memchek")
    assert result.exit_code == 2 and "--sanitize: expected one of memcheck, racecheck" in result.output


def test_the_sanitizer_child_runs_with_the_caching_allocator_off_and_line_info():
    from opforge.checks.sanitize import child_command, child_env
    from opforge.core.child import entry_point

    env = child_env()
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" and "-lineinfo" in env["OPFORGE_EXTRA_CUDA_CFLAGS"]
    command = child_command("/opt/cuda/bin/compute-sanitizer", "memcheck", FIXTURES / "channel")
    assert command[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck"]
    # The child starts as the engine's workers do, so that the cwd cannot shadow opforge (not `python -m`).
    assert command[-4:] == [*entry_point("opforge.engine.sanitize_child"), str(FIXTURES / "channel")]


def test_the_sanitizer_child_s_cases_are_marked_where_its_output_stood_when_each_started():
    from opforge.checks.sanitize import marked_output, parse_reports
    from opforge.core.protocol import CaseRaised, CaseStarted

    output = b"========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\npartial"
    messages = [CaseStarted("a", 28), CaseRaised("a", "RuntimeError: no", 28), CaseStarted("b", 200)]
    marked = marked_output(output, messages)
    assert marked.splitlines() == [
        "========= COMPUTE-SANITIZER",
        "OPFORGE-SANITIZE-CASE a",
        "OPFORGE-SANITIZE-ERROR a raised RuntimeError: no",
        "========= Invalid __global__ read of size 4 bytes",
        "partial",  # a line the tool had not ended: the marker after it goes on a line of its own
        "OPFORGE-SANITIZE-CASE b",
    ]
    assert [r.case_id for r in parse_reports(marked)] == ["a"]
    assert marked_output(b"", []) == ""


FAKE_SANITIZER = """import subprocess, sys
args = sys.argv[1:]
command = args[args.index("--show-backtrace") + 2:]
print("========= COMPUTE-SANITIZER", flush=True)
print("========= Program hit an error before the cases", flush=True)
code = subprocess.run(command).returncode
print("========= Invalid __global__ read of size 4 bytes", flush=True)
print("========= ERROR SUMMARY: 2 errors", flush=True)
sys.exit(code)
"""


@pytest.mark.slow
def test_the_sanitizer_child_speaks_the_protocol_through_the_tool_that_wraps_it(tmp_path):
    import sys

    import torch

    from opforge.cases.matrix import build_matrix
    from opforge.checks.sanitize import _case_json, parse_reports, run_child
    from opforge.core.protocol import CaseRaised, CaseStarted, Done, SanitizeJob
    from opforge.loading.spec import load_spec

    # A stand-in for compute-sanitizer that writes to the child's stdout before and after it, as the tool does: the
    # job reaches the child through it, its events come back on their own channel, its output is the log.
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(f"#!{sys.executable}\n{FAKE_SANITIZER}")
    tool.chmod(0o755)
    spec = load_spec(FIXTURES / "good.yaml")
    cases = [c for c in build_matrix(spec, ("float32",), ("cuda",)) if c.values_index == 0][:2]
    job = SanitizeJob(str(spec.path), "native", 0, tuple(_case_json(c) for c in cases))
    output, messages, returncode = run_child(str(tool), "memcheck", job, 300)
    assert returncode == 0, output
    # Without a GPU each case raises; on one each runs (this test assumed the former until an H100 ran it).
    gpu = torch.cuda.is_available()
    outcome = [] if gpu else [CaseRaised]
    assert [type(m) for m in messages] == [CaseStarted, *outcome, CaseStarted, *outcome, Done], output
    assert [m.case_id for m in messages if isinstance(m, CaseStarted)] == [c.id for c in cases]
    lines = output.splitlines()
    assert lines[:2] == ["========= COMPUTE-SANITIZER", "========= Program hit an error before the cases"]
    assert lines[2] == f"OPFORGE-SANITIZE-CASE {cases[0].id}"
    if gpu:
        assert lines[3] == f"OPFORGE-SANITIZE-CASE {cases[1].id}"
    else:
        assert lines[3].startswith(f"OPFORGE-SANITIZE-ERROR {cases[0].id} raised ")
    assert lines[-1] == "========= ERROR SUMMARY: 2 errors"
    before, last = parse_reports(output)
    assert before.case_id == "before the first case (loading the op)" and last.case_id == cases[1].id


# --------------------------------------------------------------------------------------------------- grid size


def test_an_elementwise_op_gets_a_grid_size_case_past_2_24_elements_and_others_need_shapes():
    from opforge.checks.grid_size import ELEMENTS, grid_shapes
    from opforge.loading.spec import load_spec

    assert ELEMENTS > 65_535 * 512 and ELEMENTS % 8
    assert grid_shapes(load_spec(FIXTURES / "good.yaml")) == (("x", (ELEMENTS,)),)
    assert grid_shapes(load_spec(FIXTURES / "real_ops" / "roi_pool_avg.yaml")) is None


def test_grid_size_gives_a_2d_only_row_op_a_2d_case():
    from opforge.checks.grid_size import ELEMENTS, grid_shapes
    from opforge.loading.spec import load_spec

    # A row op listing 2-D shapes alone (its kernels refuse x.dim() != 2) got a 1-D case, which the op refuses (on an
    # H100 its worker died with SIGSEGV). Now its narrowest rows, [0, 16], grown past ELEMENTS and 65,535 rows.
    assert grid_shapes(load_spec(CUDA_OPS / "row_center.yaml")) == (("x", (2_097_409, 16)),)
    assert 2_097_409 * 16 >= ELEMENTS > 2_097_408 * 16


def test_grid_size_grows_a_listed_shape_of_the_spec_s_own_rank():
    from opforge.cases.matrix import grown_shape
    from opforge.checks.grid_size import ELEMENTS

    # A 1-D shape among them keeps the 1-D case; 3-D grows its first dimension; 0-d and empty rows give nothing.
    assert grown_shape([(33, 65), (7,)], ELEMENTS) == (ELEMENTS,)
    assert grown_shape([(3, 4, 5), (2, 9, 9)], ELEMENTS) == (1_677_927, 4, 5)
    assert grown_shape([(), (3, 0), (0, 0)], ELEMENTS) is None


def test_grid_size_skips_saying_what_to_write_when_no_shape_is_shared():
    from opforge.checks.grid_size import grid_shapes, missing_shapes_message
    from opforge.loading.spec import load_spec

    spec = load_spec(FIXTURES / "real_ops" / "roi_pool_avg.yaml")
    assert grid_shapes(spec) is None
    message = missing_shapes_message(spec)
    assert message.startswith("grid_size: expected tensor inputs that share a shape of rank 1 or more")
    # The example is in the spec's own ranks: features [N, C, H, W] grown in N, rois [K, 5] as listed.
    assert "`grid_size: {shapes: {features: [174785, 3, 8, 8], rois: [4, 5]}}`" in message, message


def test_a_grid_size_shape_must_be_past_2_24_elements(tmp_path):
    from opforge.core.errors import SpecError
    from opforge.loading.spec import load_spec

    (tmp_path / "broken_ops.py").write_text((FIXTURES / "broken_ops.py").read_text())
    path = tmp_path / "good.yaml"
    path.write_text((FIXTURES / "good.yaml").read_text() + "grid_size: {shapes: {x: [65536, 256]}}\n")
    with pytest.raises(SpecError, match=r"grid_size.shapes: expected a tensor of more than 2\^24"):
        load_spec(path)
    path.write_text((FIXTURES / "good.yaml").read_text() + "grid_size: {shapes: {x: [70000, 256]}}\n")
    assert load_spec(path).section("grid_size").shapes == (("x", (70000, 256)),)


# --------------------------------------------------------------------------------------------- the GPU proofs

# (fixture, the check that must flag it): the bug each CUDA fixture carries (tests/fixtures/cuda_ops/memory_bugs.cu).
GPU_BUGS = [
    ("misaligned_swish", "correctness"),
    ("capped_grid_swish", "grid_size"),
    ("empty_launch_swish", "correctness"),
    ("syncing_swish", "stream"),
]


@requires_cuda
@pytest.mark.parametrize("fixture, check", GPU_BUGS, ids=[b[0] for b in GPU_BUGS])
def test_each_gpu_memory_bug_is_flagged_by_its_check(fixture, check):
    failed = failures_by_check(run_spec_isolated(CUDA_OPS / f"{fixture}.yaml", devices=("cuda",)))
    assert check in failed, f"{fixture}: expected {check} to fail; failures were {sorted(failed)}"


@requires_cuda
def test_a_correct_2d_row_op_passes_grid_size():
    report = run_spec_isolated(CUDA_OPS / "row_center.yaml", devices=("cuda",), checks=("grid_size",))
    rows = [r for r in report.results if r.check == "grid_size"]
    assert rows and {r.status for r in rows} == {Status.PASS}, describe(report.results)


@requires_cuda
def test_a_launch_error_is_its_own_case_s_failure_and_the_other_cases_run_clean():
    report = run_spec_isolated(CUDA_OPS / "empty_launch_swish.yaml", devices=("cuda",), checks=("correctness",))
    failed = [r for r in report.results if r.status.failed]
    assert failed and all("=0" in r.case_id for r in failed), describe(failed)
    assert all("CUDA error pending" in r.message for r in failed)


@requires_cuda
def test_an_op_declared_not_graph_capturable_keeps_its_stream_order_check(tmp_path):
    spec = tmp_path / "syncing.yaml"
    spec.write_text((CUDA_OPS / "syncing_swish.yaml").read_text() + "cuda_graphs: false\n")
    for name in ("memory_bugs.cpp", "memory_bugs.cu", "memory_bugs.py"):
        (tmp_path / name).write_text((CUDA_OPS / name).read_text())
    report = run_spec_isolated(spec, devices=("cuda",), checks=("stream",))
    assert report.results and {r.status for r in report.results} == {Status.PASS}, describe(report.results)
    assert all("cuda_graphs: false" in r.message for r in report.results)
