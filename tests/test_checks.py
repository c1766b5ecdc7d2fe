"""Each check flags the bug it exists for on a deliberately broken op, and passes a correct one."""

from __future__ import annotations

import math
import time

import pytest
from helpers import FIXTURES, REPO, describe, failures_by_check, requires_cuda, run_spec, spec_variant

from opforge.building.op import load_op
from opforge.checks.base import OptIns
from opforge.checks.dtypes import TRIED_DTYPES
from opforge.core.results import Status
from opforge.engine.plan import Filters, RunSettings, check_context, plan_op
from opforge.engine.tasks import run_task
from opforge.loading.spec import load_spec


def test_declared_nondeterministic_op_skips_determinism(tmp_path):
    path = spec_variant(tmp_path, "nondeterministic", "nondeterministic: true\n")
    report = run_spec(path)
    assert not report.failed and "determinism" not in {r.check for r in report.results}


@pytest.mark.slow
def test_correct_op_passes_every_check():
    report = run_spec(FIXTURES / "good.yaml")
    failed = [r for r in report.results if r.status.failed]
    assert not failed, describe(failed)
    checks = {r.check for r in report.results if r.status == Status.PASS}
    assert {
        "correctness",
        "determinism",
        "special_values",
        "gradcheck",
        "gradgradcheck",
        "grad_lowp",
        "opcheck:test_schema",
        "opcheck:test_faketensor",
        "opcheck:test_autograd_registration",
        "opcheck:test_aot_dispatch_dynamic",
        "dtypes",
        "vmap",
        "memory",
    } <= checks


# (fixture, checks that must flag it, checks that must still pass on it)
BUGS = [
    ("wrong_fake_shape", {"opcheck:test_faketensor"}, {"correctness", "gradcheck", "opcheck:test_schema"}),
    ("wrong_gradient", {"gradcheck", "grad_lowp"}, {"correctness", "opcheck:test_faketensor"}),
    (
        "no_autograd",
        {"gradcheck", "grad_lowp", "opcheck:test_aot_dispatch_dynamic"},
        {"correctness", "opcheck:test_autograd_registration"},
    ),
    ("wrong_double_backward", {"gradgradcheck"}, {"correctness", "gradcheck", "grad_lowp"}),
    (
        "function_on_cpu_key",
        {"opcheck:test_autograd_registration"},
        {"correctness", "gradcheck", "opcheck:test_schema"},
    ),
    ("undeclared_mutation", {"opcheck:test_schema", "correctness"}, {"opcheck:test_faketensor"}),
    ("float32_compute", {"gradcheck"}, {"opcheck:test_faketensor"}),
    ("ignores_strides", {"correctness"}, {"opcheck:test_schema"}),
    ("crashes_on_edge_shapes", {"correctness"}, set()),
    ("nondeterministic", {"determinism"}, {"correctness"}),
    ("nondeterministic_backward", {"determinism"}, {"correctness"}),
    ("swallows_nan", {"special_values"}, {"correctness"}),
    ("swallows_nan_in_tail", {"special_values"}, {"correctness"}),
    ("reinterprets_int32", {"dtypes"}, {"correctness"}),
    ("claims_bfloat16", {"dtypes", "correctness"}, set()),
    ("accepts_shape_mismatch", {"error_inputs"}, {"correctness"}),
    ("mixes_vmap_slices", {"vmap"}, {"correctness"}),
    ("leaks_outputs", {"memory"}, {"correctness"}),
]


@pytest.mark.parametrize("fixture, flagged_by, unaffected", BUGS, ids=[b[0] for b in BUGS])
def test_broken_op_is_flagged_by_its_check(fixture, flagged_by, unaffected):
    report = run_spec(FIXTURES / f"{fixture}.yaml")
    errors = [r for r in report.results if r.status == Status.ERROR]
    assert not errors, describe(errors)
    failed = failures_by_check(report)
    missing = flagged_by - failed.keys()
    assert not missing, f"{fixture}: expected {sorted(missing)} to fail; failures were {sorted(failed)}"
    wrongly = unaffected & failed.keys()
    assert not wrongly, describe([r for c in wrongly for r in failed[c]])


def special_values_head(numel, specials):
    """special_values' placement before the tail was added: the first positions only."""
    return [(slice(0, min(len(specials), numel)), specials[:numel])]


