"""Round two of ops written elsewhere (tests/fixtures/outside_ops): each correct op passes the check its corner of
opforge once flagged it in, each twin still fails it; and the spec features real ops need (samples, xfail by layout
and case, per-device dtypes) with their spec errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import FIXTURES, describe, failures_by_check, run_spec, variant_of

from opforge.building.op import load_op
from opforge.core.errors import SpecError
from opforge.core.results import Status
from opforge.loading.spec import load_spec

OUTSIDE = FIXTURES / "outside_ops"


def outside_variant(tmp_path: Path, fixture: str, replace: dict[str, str] | None = None, extra: str = "") -> Path:
    """A copy of an outside_ops spec (text replaced, YAML appended) beside a copy of its module."""
    return variant_of(tmp_path, OUTSIDE, "outside.py", fixture, replace, extra)


def statuses(report, check: str) -> dict[str, Status]:
    return {r.case_id: r.status for r in report.results if r.check == check}


# ---------------------------------------------------------------------------------------------- determinism


def test_a_sum_split_by_thread_count_is_deterministic_run_to_run():
    """chunked_row_sum adds one chunk per thread: other bits on 1 thread than on 2, the same bits every run on
    either. determinism compares runs, not thread counts (torch promises no thread-count invariance)."""
    import sys

    sys.path.insert(0, str(OUTSIDE))
    import outside

    x = torch.rand(33, 65, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        on_one = outside.chunked_row_sum(x)
        torch.set_num_threads(max(2, threads))  # a test worker may have been given one
        on_several = outside.chunked_row_sum(x)
        assert not torch.equal(on_several, on_one), "the fixture must depend on the thread count to show anything"
        report = run_spec(OUTSIDE / "chunked_row_sum.yaml", checks=("determinism",))
    finally:
        torch.set_num_threads(threads)
    assert statuses(report, "determinism") and not report.failed, describe(report.results)


# ------------------------------------------------------------------------------------------- special values


def test_a_plain_order_row_sum_passes_special_values():
    """max and -max no longer meet in one row, where their cancellation depends on the order of the sum."""
    report = run_spec(OUTSIDE / "row_sum.yaml", checks=("special_values",))
    assert len(statuses(report, "special_values")) == 8 and not report.failed, describe(report.results)


def test_a_matmul_like_op_passes_special_values_with_the_extremes():
    """A correct grouped conv (windows times weights) with max and -max left in: they reach head and tail only,
    one sign per call, so no partial sum overflows on the way to a finite total in one order and not another."""
    report = run_spec(OUTSIDE / "conv1d.yaml", checks=("special_values",))
    assert statuses(report, "special_values") and not report.failed, describe(report.results)


def test_a_nan_swallowing_row_sum_fails_special_values_in_rows_past_the_head():
    """NaN reaches every row; in the head row it sits beside both infinities (NaN whatever the op does)."""
    failed = failures_by_check(run_spec(OUTSIDE / "row_sum_skips_nan.yaml", checks=("special_values",)))
    shapes = {r.case_id.rsplit("-", 1)[-1] for r in failed["special_values"]}
    assert shapes == {"x=5x7", "x=33x65", "x=5x300"}
    assert all(r.mismatch is not None for r in failed["special_values"]), "each failure shows its worst mismatch"


# ------------------------------------------------------------------------------------------ default layouts


def test_a_spec_without_layouts_reaches_a_fakes_strides():
    """softsign_like_fake's fake is empty_like(x) for a kernel that returns a contiguous tensor: only a transposed
    or channels_last input tells them apart, and a spec that names no layouts gets both."""
    failed = failures_by_check(run_spec(OUTSIDE / "softsign_like_fake.yaml"))
    # torch 2.13's opcheck compares the fake's strides with the real output's; 2.11's does not, and compile's
    # runtime stride assertion is what fails there (seen on the H200's torch 2.11).
    assert "compile" in failed and failed.keys() <= {"opcheck:test_faketensor", "compile"}
    assert {r.case_id.split("-")[2] for r in failed["compile"]} == {"transposed", "channels_last"}
    report = run_spec(OUTSIDE / "softsign.yaml")
    assert not report.failed, describe(report.results)
    layouts = {r.case_id.split("-")[2] for r in report.results}
    assert layouts == {"contiguous", "offset", "transposed", "strided", "channels_last"}


def test_layouts_narrow_the_default(tmp_path):
    path = outside_variant(tmp_path, "softsign_like_fake", extra="layouts: [contiguous]\n")
    report = run_spec(path)
    assert not report.failed and {r.case_id.split("-")[2] for r in report.results} == {"contiguous", "offset"}


# ---------------------------------------------------------------------------------------------------- samples


@pytest.mark.slow
def test_samples_give_each_geometry_its_case_and_every_check_runs_on_it():
    report = run_spec(OUTSIDE / "conv1d.yaml")
    assert not report.failed, describe([r for r in report.results if r.status.failed])
    ids = {r.case_id for r in report.results if r.check == "correctness"}
    assert "float32-cpu-contiguous-sample1-x=1x6x16-weight=4x3x5-stride=2-padding=2-groups=2" in ids
    assert any("-transposed-sample2-" in i for i in ids), "layouts apply to a sample's tensors"
    checks = {r.check for r in report.results if r.status == Status.PASS}
    assert {"correctness", "gradcheck", "grad_lowp", "opcheck:test_faketensor", "compile", "special_values"} <= checks


def test_a_padding_bug_fails_only_the_samples_that_pad():
    failed = failures_by_check(run_spec(OUTSIDE / "conv1d_pads_left.yaml", checks=("correctness",)))
    samples = {r.case_id.split("-")[3] for r in failed["correctness"]}
    assert samples == {"sample1", "sample2", "sample3"}  # sample0 has padding 0
    assert all(r.mismatch is not None and "sample" in r.repro for r in failed["correctness"])


@pytest.mark.parametrize(
    "replace, extra, key, got",
    [
        (
            {"  x: {requires_grad: true}": "  x: {requires_grad: true, shapes: [[1, 2, 3]]}"},
            "",
            "inputs.x.shapes",
            "`shapes:`",
        ),
        ({}, "bench: {sizes: [1024]}\n", "bench", "both"),
    ],
    ids=["shapes-beside-samples", "bench-beside-samples"],
)
def test_samples_spec_errors_when_read(tmp_path, replace, extra, key, got):
    path = outside_variant(tmp_path, "conv1d", replace, extra)
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert error.value.key == key and got in str(error.value) and f"{path}:" in str(error.value)


SAMPLE_ERRORS = {
    "missing": ('"groups": groups,', "", "sample 0 to give every schema argument without a default", "no 'groups'"),
    "unknown": (
        '"groups": groups,',
        '"groups": groups, "dilation": 1,',
        "sample 0 to name schema arguments",
        "'dilation'",
    ),
    "not-a-tensor": (
        '"weight": w.to(dtype=dtype, device=device),',
        '"weight": None if stride == 2 else w.to(dtype=dtype, device=device),',
        "a tensor in every sample",
        "NoneType in sample 1",
    ),
}


@pytest.mark.parametrize("name", SAMPLE_ERRORS)
def test_samples_spec_errors_when_loaded(tmp_path, name):
    """A sample function of its own module (the fixture's module is imported once per process)."""
    import inspect
    import sys

    sys.path.insert(0, str(OUTSIDE))
    import outside

    old, new, expected, got = SAMPLE_ERRORS[name]
    module = f"broken_samples_{name.replace('-', '_')}"
    source = inspect.getsource(outside.conv1d_samples).replace(old, new)
    (tmp_path / f"{module}.py").write_text(f"import torch\nfrom outside import CONV1D_GEOMETRIES\n\n{source}")
    path = outside_variant(tmp_path, "conv1d", {"samples: outside:": f"samples: {module}:"})
    with pytest.raises(SpecError) as error:
        load_op(load_spec(path))
    message = str(error.value)
    assert error.value.key == "samples" and expected in message and got in message, message
    assert f"{path}:" in message, "the error names the spec's line"


# ------------------------------------------------------------------------------- xfail by layout and by case


def test_xfail_by_layout_covers_exactly_the_failing_layouts(tmp_path):
    """ignores_strides is wrong on transposed and strided inputs only: an xfail on noncontiguous layouts ends in
    xfail results there and plain passes elsewhere, not XPASS."""
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    path = tmp_path / "ignores_strides.yaml"
    xfail = "xfail:\n  - {check: correctness, layout: noncontiguous, reason: reads x as if contiguous}\n"
    path.write_text((FIXTURES / "ignores_strides.yaml").read_text() + xfail)
    report = run_spec(path, checks=("correctness",))
    assert not report.failed, describe([r for r in report.results if r.status.failed])
    by_layout = {(r.case_id.split("-")[2], r.status) for r in report.results}
    assert {layout for layout, status in by_layout if status == Status.XFAIL} == {"transposed", "strided"}


def test_xfail_by_case_glob(tmp_path):
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    path = tmp_path / "ignores_strides.yaml"
    xfail = "xfail:\n  - {check: correctness, case: '*-transposed-*', reason: reads x as if contiguous}\n"
    path.write_text((FIXTURES / "ignores_strides.yaml").read_text() + xfail)
    report = run_spec(path, checks=("correctness",))
    failed = {r.case_id.split("-")[2] for r in report.results if r.status == Status.FAIL}
    assert failed == {"strided"}
    assert {r.case_id.split("-")[2] for r in report.results if r.status == Status.XFAIL} == {"transposed"}


# ---------------------------------------------------------------------------------------- per-device dtypes


def test_per_device_dtypes_claim_each_devices_own(tmp_path):
    path = outside_variant(
        tmp_path, "row_sum", {"dtypes: [float64, float32]": "dtypes: {cpu: [float64], cuda: [float32, float16]}"}
    )
    spec = load_spec(path)
    assert spec.devices == ("cpu", "cuda") and spec.dtypes_on("cpu") == ("float64",)
    report = run_spec(path, checks=("correctness",))
    assert {r.dtype for r in report.results if r.device == "cpu"} == {"float64"}
    assert {r.dtype for r in report.results if r.status == Status.SKIP} <= {"float32", "float16"}


def test_per_device_dtypes_name_exactly_the_specs_devices(tmp_path):
    path = outside_variant(
        tmp_path, "row_sum", {"dtypes: [float64, float32]": "devices: [cpu]\ndtypes: {cpu: [float64], cuda: [float32]}"}
    )
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert error.value.key == "dtypes" and "each of the spec's devices (cpu)" in str(error.value)


# ----------------------------------------------------------------------------------------- the dtypes note


def test_an_unclaimed_dtype_works_only_when_every_case_passes():
    """row_sum_half_in_half adds float16 in float16: right on a 7-element row, within two units of roundoff on
    65-element rows (compare.roundoff_error), off on the 300-element ones. The note says how close it came instead
    of "works"; float32-accumulating int dtypes do work everywhere."""
    report = run_spec(OUTSIDE / "row_sum_half_in_half.yaml", checks=("dtypes",))
    notes = {r.case_id.split("-")[0]: r.message for r in report.results if r.message}
    assert "fails 4 of the spec's 15 cases" in notes["float16"] and "float16-cpu-contiguous-x=5x300" in notes["float16"]
    assert "works on all 15 cases of the spec" in notes["int64"]
    assert not report.failed
