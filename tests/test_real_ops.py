"""Ops written elsewhere (tests/fixtures/real_ops: a float32-only op with an out= overload, an LSTM cell on matrix
multiplies, NMS, RoIAlign, a reduction, low-precision composites): each correct one passes, each broken twin still
fails on the check its bug is for. The checks named are the ones that gave false positives before the rules they
exercise (low-precision comparison, float32 gradcheck, per-input layouts and special values, generators)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from helpers import FIXTURES, describe, failures_by_check, requires_cuda, run_spec, run_spec_isolated

from opforge.core.results import Status

# The quick tier (`pytest -m "not slow"`) leaves these out. Whole specs of ops written elsewhere, C++ built.
pytestmark = pytest.mark.slow

REAL = FIXTURES / "real_ops"

# (spec, the checks it is run with): each must pass every row.
CORRECT = [
    ("scaled_tanh", ("correctness", "gradcheck", "grad_lowp", "opcheck")),
    ("scaled_tanh_out", ("correctness", "error_inputs", "opcheck")),
    ("lstm_cell", ("correctness", "grad_lowp", "special_values", "dtypes", "gradcheck")),
    ("nms", ("correctness", "opcheck", "dtypes")),
    ("roi_pool_avg", ("correctness", "special_values", "gradcheck", "grad_lowp")),
    ("row_sum", ("correctness", "special_values", "grad_lowp")),
    ("swish_composite", ("correctness", "grad_lowp", "special_values", "dtypes")),
    ("mul_sin", ("correctness", "grad_lowp", "special_values", "gradcheck")),
]
# (twin, the checks that must flag it, the checks it is run with, the cases: a -k keyword or None for all)
TWINS = [
    ("scaled_tanh_wrong_grad", {"gradcheck", "grad_lowp"}, ("gradcheck", "grad_lowp"), None),
    ("lstm_cell_no_forget_gate", {"correctness"}, ("correctness",), None),
    ("nms_wrong_boundary", {"correctness"}, ("correctness",), None),
    ("roi_pool_avg_batch0", {"correctness"}, ("correctness",), None),
    ("swish_composite_overflow", {"correctness"}, ("correctness",), None),
    ("swish_composite_upcast", {"correctness"}, ("correctness",), None),
    # One case: a failing gradcheck of the 33x65 cases recomputes whole Jacobians for its message (60 s on CI).
    ("mul_sin_float32_compute", {"gradcheck"}, ("gradcheck",), "a=7-b=7"),
]


def _unexpected(report) -> list:
    return [r for r in report.results if r.status.failed]


def _crashes_on_number_messages() -> bool:
    """Whether this machine's toolchain kills a process whose TORCH_CHECK message formats a number (`opforge doctor`'s
    probe; seen on the H200 image): a third-party op's error path then crashes, through no fault of opforge's."""
    from opforge.tools import doctor

    return doctor._extension_messages().level == doctor.Level.WARN


@pytest.mark.parametrize("spec, checks", CORRECT, ids=[c[0] for c in CORRECT])
def test_a_correct_op_written_elsewhere_passes(spec, checks):
    # error_inputs runs the op's error paths: in a worker, so that a crash there is a result, not this test process.
    run = run_spec_isolated if "error_inputs" in checks else run_spec
    report = run(REAL / f"{spec}.yaml", checks=checks, devices=("cpu",))
    crashed = [r for r in report.results if r.status == Status.CRASH]
    if crashed and _crashes_on_number_messages():
        why = "this toolchain crashes on TORCH_CHECK messages with numbers (opforge doctor)"
        pytest.xfail(f"{why}: {describe(crashed)}")
    assert not _unexpected(report), describe(_unexpected(report))
    ran = {r.check.split(":", 1)[0] for r in report.results if r.status == Status.PASS}
    assert ran == set(checks), f"{spec}: no passing row of {set(checks) - ran}"


@pytest.mark.parametrize("twin, flagged_by, checks, keyword", TWINS, ids=[t[0] for t in TWINS])
def test_its_broken_twin_still_fails_on_the_right_check(twin, flagged_by, checks, keyword):
    report = run_spec(REAL / f"{twin}.yaml", checks=checks, devices=("cpu",), keyword=keyword)
    errors = [r for r in report.results if r.status == Status.ERROR]
    assert not errors, describe(errors)
    missing = flagged_by - failures_by_check(report).keys()
    assert not missing, f"{twin}: expected {sorted(missing)} to fail"


def test_a_float32_only_op_is_gradchecked_in_float32():
    report = run_spec(REAL / "scaled_tanh.yaml", checks=("gradcheck",))
    assert report.results and {r.dtype for r in report.results} == {"float32"}


def test_a_low_precision_failure_says_which_rule_decided_and_shows_both_errors():
    failed = failures_by_check(
        run_spec(REAL / "swish_composite_overflow.yaml", checks=("correctness",), dtypes=("float16",))
    )
    message = failed["correctness"][0].message
    assert "beyond tolerance, and its RMS error" in message and "the reference computed in float16" in message
    mismatch = next(r.mismatch for r in failed["correctness"] if r.mismatch is not None)
    assert mismatch.rms_error is not None and mismatch.baseline_rms_error is not None


def test_an_input_with_its_own_layouts_stays_contiguous_in_the_others_cases():
    report = run_spec(REAL / "scaled_tanh_out.yaml", checks=("correctness",))
    layouts = {r.case_id.split("-")[2] for r in report.results}
    # x takes every layout; the out= argument, which the op requires contiguous, stays contiguous in all of them.
    assert {"contiguous", "transposed", "strided", "channels_last"} <= layouts
    assert not _unexpected(report), describe(_unexpected(report))


def test_a_generator_makes_valid_inputs_reproducible_from_the_case_seed():
    from opforge.cases.matrix import build_matrix
    from opforge.checks.op_and_reference import argument, inputs_for
    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    loaded = load_checked(load_spec(REAL / "roi_pool_avg.yaml"))
    case = next(c for c in build_matrix(loaded.spec, ("float32",), ("cpu",)) if dict(c.shapes)["rois"] == (9, 5))

    def rois(seed: int):
        return argument(inputs_for(loaded, case, seed), loaded, "rois")

    made = rois(0)
    assert made.shape == (9, 5) and set(made[:, 0].tolist()) <= {0.0, 1.0}  # batch indices of the features
    assert (made[:, 3] > made[:, 1]).all() and (made[:, 4] > made[:, 2]).all()  # x2 > x1, y2 > y1
    assert made.equal(rois(0)) and not made.equal(rois(1))


@requires_cuda
def test_a_reduction_summed_in_another_order_on_the_gpu_passes_devices():
    report = run_spec(REAL / "row_sum.yaml", checks=("devices", "correctness"))
    assert not _unexpected(report), describe(_unexpected(report))


@requires_cuda
def test_a_cuda_reduction_that_drops_the_tail_still_fails_devices():
    failed = failures_by_check(run_spec(REAL / "row_sum_drops_tail.yaml", checks=("devices", "correctness")))
    assert {"devices", "correctness"} <= failed.keys()


def _variant(tmp_path, spec: str, extra_yaml: str):
    """A copy of a real_ops spec in tmp_path with more YAML, its sources and module still those of real_ops (the
    same library: no second build)."""
    text = (REAL / f"{spec}.yaml").read_text()
    sources = "lstm_cell.cpp, nms.cpp, roi_pool_avg.cpp, row_sum.cpp, row_sum.cu, scaled_tanh.cpp"
    absolute = ", ".join(str(REAL / name) for name in sources.split(", "))
    text = text.replace(f"sources: [{sources}]", f"sources: [{absolute}]\n  path: [{REAL}]")
    path = tmp_path / f"{spec}.yaml"
    path.write_text(text + extra_yaml)
    return path


def test_a_claimed_double_backward_that_is_silently_missing_is_reported(tmp_path):
    # scaled_tanh's backward op has no autograd formula: its derivative comes back as nothing, with a warning only.
    path = _variant(tmp_path, "scaled_tanh", "double_backward: true\n")
    failed = failures_by_check(run_spec(path, checks=("gradgradcheck",), dtypes=("float32",)))
    assert failed["gradgradcheck"], "expected gradgradcheck to fail"
    assert all("has no autograd formula" in r.message for r in failed["gradgradcheck"]), failed["gradgradcheck"][0]


def _selfcheck():
    """tests/fixtures/real_ops/selfcheck.py as a module (a script, run by .ci/gpu checks)."""
    spec = importlib.util.spec_from_file_location("realops_selfcheck", REAL / "selfcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("crashes", [True, False], ids=["number_messages_crash", "number_messages_raise"])
def test_selfcheck_calls_an_error_path_whose_message_has_numbers_only_where_that_cannot_crash(monkeypatch, crashes):
    # On the H100 image (2026-12-06) the selfcheck died with SIGSEGV calling scaled_tanh.out with a transposed out: its
    # TORCH_CHECK streams the strides, and that toolchain crashes on such messages (opforge doctor's probe).
    import torch

    selfcheck = _selfcheck()
    monkeypatch.setattr(selfcheck, "number_messages_crash", lambda: crashes)
    calls = []

    def out(x, scale, out):
        calls.append(out.stride())
        raise RuntimeError(f"realops::scaled_tanh.out: out must be contiguous, got strides {list(out.stride())}.")

    ops, x = SimpleNamespace(scaled_tanh=SimpleNamespace(out=out)), torch.zeros(33, 65)
    if crashes:
        with pytest.raises(selfcheck.Skip, match="crashes on TORCH_CHECK messages with numbers"):
            selfcheck.rejects_transposed_out(ops, x)
        assert not calls, "the error path ran where it crashes the process"
    else:
        assert selfcheck.rejects_transposed_out(ops, x).startswith("a transposed out is rejected")
        assert calls == [(1, 33)]