def test_special_values_reach_a_kernels_tail(monkeypatch):
    """The special values go at the last positions too: a scalar tail that swallows NaN fails on the one shape that
    has a tail (33x65: 2145 elements, one past the last multiple of 8), and only there; written at the first
    positions alone they would miss it."""
    failed = failures_by_check(run_spec(FIXTURES / "swallows_nan_in_tail.yaml", checks=("special_values",)))
    assert {r.case_id.rsplit("-", 1)[-1] for r in failed["special_values"]} == {"x=33x65"}
    assert all(r.mismatch is not None for r in failed["special_values"]), "each failure shows its worst mismatch"

    from opforge.checks import special_values

    def head_only(shape, names, dtype):
        return special_values_head(math.prod(shape), special_values.special_value_tensor(dtype, names))

    monkeypatch.setattr(special_values, "placements", head_only)
    assert not failures_by_check(run_spec(FIXTURES / "swallows_nan_in_tail.yaml", checks=("special_values",)))


def test_noncontiguous_bug_fails_only_noncontiguous_layouts():
    failed = failures_by_check(run_spec(FIXTURES / "ignores_strides.yaml", checks=("correctness",)))
    layouts = {r.case_id.split("-")[2] for r in failed["correctness"]}
    assert layouts == {"transposed", "strided"}
    assert all(r.mismatch is not None for r in failed["correctness"]), "each failure shows its worst mismatch"


def test_edge_shape_crash_fails_only_0d_and_empty():
    failed = failures_by_check(run_spec(FIXTURES / "crashes_on_edge_shapes.yaml", checks=("correctness",)))
    shapes = {r.case_id.rsplit("-", 1)[-1] for r in failed["correctness"]}
    assert shapes == {"x=0d", "x=0"}
    assert all("raised" in r.message for r in failed["correctness"])


def test_float64_through_float32_fails_gradcheck_in_float64_only():
    failed = failures_by_check(run_spec(FIXTURES / "float32_compute.yaml", checks=("gradcheck", "correctness")))
    assert {r.dtype for r in failed["gradcheck"]} == {"float64"}
    assert "correctness" not in {c for c, rows in failed.items() if any(r.dtype == "float32" for r in rows)}


def test_compile_tasks_of_one_dtype_share_one_function_and_one_worker():
    # leaky_swish's float32 tasks build 6 + 3 + 3 + 1 graphs for one function (each shape has a rank of its own), past
    # dynamo's 8 per function: fullgraph=True would fail the last tasks had each task not made room for its calls.
    loaded = load_op(load_spec(REPO / "specs" / "leaky_swish.yaml"))
    filters = Filters(dtypes=("float32", "float64"), devices=("cpu",), checks=("compile", "correctness"))
    plan = plan_op(loaded, filters, RunSettings())
    compile_groups = {(t.implementation.name, t.case.dtype): t.group for t in plan.tasks if t.check.name == "compile"}
    groups = [t.group for t in plan.tasks]
    assert len(set(compile_groups.values())) == 4 and len(set(groups)) == len(compile_groups) + sum(
        t.check.name != "compile" for t in plan.tasks
    )
    context = check_context(loaded, RunSettings())
    native = [t for t in plan.tasks if t.check.name == "compile" and t.implementation.name == "native"]
    float32 = [t for t in native if t.case.dtype == "float32"]
    results = [r for task in float32 for r in run_task(context, task, filters)]
    assert all(r.status == Status.PASS for r in results), describe(results)
    built = [int(r.detail.split()[0]) for r in results]
    assert sum(built) > 8 and all(" built; " in r.detail for r in results), describe(results)
    # The same tasks again in this run: every graph is reused.
    again = [r for task in float32 for r in run_task(context, task, filters)]
    assert [r.detail.split()[0] for r in again] == ["0"] * len(float32), describe(again)


def test_graph_break_fails_compile_for_that_implementation_only():
    report = run_spec(FIXTURES / "graph_break.yaml")
    assert failures_by_check(report, "graph_break").keys() == {"compile"}
    assert not failures_by_check(report, "native")


def test_an_op_returning_fewer_values_than_expected_fails_instead_of_comparing_fewer():
    import torch

    from opforge.checks.op_and_reference import paired
    from opforge.core.outcomes import CheckFailure

    loaded = load_op(load_spec(FIXTURES / "good.yaml"))
    with pytest.raises(CheckFailure, match=r"outputs: expected 2 value\(s\) \(the schema's returns\), got 1\."):
        paired(loaded, (torch.ones(1),), {}, (torch.ones(1), torch.ones(1)), {})
    assert paired(loaded, (torch.ones(1),), {}, (torch.zeros(1),), {})[0][0] == "result"


def test_mutated_argument_is_compared_with_the_reference():
    report = run_spec(FIXTURES / "scale_.yaml")
    assert not failures_by_check(report, "native"), describe(failures_by_check(report, "native").get("correctness", []))
    wrong = failures_by_check(report, "wrong")["correctness"]
    nonempty = [r for r in wrong if r.mismatch is not None]
    assert nonempty and all(r.mismatch.output == "x (mutated)" for r in nonempty)


