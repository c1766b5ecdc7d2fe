"""The comparison rules themselves (opforge/cases/compare.py): the fixed tolerance, and the low-precision rule that lets
a composite round as often as eager PyTorch does, but no worse."""

from __future__ import annotations

import math

import pytest

from opforge.cases import compare
from opforge.cases.compare import Baseline, Rule, check_result
from opforge.core.outcomes import CheckFailure
from opforge.spec.model import Tolerance

torch = pytest.importorskip("torch")

FLOAT16 = Tolerance(atol=1e-5, rtol=1e-3)
LOWP = Rule(FLOAT16, lowp=True)


def composite(x, dtype):
    """A chain of four roundings in `dtype`: what an ordinary implementation of x * sigmoid(x) * 3 - x does."""
    v = x.to(dtype)
    return v * torch.sigmoid(v) * 3 - v


def judge(got, reference, eager, rule=LOWP):
    baseline = Baseline("float16", lambda: {"result": eager})
    check_result("result", got, reference, rule, torch.float16, "cpu", baseline=baseline)


@pytest.fixture
def values():
    return torch.linspace(-6, 6, 4099, dtype=torch.float64)


def test_a_composite_as_accurate_as_eager_passes_where_the_fixed_tolerance_fails(values):
    reference = composite(values, torch.float64)
    eager = composite(values, torch.float16)
    fused = reference.to(torch.float16)  # one rounding: better than eager
    judge(eager, reference, eager)
    judge(fused, reference, eager)
    with pytest.raises(CheckFailure, match="elements differ from the reference beyond tolerance"):
        judge(eager, reference, eager, Rule(FLOAT16, lowp=False))


def test_an_op_less_accurate_than_eager_fails_with_the_figures_and_the_worst_element(values):
    reference = composite(values, torch.float64)
    eager = composite(values, torch.float16)
    sloppy = composite(values.to(torch.bfloat16).to(torch.float64), torch.float16)  # inputs rounded to bfloat16
    with pytest.raises(CheckFailure) as failure:
        judge(sloppy, reference, eager)
    message = str(failure.value)
    assert "exceeds the" in message and "allowed by the reference computed in float16" in message
    assert (
        failure.value.mismatch is not None
        and failure.value.mismatch.rms_error > failure.value.mismatch.allowed_rms_error
    )


def test_where_eager_overflows_the_op_may_match_eager_or_the_reference_but_nothing_else():
    # 40000 * 2 overflows float16 (max 65504) in eager; float64 gives 80000, which float16 cannot hold either.
    x = torch.tensor([40000.0, 1.0, -2.0], dtype=torch.float64)
    reference = x * 2
    eager = (x.to(torch.float16) * 2).to(torch.float16)
    assert eager[0].isinf()
    judge(eager, reference, eager)  # the same overflow: identical to eager
    saturating = reference.clamp(max=65504).to(torch.float16)
    with pytest.raises(CheckFailure, match="close to neither"):
        judge(saturating, reference, eager)
    with pytest.raises(CheckFailure, match="close to neither"):
        judge(torch.where(torch.arange(3) == 0, torch.nan, eager), reference, eager)
    wrong_sign = eager.clone()
    wrong_sign[0] = -torch.inf
    with pytest.raises(CheckFailure, match=r"at 1 element\(s\) where the reference computed in float16 is not finite"):
        judge(wrong_sign, reference, eager)


def test_where_eager_overflows_the_remaining_elements_are_still_judged():
    x = torch.tensor([40000.0, 1.0, -2.0, 3.0], dtype=torch.float64)
    reference = x * 2
    eager = (x.to(torch.float16) * 2).to(torch.float16)
    off = eager.clone()
    off[1:] += 0.25  # finite elements off by far more than eager's (exact) result
    with pytest.raises(CheckFailure, match="RMS error"):
        judge(off, reference, eager)


