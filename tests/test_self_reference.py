"""A spec without `reference:` is checked against the op itself on contiguous float64 copies of its inputs
(opforge.building.self_reference): layouts, offsets, other dtypes, compile and special values are judged against that
call; the call itself is never a meaningless pass."""

from __future__ import annotations

from pathlib import Path

from helpers import FIXTURES, run_spec

from opforge.core.results import Status

RECORD = FIXTURES / "record"


def without_reference(tmp_path: Path, fixture: str) -> Path:
    """A copy of a broken_ops fixture with its `reference:` line taken out, loading broken_ops from the fixtures."""
    text = (FIXTURES / f"{fixture}.yaml").read_text()
    kept = [line for line in text.splitlines() if not line.startswith("reference:")]
    assert len(kept) == len(text.splitlines()) - 1
    path = tmp_path / f"{fixture}.yaml"
    path.write_text("\n".join(kept).replace("load:\n", f"load:\n  path: [{FIXTURES}]\n", 1) + "\n")
    return path


def rows(report, check: str, implementation: str = "native") -> dict[Status, set[str]]:
    found: dict[Status, set[str]] = {}
    for r in report.results:
        if r.check == check and r.implementation == implementation:
            found.setdefault(r.status, set()).add(r.case_id)
    return found


def test_a_correct_op_passes_and_its_own_reference_call_is_skipped_not_passed(tmp_path):
    report = run_spec(without_reference(tmp_path, "good"), seed=0)
    bad = [(r.full_id, r.message) for r in report.results if r.status not in (Status.PASS, Status.SKIP)]
    assert not bad, bad
    correctness = rows(report, "correctness")
    # Exactly the float64 contiguous cases are the reference's own call: skipped, with the reason.
    assert correctness[Status.SKIP] == {
        "float64-cpu-contiguous-x=0d",
        "float64-cpu-contiguous-x=0",
        "float64-cpu-contiguous-x=7",
        "float64-cpu-contiguous-x=5x6",
    }
    skipped = next(r for r in report.results if r.check == "correctness" and r.status == Status.SKIP)
    assert "the op itself on contiguous float64" in skipped.message and "no `reference:`" in skipped.message
    # The float64 offset and non-contiguous cases, and every other dtype, are compared with it.
    assert "float64-cpu-offset-x=5x6" in correctness[Status.PASS]
    assert "float64-cpu-transposed-x=5x6" in correctness[Status.PASS]
    passed = next(r for r in report.results if r.check == "correctness" and r.case_id == "float32-cpu-strided-x=5x6")
    assert passed.detail == "compared with the op itself on contiguous float64"
    # special_values on the reference's own call judged crashes and hangs only, and says so.
    own = [r for r in report.results if r.check == "special_values" and r.dtype == "float64"]
    assert own and all("no value compared" in r.message for r in own)


def test_an_op_that_reads_strides_as_contiguous_fails_correctness_on_exactly_the_noncontiguous_cases(tmp_path):
    report = run_spec(without_reference(tmp_path, "ignores_strides"), seed=0, checks=("correctness",))
    correctness = rows(report, "correctness")
    assert {c.split("-")[2] for c in correctness[Status.FAIL]} == {"transposed", "strided"}
    assert not any("contiguous" in c.split("-")[2] or "offset" in c for c in correctness[Status.FAIL])
    failed = next(r for r in report.results if r.status == Status.FAIL and r.dtype == "float32")
    assert "differ from the op itself on contiguous float64" in failed.message
    assert "the op itself in float32 on contiguous inputs" in failed.message  # the low-precision baseline


def test_an_op_that_refuses_float64_is_its_own_reference_in_its_widest_claimed_dtype():
    report = run_spec(RECORD / "float32_only.yaml", seed=0)
    bad = [(r.full_id, r.message) for r in report.results if r.status not in (Status.PASS, Status.SKIP)]
    assert not bad, bad
    correctness = rows(report, "correctness")
    assert correctness[Status.SKIP] == {"float32-cpu-contiguous-x=7", "float32-cpu-contiguous-x=5x6"}
    skipped = next(r for r in report.results if r.status == Status.SKIP)
    assert "the op itself on contiguous float32 (it raises in float64)" in skipped.message
    assert "float16-cpu-transposed-x=5x6" in correctness[Status.PASS]


def test_a_float64_result_that_is_not_the_claimed_dtypes_result_is_not_the_reference():
    """An op that reads float64 bytes as float32 (fbgemm's quantize does) runs in float64 but returns garbage there:
    the reference falls back to its claimed float32, and the dtypes check reports float64 as wrong values."""
    from opforge.building.op import load_op
    from opforge.loading.spec import load_spec

    loaded = load_op(load_spec(RECORD / "float32_only.yaml"))
    own = loaded.self_reference
    assert own is not None
    import torch

    own.overload = torch.ops.reclib.reads_float64_as_float32.default
    x = torch.linspace(-1, 1, 12, dtype=torch.float64)
    result = own(x)
    assert own.last_dtype == "float32" and "is not its float32 one" in own.last_fallback_reason
    assert torch.allclose(result, (x.float() * 3).double())


def test_the_self_equal_predicate_needs_the_same_dtype_layout_and_offset():
    import torch

    from opforge.building.op import load_op
    from opforge.loading.spec import load_spec

    loaded = load_op(load_spec(RECORD / "reads_contiguous.yaml"))
    own = loaded.self_reference
    x = torch.rand(4, 6, dtype=torch.float64)
    own(x)
    assert own.same_call((x,), {}, (x,), {})
    assert not own.same_call((x.t().contiguous().t(),), {}, (x,), {})  # transposed
    assert not own.same_call((torch.rand(25, dtype=torch.float64)[1:].view(4, 6),), {}, (x,), {})  # offset
    assert not own.same_call((x.float(),), {}, (x,), {})  # another dtype


def test_a_spec_with_a_reference_still_says_the_reference():
    report = run_spec(FIXTURES / "ignores_strides.yaml", seed=0, checks=("correctness",))
    failed = next(r for r in report.results if r.status == Status.FAIL)
    assert "differ from the reference beyond tolerance" in failed.message
    assert not any(r.status == Status.SKIP for r in report.results)


def test_an_op_that_mutates_its_argument_is_compared_by_the_new_value_and_another_implementation_against_it(tmp_path):
    """The op itself returns the mutated argument's new value as a reference does; an extra implementation is
    compared with the op, never skipped (its call is not the reference's)."""
    report = run_spec(without_reference(tmp_path, "scale_"), seed=0, checks=("correctness",))
    native, wrong = rows(report, "correctness"), rows(report, "correctness", "wrong")
    assert Status.FAIL not in native and len(native[Status.SKIP]) == 8  # float64 contiguous: 4 shapes x 2 values
    assert Status.SKIP not in wrong and len(wrong[Status.FAIL]) == 30
    failed = next(r for r in report.results if r.status == Status.FAIL)
    assert failed.message.startswith("x (mutated): ") and "the op itself on contiguous" in failed.message