def test_user_cpp_op_next_to_its_spec_is_built_and_checked():
    report = run_spec(FIXTURES / "user_op" / "strided_scale.yaml")
    failed = failures_by_check(report)
    assert {r.case_id.split("-")[2] for r in failed["correctness"]} == {"transposed", "strided"}
    # No autograd kernel: gradcheck fails, and the dispatcher's warning is kept as the clue.
    assert "gradcheck" in failed
    assert any("autograd kernel was not registered" in w for r in failed["gradcheck"] for w in r.warnings)


def test_strict_xfail_that_passes_is_xpass_and_fails(tmp_path):
    path = spec_variant(tmp_path, "good", "xfail:\n  - {check: correctness, dtype: float32, reason: stale}\n")
    report = run_spec(path, checks=("correctness",), dtypes=("float32",))
    assert {r.status for r in report.results} == {Status.XPASS}
    assert report.failed


def test_xfail_turns_a_known_failure_into_xfail(tmp_path):
    path = spec_variant(
        tmp_path, "ignores_strides", "xfail:\n  - {check: correctness, reason: known stride bug, strict: false}\n"
    )
    report = run_spec(path, checks=("correctness",))
    assert Status.XFAIL in {r.status for r in report.results}
    assert not report.failed


def test_case_seed_depends_only_on_base_seed_and_case():
    full = run_spec(FIXTURES / "good.yaml", checks=("correctness",))
    one = full.results[5]
    alone = run_spec(FIXTURES / "good.yaml", checks=("correctness",), keyword=one.full_id)
    assert [r.full_id for r in alone.results] == [one.full_id]
    assert alone.results[0].seed == one.seed


@requires_cuda
def test_cuda_result_that_disagrees_with_cpu_fails_devices():
    report = run_spec(FIXTURES / "cuda_disagrees.yaml")
    failed = failures_by_check(report)
    assert {r.device for r in failed["devices"]} == {"cuda"}
    assert not any(r.device == "cpu" for r in failed.get("correctness", []))


def test_devices_check_is_skipped_with_a_reason_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    report = run_spec(FIXTURES / "cuda_disagrees.yaml")
    skipped = [r for r in report.results if r.check == "devices"]
    assert skipped and all(r.status == Status.SKIP and "CUDA is not available" in r.message for r in skipped)


def test_unclaimed_dtype_that_returns_garbage_fails_and_one_that_works_is_reported():
    report = run_spec(FIXTURES / "reinterprets_int32.yaml", checks=("dtypes",))
    by_dtype = {r.dtype: r for r in report.results}
    assert by_dtype["int32"].status == Status.FAIL and "not claimed" in by_dtype["int32"].message
    assert by_dtype["int32"].mismatch is not None, "the failure shows the worst mismatch"
    # float16 and bfloat16 work although unclaimed: a pass that says so; int8 is rejected with a message: a quiet pass.
    assert by_dtype["float16"].status == Status.PASS and "not claimed, but works" in by_dtype["float16"].message
    assert by_dtype["int8"].status == Status.PASS and not by_dtype["int8"].message
    assert {r.dtype for r in report.results} == set(TRIED_DTYPES)


def test_claimed_dtype_without_a_kernel_fails_dtypes_for_that_dtype_only():
    failed = failures_by_check(run_spec(FIXTURES / "claims_bfloat16.yaml", checks=("dtypes",)))
    assert [r.dtype for r in failed["dtypes"]] == ["bfloat16"]
    assert "bfloat16 is claimed, but" in failed["dtypes"][0].message


def test_error_inputs_pass_an_op_that_checks_its_arguments():
    report = run_spec(FIXTURES / "accepts_shape_mismatch.yaml", checks=("error_inputs",))
    assert not failures_by_check(report, "checked"), describe(failures_by_check(report, "checked")["error_inputs"])
    failed = failures_by_check(report)["error_inputs"]
    assert len(failed) == 2 and all("accepted this invalid call" in r.message for r in failed)


def test_error_input_with_the_wrong_message_fails(tmp_path):
    path = spec_variant(tmp_path, "accepts_shape_mismatch", "")
    path.write_text(path.read_text().replace('"y must have x\'s dtype"', '"y must be float32"'))
    failed = failures_by_check(run_spec(path, checks=("error_inputs",)), "checked")["error_inputs"]
    assert len(failed) == 1 and "lacks 'y must be float32'" in failed[0].message


def _pinned_to(tmp_path, device: str, devices: str) -> object:
    """accepts_shape_mismatch with its dtype entry turned into a call that puts y on `device`."""
    path = spec_variant(tmp_path, "accepts_shape_mismatch", f"devices: {devices}\n")
    path.write_text(path.read_text().replace("inputs: {y: {dtype: float64}}", f"inputs: {{y: {{device: {device}}}}}"))
    return path


