"""The compile check says what a failed data-dependent size check (`u0 >= 2`) means and what to do."""

from __future__ import annotations

import shutil

from helpers import FIXTURES, describe, run_spec

from opforge.core.results import Status

MIN_TWO = FIXTURES / "unbacked_min_two.yaml"


def test_a_fake_size_with_minimum_two_fails_compile_with_the_hint():
    (row,) = run_spec(MIN_TWO).results
    assert row.status == Status.FAIL, describe([row])
    assert "RuntimeError: u0 >= 2" in row.message, row.message
    assert "a data-dependent size (u0, an unbacked SymInt) with a lower bound of 2" in row.message
    assert "ctx.create_unbacked_symint() (deprecated) has a minimum of 2" in row.message
    assert "torch.library.get_ctx().new_dynamic_size() (minimum 0)" in row.message


def test_the_same_op_with_a_minimum_of_zero_passes_compile(tmp_path):
    shutil.copy(FIXTURES / "data_dependent_size_ops.py", tmp_path)
    twin = tmp_path / "unbacked_min_zero.yaml"
    twin.write_text(MIN_TWO.read_text().replace("nonzero_min_two", "nonzero_min_zero"))
    (row,) = run_spec(twin).results
    assert row.status == Status.PASS, describe([row])


def test_other_compile_errors_get_no_size_hint():
    from opforge.core.outcomes import unbacked_size_hint

    # A guard in the compiled code itself (a branch on a data-dependent value) is another failure with another fix.
    message = "Could not guard on data-dependent expression u0 >= 2 (unhinted: u0 >= 2)"
    assert unbacked_size_hint(RuntimeError(message)) == ""
    assert unbacked_size_hint(RuntimeError("u0 >= 0 and something else")) == ""