def test_the_infinity_a_float64_result_rounds_to_is_no_error_but_an_overflow_float16_can_hold_is():
    # Found by `opforge fuzz` on affine_leaky_swish: float16's largest is 65504, and 65600 rounds to inf.
    got = torch.tensor([math.inf, 1.0], dtype=torch.float16)

    def fixed_rule(expected):
        check_result(
            "result", got, torch.tensor(expected, dtype=torch.float64), Rule(FLOAT16, lowp=False), torch.float16, "cpu"
        )

    fixed_rule([65600.0, 1.0])
    with pytest.raises(CheckFailure, match="1 of 2 elements differ"):
        fixed_rule([65000.0, 1.0])


def _eight_lane_sum(values):
    """A correct float32 reduction's order: eight lanes summed left to right, then the lanes pairwise."""
    lanes = torch.zeros(8, dtype=torch.float32)
    for row in values.view(-1, 8):
        lanes = lanes + row
    while lanes.numel() > 1:
        lanes = lanes[0::2] + lanes[1::2]
    return lanes[0]


def judge_sum(got, values, terms):
    """A float32 row sum judged against float64 with torch's own float32 sum as the baseline."""
    float32 = Rule(Tolerance(atol=1e-5, rtol=1.3e-6), lowp=True)
    baseline = Baseline("float32", lambda: {"result": values.sum()}, terms)
    check_result("result", got, values.double().sum(), float32, torch.float32, "cpu", baseline=baseline)


def test_a_float32_sum_may_be_off_by_a_plain_order_sums_error_but_not_by_a_lost_term():
    # Found by `opforge fuzz` on tests/fixtures/real_ops/row_sum: torch's cascade sum of equal values is within a few
    # ulps, an eight-lane order 16 times further off (here 0.0076 against 0.00005 on a sum of 800).
    equal = torch.full((8000,), 0.1, dtype=torch.float32)
    judge_sum(_eight_lane_sum(equal), equal, 8000)
    with pytest.raises(CheckFailure, match="exceeds the"):  # judged as an elementwise result, it is not close enough
        judge_sum(_eight_lane_sum(equal), equal, 1)
    signs = torch.rand(8000, generator=torch.Generator().manual_seed(0)).mul(2).sub(1).to(torch.float32)
    judge_sum(_eight_lane_sum(signs), signs, 8000)
    with pytest.raises(CheckFailure, match="exceeds the"):
        judge_sum(_eight_lane_sum(signs) - signs[-1], signs, 8000)


def test_where_eager_breaks_down_into_nan_for_a_finite_reference_the_op_passes_there_but_nowhere_else():
    # Found by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell: float16 gates of magnitude 2^19 overflow in eager.
    reference = torch.tensor([-1.0, 0.5, 0.25], dtype=torch.float64)
    eager = torch.tensor([math.nan, 0.5, 0.25], dtype=torch.float16)
    judge(torch.tensor([-0.0, 0.5, 0.25], dtype=torch.float16), reference, eager)
    with pytest.raises(CheckFailure, match="RMS error"):
        judge(torch.tensor([-0.0, 0.5, 0.125], dtype=torch.float16), reference, eager)


def test_two_units_of_roundoff_pass_however_exact_eager_is_but_four_do_not():
    # Found by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell in float16 (eager exact where h is all 0).
    exact = torch.linspace(1.0, 1.5, 9, dtype=torch.float64).to(torch.float16)
    ulp = torch.finfo(torch.float16).eps
    judge((exact.double() + 2 * ulp).to(torch.float16), exact.double(), exact)
    with pytest.raises(CheckFailure, match="RMS error"):
        judge((exact.double() + 4 * ulp).to(torch.float16), exact.double(), exact)


def test_an_infinite_expected_value_gives_no_infinite_allowance():
    # The roundoff allowances scale with the output's magnitude: an expected -inf must not make NaN acceptable.
    reference = torch.tensor([-math.inf, 1.0, 2.0], dtype=torch.float64)
    eager = reference.to(torch.float16)
    with pytest.raises(CheckFailure, match="RMS error inf"):
        judge(torch.tensor([math.nan, 1.0, 2.0], dtype=torch.float16), reference, eager)