def test_error_inputs_run_once_per_device_with_unpinned_tensors_there(tmp_path):
    cases = _planned(_pinned_to(tmp_path, "cuda", "[cpu, cuda]"), "error_inputs")
    by_label = {(c.label.split("_")[2], c.device) for c in cases}
    # The shape entry on both devices; the entry that pins y to cuda only where x lands elsewhere (on cuda it would
    # be a valid call).
    assert by_label == {("x", "cpu"), ("x", "cuda"), ("another", "cpu")}, by_label


def test_error_input_pinned_to_a_device_the_run_leaves_out_is_not_called(tmp_path, monkeypatch):
    from opforge.checks import error_inputs

    # A machine with a GPU (pretended), checked with --device cpu: the cases are the CPU ones only.
    monkeypatch.setattr(error_inputs, "device_unavailable", lambda device: None)
    path = _pinned_to(tmp_path, "cuda", "[cpu, cuda]")
    labels = {c.label.split("_")[2] for c in _planned(path, "error_inputs", devices=("cpu",))}
    assert labels == {"x"}, "the entry that puts y on cuda would use the GPU the run excluded"
    # The same machine without the filter still makes the mixed-device call on the CPU case.
    assert ("another", "cpu") in {(c.label.split("_")[2], c.device) for c in _planned(path, "error_inputs")}


def test_error_input_pinned_to_the_only_device_of_the_run_makes_the_mixed_device_call(tmp_path, monkeypatch):
    from opforge.checks import error_inputs

    # A machine with a GPU (pretended), checked with --device cuda: the entry pinning y to cuda is still called,
    # with x on the CPU (on the GPU it would be a valid call); the found H200 bug was a CUDA out= kernel whose
    # device guard threw before its own device check.
    monkeypatch.setattr(error_inputs, "device_unavailable", lambda device: None)
    path = _pinned_to(tmp_path, "cuda", "[cpu, cuda]")
    planned = {(c.label.split("_")[2], c.device) for c in _planned(path, "error_inputs", devices=("cuda",))}
    assert planned == {("x", "cuda"), ("another", "cpu")}, planned


