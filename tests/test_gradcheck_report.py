"""gradcheck's failure names the worst Jacobian entry: which output and input, where in each, numerical against
analytical, instead of torch's two whole matrices."""

from __future__ import annotations

import re
import shutil

import pytest
from helpers import FIXTURES, describe, failures_by_check, run_spec

from opforge.core.results import Status

WRONG_ENTRY = FIXTURES / "wrong_gradient_entry.yaml"


def _gradcheck_failures(path, check="gradcheck"):
    report = run_spec(path, checks=(check,))
    errors = [r for r in report.results if r.status == Status.ERROR]
    assert not errors, describe(errors)
    return failures_by_check(report).get(check, [])


def test_a_backward_wrong_in_one_element_is_named_by_its_jacobian_entry():
    failed = _gradcheck_failures(WRONG_ENTRY)
    assert len(failed) == 3, describe(failed)  # contiguous, transposed, strided: the entry is logical, not in memory
    for row in failed:
        assert row.message.startswith(
            "gradcheck failed: Jacobian mismatch for output 0 with respect to input 0 (result with respect to x). "
            "Worst entry, result at (1, 1) with respect to x at (1, 1): expected "
        ), row.message
        assert "1 of 36 entries differ by more than atol 1e-05 + rtol 0.001 * |numerical|" in row.message
        assert "numerical:tensor" not in row.message and row.mismatch is None


def test_the_entry_shows_numerical_against_analytical():
    # The fixture's backward doubles that entry: the analytical value is twice the numerical one.
    failed = _gradcheck_failures(WRONG_ENTRY)
    assert len(failed) == 3, describe(failed)
    for row in failed:
        found = re.search(
            r"expected (\S+) \(numerical: central differences, eps 1e-06\), got (\S+) \(analytical", row.message
        )
        assert found, row.message
        numerical, analytical = float(found.group(1)), float(found.group(2))
        assert analytical == pytest.approx(2 * numerical, rel=1e-5) and numerical != 0


def test_the_correct_twin_passes(tmp_path):
    shutil.copy(FIXTURES / "gradient_entry_ops.py", tmp_path)
    twin = tmp_path / "right_gradient_entry.yaml"
    twin.write_text(WRONG_ENTRY.read_text().replace("wrong_entry", "right_entry"))
    report = run_spec(twin, checks=("gradcheck",))
    assert [r.status for r in report.results] == [Status.PASS] * 3, describe(report.results)


def test_past_the_limit_the_jacobian_is_said_too_large_and_the_vector_jacobian_product_points(monkeypatch):
    from opforge.checks import gradcheck

    monkeypatch.setattr(gradcheck, "JACOBIAN_MAX_ENTRIES", 35)  # the fixture's Jacobian has 6 x 6
    failed = _gradcheck_failures(WRONG_ENTRY)
    assert len(failed) == 3, describe(failed)
    for row in failed:
        assert (
            "Its Jacobian, 6 x 6 entries, is too large to show: opforge computes one of at most 35 entries"
            in row.message
        ), row.message
        assert "Worst entry" not in row.message and "numerical:tensor" not in row.message
        assert row.mismatch is not None and row.mismatch.output == "grad[x]" and row.mismatch.index == (1, 1)


def test_gradgradcheck_names_the_worst_entry_of_the_backwards_jacobian():
    failed = _gradcheck_failures(FIXTURES / "wrong_double_backward.yaml", "gradgradcheck")
    assert failed, "expected gradgradcheck to fail"
    for row in failed:
        assert "(grad[x] with respect to x). Worst entry, grad[x] at (" in row.message, row.message
        assert "numerical:tensor" not in row.message


def test_gradgradcheck_passes_a_correct_double_backward():
    report = run_spec(FIXTURES / "good.yaml", checks=("gradgradcheck",), dtypes=("float64",))
    assert report.results and not report.failed, describe(report.results)