def gated(x, w):
    """sigmoid of a long random-sign dot product per row: ill-conditioned where the gate is large and negative (the
    output's relative error is the gate's absolute error)."""
    return torch.sigmoid((x * w).sum(-1))


def test_an_ill_conditioned_element_may_be_off_by_what_rounding_its_inputs_costs_but_no_more():
    # Found by `opforge fuzz` on tests/fixtures/real_ops/lstm_cell in bfloat16: the op rounds a 2,585-term gate once
    # more than eager does, and eager happened to be almost exact.
    from opforge.checks.op_and_reference import perturbed_arguments

    generator = torch.Generator().manual_seed(0)
    x, w = (torch.rand(4000, 1024, generator=generator, dtype=torch.float64).mul(4).sub(2) for _ in range(2))
    gates = (x * w).sum(-1)
    rows = (gates < -16) & (gates > -32)  # a bfloat16 ulp of the gate is 1/8 here: 2-5% of the output
    x, w = x[rows].to(torch.bfloat16).double(), w[rows].to(torch.bfloat16).double()
    expected = gated(x, w)
    lucky_eager = expected.to(torch.bfloat16)  # eager rounding only once, by luck
    op = torch.sigmoid((x * w).sum(-1).to(torch.bfloat16).double()).to(torch.bfloat16)  # the gate rounded too
    bfloat16 = Rule(Tolerance(atol=1e-12, rtol=1.6e-2), lowp=True)  # outputs of 1e-7 to 1e-14: rtol decides

    def judge_gated(got, perturbed):
        baseline = Baseline("bfloat16", lambda: {"result": lucky_eager}, 1024, perturbed)
        check_result("result", got, expected, bfloat16, torch.bfloat16, "cpu", baseline=baseline)

    def perturbed(scale, draw):
        return {"result": gated(*perturbed_arguments(((x, w), {}), scale, draw)[0])}

    with pytest.raises(CheckFailure, match="exceeds the"):
        judge_gated(op, None)  # without the inputs' conditioning it fails: the test bites
    judge_gated(op, perturbed)
    wrong = op.clone()
    wrong[::7] *= 2  # a wrong value is far past what rounding the inputs moves it
    with pytest.raises(CheckFailure, match="exceeds the"):
        judge_gated(wrong, perturbed)


def tracked_reference(x, formula):
    """A TrackedReference of `formula` on a float64 copy of x that requires grad."""

    def tracked():
        leaf = x.clone().requires_grad_(True)
        with torch.enable_grad():
            return {"result": formula(leaf)}, [leaf]

    return tracked


def test_a_scan_gets_a_sum_allowance_at_every_row_asked_for():
    x = torch.linspace(0.5, 2, 1000, dtype=torch.float64)
    baseline = Baseline("float32", lambda: {}, x.numel(), tracked=tracked_reference(x, lambda t: t.cumsum(0)))
    allowance = baseline.sum_allowance("result", torch.arange(1000).flip(0)).allowance
    assert bool(allowance.gt(0).all()) and allowance[-1] > 100 * allowance[0]  # the last element sums 1,000 terms