def test_error_input_on_a_missing_device_is_skipped_with_the_reason(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    report = run_spec(_pinned_to(tmp_path, "cuda", "[cpu, cuda]"), checks=("error_inputs",))
    pinned = [r for r in report.results if r.case_id.startswith("y_has_another_dtype")]
    assert len(pinned) == 2 and all(
        r.status == Status.SKIP and "puts y on cuda: CUDA is not available" in r.message for r in pinned
    ), describe(pinned)
    cuda_rows = [r for r in report.results if r.device == "cuda"]
    assert cuda_rows and all(r.status == Status.SKIP and "CUDA is not available" in r.message for r in cuda_rows)
    ran = [r for r in report.results if r.device == "cpu" and r.status != Status.SKIP]
    assert len(ran) == 2, "the shape entry ran on the CPU, for both implementations"


def test_error_input_pinned_to_a_device_the_spec_lacks_is_skipped_with_the_reason(tmp_path):
    report = run_spec(_pinned_to(tmp_path, "cuda", "[cpu]"), checks=("error_inputs",))
    pinned = [r for r in report.results if r.case_id.startswith("y_has_another_dtype")]
    assert len(pinned) == 2 and all(
        r.status == Status.SKIP and "do not include. Add cuda to devices" in r.message for r in pinned
    ), describe(pinned)


def test_unclaimed_integer_dtype_keeps_a_pinned_index_input_for_the_reference():
    report = run_spec(FIXTURES / "take.yaml")
    assert {r.status for r in report.results} == {Status.PASS}, describe(
        [r for r in report.results if r.status != Status.PASS]
    )
    assert {r.dtype for r in report.results if r.check == "dtypes"} >= {"int8", "int64", "bool"}


def test_vmap_claim_on_an_op_that_mutates_an_argument_is_a_spec_error(tmp_path):
    from opforge.core.errors import SpecError
    from opforge.loading.checked import load_checked

    path = spec_variant(tmp_path, "scale_", "vmap: true\n")
    with pytest.raises(SpecError, match="vmap: true on an op that mutates x"):
        load_checked(load_spec(path))


@pytest.mark.parametrize("command", [("bench", "--sizes", "64", "--budget", "0.05"), ("fuzz", "--budget", "3")])
def test_bench_and_fuzz_refuse_a_claim_the_op_cannot_honour_as_check_does(tmp_path, command):
    """bench and fuzz load the op through load_checked too: they used to time or search an op whose spec claims what
    the checks refuse."""
    from typer.testing import CliRunner

    from opforge.cli import app
    from opforge.core.errors import EXIT_USAGE

    path = spec_variant(tmp_path, "scale_", "vmap: true\n")
    name, *options = command
    result = CliRunner().invoke(app, [name, str(path), *options], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == EXIT_USAGE, result.output
    assert "vmap: true on an op that mutates x" in result.output


def test_out_argument_gets_the_case_layout():
    report = run_spec(FIXTURES / "swish_out.yaml")
    assert not failures_by_check(report, "native"), describe(failures_by_check(report, "native")["correctness"])
    wrong = failures_by_check(report, "ignores_strides")["correctness"]
    assert {r.case_id.split("-")[2] for r in wrong} == {"transposed", "strided", "channels_last"}
    assert all(r.mismatch.output == "out (mutated)" for r in wrong)


# ------------------------------------------------------------------------------- CUDA-only checks, on CPU too

CUDA_OPS = FIXTURES / "cuda_ops"
no_cuda = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")


def _planned(path, check, devices=("cpu", "cuda")):
    """The cases `check` would run for the spec's op if these devices were all available."""
    from opforge.cases.matrix import build_matrix
    from opforge.checks.catalog import CATALOG

    loaded = load_op(load_spec(path))
    matrix = build_matrix(loaded.spec, loaded.spec.dtypes, devices)
    return CATALOG.get(check).cases(loaded, loaded.implementations[0], matrix)


def test_stream_runs_on_cuda_contiguous_nonempty_cases_only():
    cases = _planned(CUDA_OPS / "default_stream_swish.yaml", "stream")
    assert cases and {(c.device, c.layout) for c in cases} == {("cuda", "contiguous")}
    assert {c.dtype for c in cases} == {"float32", "float64", "float16"}


@requires_cuda
def test_a_backward_that_syncs_with_the_host_fails_stream_and_its_twin_passes(tmp_path):
    report = run_spec(FIXTURES / "syncs_in_backward.yaml")
    failed = failures_by_check(report)
    assert set(failed) == {"stream"}, describe([r for rows in failed.values() for r in rows])
    assert {r.device for r in failed["stream"]} == {"cuda"}
    assert all("backward failed" in r.message for r in failed["stream"]), failed["stream"][0].message
    # The same spec on the correct op (its backward captures and replays right), and on the broken one declared
    # not capturable: both pass.
    declared = spec_variant(tmp_path, "syncs_in_backward", "cuda_graphs: false\n")
    twin = tmp_path / "twin.yaml"
    twin.write_text((FIXTURES / "syncs_in_backward.yaml").read_text().replace("syncs_in_backward", "good"))
    for path in (twin, declared):
        report = run_spec(path)
        stream_rows = [r for r in report.results if r.check == "stream"]
        assert stream_rows and all(r.status == Status.PASS for r in stream_rows), describe(stream_rows)


@no_cuda
@pytest.mark.parametrize("fixture, check", [("default_stream_swish", "stream"), ("disagreeing_swish", "devices")])
def test_cuda_only_check_is_skipped_with_a_reason_without_cuda(fixture, check):
    report = run_spec(CUDA_OPS / f"{fixture}.yaml")
    rows = [r for r in report.results if r.check == check]
    assert rows and all(r.status == Status.SKIP and "CUDA is not available" in r.message for r in rows)
    assert not report.failed, describe([r for r in report.results if r.status.failed])


@no_cuda
@pytest.mark.parametrize("fixture", ["unguarded_swish", "unguarded_launch_swish"])
def test_multi_gpu_is_skipped_with_a_reason_without_cuda(fixture):
    report = run_spec(CUDA_OPS / f"{fixture}.yaml")
    rows = [r for r in report.results if r.check == "multi_gpu"]
    assert rows and all(r.status == Status.SKIP and "CUDA is not available" in r.message for r in rows)


def test_multi_gpu_with_one_gpu_skips_and_says_why():
    from opforge.checks.multi_gpu import far_device
    from opforge.core.outcomes import CheckSkipped

    for visible in (0, 1):
        with pytest.raises(CheckSkipped, match=f"needs 2 GPUs .*, {visible} visible"):
            far_device(visible)
    assert str(far_device(4)) == "cuda:3"


def test_multi_gpu_flags_a_result_on_another_device_than_the_inputs():
    import torch

    from opforge.checks.multi_gpu import require_device
    from opforge.core.outcomes import CheckFailure

    require_device("result", torch.ones(3), torch.device("cpu"))
    wrong_device = r"expected the result on the input's device cpu, got one on meta.*CUDAGuard"
    with pytest.raises(CheckFailure, match=wrong_device):
        require_device("result", torch.empty(3, device="meta"), torch.device("cpu"))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "expanded"])
