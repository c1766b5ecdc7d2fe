"""opforge::leaky_swish: direct tests of the kernels, then the whole spec through opforge's own checks."""

from __future__ import annotations

import pytest
import torch

from conftest import SPECS, describe, requires_cuda, run_spec
from opforge.compare import worst_mismatch
from opforge.ops.leaky_swish import LeakySwish, leaky_swish, leaky_swish_prototype, reference
from opforge.results import describe_mismatch
from opforge.spec.model import Tolerance

DTYPES = [
    (torch.float32, 1e-5, 1.3e-6),
    (torch.float64, 1e-12, 1e-12),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
]
SHAPES = [(), (0,), (7,), (33, 65), (2, 3, 5, 4)]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def assert_matches_reference(got, x, alpha, atol, rtol, dtype):
    expected = reference(x.double().cpu(), alpha)
    assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
    mismatch = worst_mismatch("result", got, expected, Tolerance(atol, rtol))
    assert mismatch is None, describe_mismatch(mismatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=[str(d[0]) for d in DTYPES])
def test_forward_matches_reference(dtype, atol, rtol, shape, device):
    x = (torch.rand(shape, dtype=torch.float64, device=device) * 16 - 8).to(dtype)
    assert_matches_reference(leaky_swish(x, 0.1), x, 0.1, atol, rtol, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_layouts_keep_their_strides(device):
    x = torch.randn(2, 3, 5, 4, device=device).to(memory_format=torch.channels_last)
    out = leaky_swish(x)
    assert out.stride() == x.stride()
    transposed = torch.randn(65, 33, device=device).t()
    assert leaky_swish(transposed).stride() == transposed.stride()
    sliced = torch.randn(33, 130, device=device)[:, ::2]
    assert_matches_reference(leaky_swish(sliced, -0.25), sliced, -0.25, 1e-5, 1.3e-6, torch.float32)


def test_results_do_not_depend_on_thread_count():
    x = torch.randn(1_000_003)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = leaky_swish(x)
        torch.set_num_threads(max(2, threads))
        many = leaky_swish(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_special_values_propagate():
    x = torch.tensor([float("nan"), float("inf"), -0.0, 0.0, 1e-40, 100.0, -100.0])
    got = leaky_swish(x, 0.1)
    expected = reference(x.double(), 0.1)
    assert torch.isnan(got[0])
    assert got[1] == float("inf")
    assert worst_mismatch("result", got[2:], expected[2:], Tolerance(1e-5, 1.3e-6)) is None


def test_module_and_prototype_agree_with_the_op():
    x = torch.randn(33, 65)
    module = LeakySwish(alpha=0.2)
    assert torch.equal(module(x), leaky_swish(x, 0.2))
    assert "alpha=0.2" in repr(module)
    torch.testing.assert_close(leaky_swish_prototype(x, 0.2), leaky_swish(x, 0.2))


def test_double_backward_in_float64():
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: leaky_swish(t, 0.3), (x,))


def test_rejects_integer_input_with_a_clear_message():
    with pytest.raises(RuntimeError, match="must be float32, float64, float16 or bfloat16, got Int"):
        leaky_swish(torch.ones(3, dtype=torch.int32))


@pytest.mark.slow
def test_spec_passes_every_check():
    report = run_spec(SPECS / "leaky_swish.yaml")
    failed = [r for r in report.results if r.status.failed]
    assert not failed, describe(failed)