def test_the_sum_allowance_reads_at_most_its_budget_of_jacobian_terms(monkeypatch):
    # A failing float32 output of 1,000,003 elements read 4,096 Jacobian rows of 1,000,003 terms each, ~280 s per
    # comparison (an H100 host spent 265 s in the stream check of cuda_ops/disagreeing_swish). Here the budget is
    # five rows of 10,000 terms: the three worst elements (rows come worst first) and two of the other 4,093 by
    # rank get an allowance, each of those two standing for half of the 4,093 in the RMS, the unread ones for none.
    monkeypatch.setattr(compare, "SUM_TERMS_PER_COMPARISON", 50_000)
    x = torch.linspace(1, 4, 10_000, dtype=torch.float64)
    baseline = Baseline("float32", lambda: {}, x.numel(), tracked=tracked_reference(x, lambda t: t * torch.sigmoid(t)))
    worst_first = torch.arange(4096).flip(0)
    summed = baseline.sum_allowance("result", worst_first)
    read = worst_first[[0, 1, 2, 3, 3 + 4093 // 2]].tolist()
    assert summed.allowance.nonzero().view(-1).tolist() == sorted(read)
    assert (summed.read, summed.off) == (5, 4096)
    weights = summed.weights
    assert weights[read].tolist() == [1, 1, 1, 4093 / 2, 4093 / 2] and float(weights.sum()) == x.numel()
    assert int((weights == 0).sum()) == 4091


def sequential_float32_cumsum(x, drop=None):
    """A plain-order float32 scan (numpy's cumsum loop), as a CPU scan kernel computes it; `drop` leaves a term out."""
    values = x.to(torch.float32).numpy().copy()
    if drop is not None:
        values[drop] = 0
    return torch.from_numpy(values.cumsum(dtype="float32"))


def test_a_long_float32_scan_is_judged_by_a_sample_of_its_sums_when_not_all_rows_fit():
    # Found by `opforge bench` on fbgemm's asynchronous_complete_cumsum of 65,536 float32 lengths: a correct
    # sequential scan is off at ~25,000 elements; the 2^24 terms a comparison may read fit 256 Jacobian rows, and
    # with allowances at only those the RMS error was 6x the allowed one. A sample of the rest by rank stands for
    # them now; a scan that drops a term (elements 65 on off by its value) still fails.
    x = torch.rand(65_536, generator=torch.Generator().manual_seed(0)).mul(100).to(torch.float64)  # float32 values
    expected = x.cumsum(0)
    float32 = Rule(Tolerance(atol=1e-5, rtol=1.3e-6), lowp=True)

    def judge_scan(got):
        baseline = Baseline(
            "float32",
            lambda: {"result": x.to(torch.float32).cumsum(0)},  # accumulated in double on the CPU: exact
            x.numel(),
            tracked=tracked_reference(x, lambda t: t.cumsum(0)),
        )
        check_result("result", got, expected, float32, torch.float32, "cpu", baseline=baseline)

    judge_scan(sequential_float32_cumsum(x))
    with pytest.raises(CheckFailure, match=r"estimated from the 256 of its \d+ elements off"):
        judge_scan(sequential_float32_cumsum(x, drop=64))


def test_an_infinite_input_late_in_a_scan_leaves_the_prefixes_before_it_their_sum_allowance():
    # Found by `opforge fuzz` on fbgemm's asynchronous_exclusive_cumsum in float32 (fill -inf, inf or nan): every
    # prefix before the special value got a NaN term (its derivative 0 times inf), so no allowance, and the correct
    # sequential scan failed with RMS error 0.068 against 0.018 allowed.
    x = torch.rand(65_536, generator=torch.Generator().manual_seed(0)).mul(100).to(torch.float64)
    x[60_000] = -math.inf
    expected = x.cumsum(0)
    float32 = Rule(Tolerance(atol=1e-5, rtol=1.3e-6), lowp=True)

    def judge_scan(got):
        baseline = Baseline(
            "float32",
            lambda: {"result": x.to(torch.float32).cumsum(0)},
            x.numel(),
            tracked=tracked_reference(x, lambda t: t.cumsum(0)),
        )
        check_result("result", got, expected, float32, torch.float32, "cpu", baseline=baseline)

    judge_scan(sequential_float32_cumsum(x))
    with pytest.raises(CheckFailure, match="exceeds the"):
        judge_scan(sequential_float32_cumsum(x, drop=64))


def test_an_input_past_the_sum_budget_gets_no_sum_allowance_and_runs_no_backward():
    ran = []
    baseline = Baseline(
        "float32", lambda: {}, compare.SUM_TERMS_PER_COMPARISON + 1, tracked=lambda: ran.append(1) or ({}, [])
    )
    assert baseline.sum_allowance("result", torch.arange(4096)) is None
    assert not ran, "the float64 reference ran with autograd for an allowance it could not afford"


def quantize(x):
    """Codes round(x * 4) in float32 steps, half to even: the reference of a quantizer that computes in float32."""
    return torch.round(x.to(torch.float32) * 4).to(torch.uint8)


def judge_codes(got, x, perturbed):
    float32 = Rule(Tolerance(atol=1e-5, rtol=1.3e-6), lowp=True)
    baseline = Baseline("float32", lambda: {"codes": quantize(x)}, x.numel(), perturbed)
    check_result("codes", got, quantize(x.double()), float32, torch.uint8, "cpu", baseline=baseline)


@pytest.fixture
def codes_input():
    """Exact rounding ties (x * 4 = k + 0.5 for k = 0..59) and 1,000 values near no tie."""
    ties = (torch.arange(60, dtype=torch.float64) * 2 + 1) / 8
    others = torch.rand(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 60
    return torch.cat([ties, others]).to(torch.float32).double()


def test_an_integer_code_at_a_rounding_tie_may_go_either_way_but_a_code_off_elsewhere_fails(codes_input):
    # Found by `opforge fuzz` on fbgemm's FloatToFused8BitRowwiseQuantized: a code of exactly 232.5 in the
    # reference's float32 steps, 232 there, 233 from the kernel's own float32 order.
    from opforge.checks.op_and_reference import perturbed_arguments

    def perturbed(scale, draw):
        return {"codes": quantize(perturbed_arguments(((codes_input,), {}), scale, draw)[0][0])}

    half_up = torch.floor(codes_input.to(torch.float32) * 4 + 0.5).to(torch.uint8)  # ties away from even
    assert int((half_up != quantize(codes_input)).sum()) == 30  # the test bites: half of the ties differ
    with pytest.raises(CheckFailure, match="at 30 of them neither"):
        judge_codes(half_up, codes_input, None)  # without the rounded inputs nothing allows a tie to go up
    judge_codes(half_up, codes_input, perturbed)
    truncated = torch.floor(codes_input.to(torch.float32) * 4).to(torch.uint8)  # a floor for a round: a bug
    with pytest.raises(CheckFailure) as failure:
        judge_codes(truncated, codes_input, perturbed)
    assert "of them neither the reference computed in float32 nor the float64 reference" in str(failure.value)
    assert failure.value.mismatch is not None and failure.value.mismatch.abs_error == 1.0
    two_up = half_up.clone()
    two_up[0] += 1  # a tie's code two above its lower neighbour: no rounding reaches it
    with pytest.raises(CheckFailure, match="at 1 of them neither"):
        judge_codes(two_up, codes_input, perturbed)


def test_an_unread_element_s_infinite_error_leaves_the_estimated_rms_a_number():
    # Seen on an H200: a default-stream kernel's NaN outputs, judged with a sampled sum allowance, gave "RMS error
    # nan": the unread elements' weight 0 times their infinite error.
    got = torch.tensor([1.5, math.nan, 2.0], dtype=torch.float32)
    expected = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    weights = torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)
    errors = compare.lowp_errors(
        got, expected, expected.to(torch.float32), Tolerance(1e-5, 1.3e-6), "x", 1, None, weights
    )
    assert errors is not None and errors.rms_error == pytest.approx(0.5)


def test_an_infinite_error_fails_without_running_the_reference_for_allowances():
    # Found by `opforge fuzz` on torchvision's roi_pool: -FLT_MAX for the reference's -inf (a declared defect) spent
    # 40 s reading Jacobian rows for an allowance that cannot make an infinite error finite: reported as a hang.
    expected = torch.tensor([-math.inf, 1.0, 2.0], dtype=torch.float64)
    got = torch.tensor([torch.finfo(torch.float32).min, 1.0, 2.5], dtype=torch.float32)
    calls = []

    def perturbed(scale, draw):
        calls.append("perturbed")
        return {"result": expected}

    def tracked():
        calls.append("tracked")
        return {}, []

    float32 = Rule(Tolerance(atol=1e-5, rtol=1.3e-6), lowp=True)
    baseline = Baseline("float32", lambda: {"result": expected.to(torch.float32)}, 3, perturbed, tracked)
    with pytest.raises(CheckFailure, match="RMS error inf"):
        check_result("result", got, expected, float32, torch.float32, "cpu", baseline=baseline)
    assert calls == []