def test_multi_gpu_moves_inputs_with_their_exact_strides(layout):
    # expanded (stride 0): found by `opforge fuzz --device cuda`, whose devices oracle could not copy one.
    import torch

    from opforge.cases.arguments import CaseInputs, in_layout
    from opforge.checks.op_and_reference import on_device

    x = in_layout(torch.arange(35.0, dtype=torch.float64).reshape(5, 7), layout, torch.float32, "cpu")
    moved = on_device(CaseInputs((x, 0.5), {}, (), {}, ("x",)), torch.device("cpu")).args
    assert moved[0].stride() == x.stride() and moved[0].equal(x) and moved[0].data_ptr() != x.data_ptr()
    assert moved[1] == 0.5


requires_two_gpus = pytest.mark.skipif(__import__("torch").cuda.device_count() < 2, reason="needs two GPUs")


@requires_two_gpus
def test_kernel_without_a_device_guard_fails_multi_gpu():
    report = run_spec(CUDA_OPS / "unguarded_swish.yaml")
    failed = failures_by_check(report)
    assert {r.device for r in failed["multi_gpu"]} == {"cuda"}
    assert "devices" not in failed and "correctness" not in failed, "on one GPU the bug does not show"


@requires_two_gpus
def test_kernel_launched_on_the_wrong_gpu_fails_multi_gpu(tmp_path):
    """Output on the right GPU, kernel on the wrong one: it faults (a sticky CUDA error), so it runs isolated, where
    the fault ends one worker and every case is the op's failure."""
    import json

    from typer.testing import CliRunner

    from opforge.cli import app

    path = tmp_path / "report.json"
    CliRunner().invoke(
        app, ["check", str(CUDA_OPS / "unguarded_launch_swish.yaml"), "--check", "multi_gpu", "--json", str(path)]
    )
    rows = json.loads(path.read_text())["ops"][0]["results"]
    assert rows and {r["status"] for r in rows} == {"fail"}, rows


@requires_two_gpus
def test_guarded_kernels_pass_multi_gpu():
    report = run_spec(REPO / "specs" / "leaky_swish.yaml", checks=("multi_gpu",), devices=("cuda",))
    rows = [r for r in report.results if r.check == "multi_gpu"]
    assert rows and not report.failed, describe([r for r in rows if r.status.failed])


@requires_cuda
def test_leak_fails_memory_on_cuda_by_allocated_bytes():
    failed = failures_by_check(run_spec(FIXTURES / "leaks_outputs.yaml", devices=("cuda",)))
    assert {r.device for r in failed["memory"]} == {"cuda"}
    assert all("bytes stayed allocated" in r.message for r in failed["memory"])


@requires_cuda
def test_kernel_on_the_legacy_default_stream_fails_stream():
    report = run_spec(CUDA_OPS / "default_stream_swish.yaml")
    failed = failures_by_check(report)
    assert {r.device for r in failed["stream"]} == {"cuda"}
    assert all("caller's stream order" in r.message for r in failed["stream"]), failed["stream"][0].message
    assert "correctness" not in failed, "on the default stream alone the bug does not show"


@requires_cuda
def test_a_side_stream_run_whose_inputs_were_written_before_the_launch_judges_nothing(monkeypatch):
    # Seen on an H200 under `pytest -n 8`: the host was descheduled past the producer's wait, the default-stream
    # kernel read written inputs, and its side-stream run passed. Here the host waits past the producer each time.
    from opforge.checks import stream

    call = stream.with_arguments

    def late(*args, **kwargs):
        time.sleep(1.0)  # longer than every wait in stream.PRODUCER_SLEEPS_S
        return call(*args, **kwargs)

    monkeypatch.setattr(stream, "with_arguments", late)
    report = run_spec(CUDA_OPS / "clean_swish.yaml", checks=("stream",), dtypes=("float32",))
    results = [r for r in report.results if r.check == "stream" and r.implementation == "native"]
    assert results and all(r.status == Status.ERROR for r in results), [(r.status, r.message) for r in results]
    assert all("stream order was not tested" in r.message for r in results)


def test_the_stream_check_looks_at_its_producer_after_the_launches_and_before_the_wait(monkeypatch):
    # The wait for the op's kernels idles every stream: a producer looked at after it is always done, and every
    # side-stream run judged nothing (an H100, 2026-12-07: each stream result an ERROR, the default-stream kernel
    # unflagged). So the look comes between the op's return and that wait.
    from opforge.building.op import Implementation
    from opforge.cases.arguments import CaseInputs
    from opforge.checks import op_and_reference

    order: list[str] = []
    monkeypatch.setattr(op_and_reference, "wait_for_cuda_kernels", lambda inputs: order.append("wait"))
    monkeypatch.setattr(op_and_reference, "pending_launch_error", lambda inputs: None)
    implementation = Implementation("native", lambda x: order.append("op") or x, None)
    inputs = CaseInputs((1.0,), {}, (1.0,), {}, ())
    op_and_reference.call_implementation(implementation, inputs, lambda: order.append("producer looked at"))
    assert order == ["op", "producer looked at", "wait"]


def test_a_side_stream_run_that_judged_nothing_still_leaves_the_capture_its_say(monkeypatch):
    # syncing_swish reads .item() inside its call: the producer is done by the look after its launches, so no
    # side-stream run is judged (an H100, 2026-12-07), and only the CUDA-graph capture, which refuses the
    # synchronization, flags it. Without a capture the result is the ERROR, never a pass.
    from types import SimpleNamespace

    from opforge.checks import stream
    from opforge.core.outcomes import CheckFailure

    def refused(*args):
        raise CheckFailure("capture: operation not permitted when stream is capturing")

    monkeypatch.setattr(stream, "_on_side_streams", lambda *args: False)
    monkeypatch.setattr(stream, "_in_cuda_graph", refused)
    for claims_graphs, raised, said in [(True, CheckFailure, "not permitted"), (False, RuntimeError, "not tested")]:
        ctx = SimpleNamespace(loaded=SimpleNamespace(spec=SimpleNamespace(cuda_graphs=claims_graphs)))
        with pytest.raises(raised, match=said):
            stream.stream(ctx, None, None)


@requires_cuda
def test_stream_says_an_op_wrong_on_every_stream_is_not_a_stream_order_bug():
    failed = failures_by_check(run_spec(CUDA_OPS / "disagreeing_swish.yaml", checks=("stream",)))
    assert failed["stream"], "a wrong CUDA kernel fails the side-stream run"
    for row in failed["stream"]:
        assert "wrong on the current stream too" in row.message and "stream order" not in row.message, row.message


@requires_cuda
def test_cuda_kernel_that_disagrees_with_its_cpu_kernel_fails_devices():
    # The CUDA kernel is wrong, so every CUDA check that compares with the reference (correctness, stream) may fail
    # too; the CPU kernel is right.
    report = run_spec(CUDA_OPS / "disagreeing_swish.yaml")
    assert {r.device for r in failures_by_check(report)["devices"]} == {"cuda"}
    cpu = [r for r in report.results if r.device == "cpu"]
    assert cpu and all(r.status == Status.PASS for r in cpu), describe([r for r in cpu if r.status != Status.PASS])


@requires_cuda
def test_int32_indexing_kernel_fails_large_index():
    report = run_spec(CUDA_OPS / "int32_index_swish.yaml", opt_ins=OptIns.of(large=True))
    rows = [r for r in report.results if r.check == "large_index"]
    assert len(rows) == 1, describe(rows)
    if rows[0].status == Status.SKIP:
        pytest.skip(f"large_index could not run here: {rows[0].message}")
    assert rows[0].status == Status.FAIL and "Index with int64_t" in rows[0].message, describe(rows)
    assert "stream" not in failures_by_check(report)


def test_large_index_is_opt_in():
    report = run_spec(CUDA_OPS / "int32_index_swish.yaml", checks=("large_index",))
    assert [(r.status, r.case_id) for r in report.results] == [(Status.SKIP, "float16-cuda-contiguous-x=2147487747")]
    assert report.results[0].message.startswith("opt-in:") and "--large" in report.results[0].message


@no_cuda
def test_large_index_asked_for_without_cuda_is_skipped_with_the_reason():
    report = run_spec(CUDA_OPS / "int32_index_swish.yaml", checks=("large_index",), opt_ins=OptIns.of(large=True))
    assert report.results and all(
        r.status == Status.SKIP and "CUDA is not available" in r.message for r in report.results
    )


def _small_index_limit() -> int:
    """broken_ops' stand-in for 2^31 (importable once a fixture spec is loaded)."""
    import importlib

    load_op(load_spec(FIXTURES / "wrong_past_limit.yaml"))
    return importlib.import_module("broken_ops").SMALL_INDEX_LIMIT


def _small_index_job(implementation, shape=(10_000,)):
    from opforge.core.protocol import LargeIndexJob

    return LargeIndexJob(
        spec=str(FIXTURES / "wrong_past_limit.yaml"),
        implementation=implementation,
        seed=0,
        dtype="float32",
        device="cpu",
        shapes=(("x", shape),),
        values=(),
        boundary=_small_index_limit(),
        window=512,
    )


@pytest.mark.slow
def test_large_index_child_compares_the_elements_past_the_boundary(tmp_path, monkeypatch):
    from opforge.checks.large_index import run_in_child

    # The child starts as the engine's workers do (opforge.core.child): an `opforge/` in the cwd does not shadow opforge
    # (`python -m` put the cwd first, and this child then died before it ran the op).
    (tmp_path / "opforge").mkdir()
    (tmp_path / "opforge" / "__init__.py").write_text("raise SystemExit('the cwd shadowed opforge')\n")
    monkeypatch.chdir(tmp_path)
    assert run_in_child(_small_index_job("good")) is None
    failure = run_in_child(_small_index_job("native"))
    assert failure is not None and failure.mismatch.index[0] >= _small_index_limit()
    assert f"around index {_small_index_limit()}" in failure.message


@pytest.mark.slow
def test_large_index_child_that_faults_is_the_ops_failure_and_the_run_goes_on():
    from opforge.checks.large_index import run_in_child

    failure = run_in_child(_small_index_job("faults"))
    assert failure is not None and "SIGSEGV" in failure.message and "child process" in failure.message


@pytest.mark.slow
def test_large_index_child_fails_an_output_shorter_than_the_inputs():
    from opforge.checks.large_index import run_in_child

    failure = run_in_child(_small_index_job("short"))
    assert failure is not None and failure.message.startswith("result: expected shape (10000,)")
    assert f"got ({_small_index_limit()},)" in failure.message


@pytest.mark.slow
def test_large_index_child_that_runs_out_of_memory_in_the_op_is_skipped():
    from opforge.checks.large_index import run_in_child
    from opforge.core.outcomes import CheckSkipped

    with pytest.raises(CheckSkipped, match="out of memory on cpu while the op ran"):
        run_in_child(_small_index_job("oom"))


@pytest.mark.slow
def test_large_index_child_that_breaks_outside_the_op_is_an_error_with_where():
    from dataclasses import replace

    from opforge.checks.large_index import run_in_child
    from opforge.core.outcomes import ReferenceFailure

    with pytest.raises(ReferenceFailure, match=r"child process failed: StopIteration.*\(at large_index_child.py:\d+"):
        run_in_child(replace(_small_index_job("good"), implementation="no_such_implementation"))


def test_large_index_child_time_limit_fits_in_the_task_s_limit():
    from opforge.checks.large_index import CHILD_TIMEOUT_S, TASK_MARGIN_S, child_time_limit

    assert child_time_limit(None) == CHILD_TIMEOUT_S
    assert child_time_limit(600) == CHILD_TIMEOUT_S
    assert child_time_limit(60) == 60 - TASK_MARGIN_S
    assert child_time_limit(8) == 4


@pytest.mark.slow
def test_large_index_child_skips_when_memory_is_short():
    from opforge.checks.large_index import run_in_child
    from opforge.core.outcomes import CheckSkipped

    with pytest.raises(CheckSkipped, match="not enough memory on cpu"):
        run_in_child(_small_index_job("good", shape=(2**45,)))


def test_large_index_child_that_hangs_or_dies_early_is_reported():
    from opforge.checks.large_index import verdict
    from opforge.core.outcomes import ReferenceFailure
    from opforge.core.protocol import Running

    hung = verdict([Running()], None, "", 600)
    assert "did not finish within 600 s" in hung.message
    with pytest.raises(ReferenceFailure, match="before it ran the op"):
        verdict([], 1, "ImportError: no module named x", 600)


def test_a_large_index_child_that_dies_in_the_middle_of_a_message_is_judged_by_what_it_said_last():
    from opforge.checks.large_index import verdict
    from opforge.core.protocol import Outcome, Running, decode_stream, encode
    from opforge.core.results import Status, Verdict

    said = (encode(Running()) + encode(Outcome(Verdict(Status.PASS)))[:12]).encode()
    messages, cut = decode_stream(said)
    assert messages == [Running()] and cut == '{"kind": "ou'
    failure = verdict(messages, -11, "Fatal Python error: Segmentation fault", 600, cut)
    assert "ended with SIGSEGV" in failure.message and "Fatal Python error" in failure.message
    assert 'died in the middle of a message to opforge: {"kind": "ou' in failure.message


@requires_cuda
def test_special_values_reach_every_row_of_a_cuda_input(tmp_path):
    """The rows' positions are an index tensor: on a CUDA input they must go to its device (index_put_ refuses a
    CPU index into a CUDA tensor, which made every CUDA special_values result an ERROR once)."""
    path = spec_variant(tmp_path, "good", "devices: [cpu, cuda]\n")
    report = run_spec(path, checks=("special_values",), devices=("cuda",))
    cuda = [r for r in report.results if r.device == "cuda"]
    assert cuda and all(r.status == Status.PASS for r in cuda), describe(cuda)
