"""opforge::custom_loss: direct tests of the kernels, then the whole spec through opforge's own checks."""

from __future__ import annotations

import pytest
import torch

from conftest import SPECS, describe, requires_cuda, run_spec
from opforge.compare import worst_mismatch
from opforge.ops.custom_loss import custom_loss, reference
from opforge.results import describe_mismatch
from opforge.spec.model import Tolerance

DTYPES = [
    (torch.float32, 1e-5, 1.3e-6),
    (torch.float64, 1e-12, 1e-12),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
]
# (pred shape, target shape): same shapes, broadcasting either way, 0-d, empty.
PAIRS = [((), ()), ((0,), (0,)), ((7,), (7,)), ((33, 65), (65,)), ((7,), (3, 7)), ((3, 1), (1, 4))]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pred_shape, target_shape", PAIRS, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=[str(d[0]) for d in DTYPES])
def test_forward_matches_reference(dtype, atol, rtol, pred_shape, target_shape, device):
    pred = torch.randn(pred_shape, device=device).to(dtype)
    target = torch.randn(target_shape, device=device).to(dtype)
    got = custom_loss(pred, target)
    expected = reference(pred.double().cpu(), target.double().cpu())
    assert got.shape == expected.shape and got.dtype == dtype
    mismatch = worst_mismatch("result", got, expected, Tolerance(atol, rtol))
    assert mismatch is None, describe_mismatch(mismatch)


@pytest.mark.parametrize("pred_shape, target_shape", PAIRS[2:], ids=str)
def test_gradients_reduce_to_each_input_shape(pred_shape, target_shape):
    pred = torch.randn(pred_shape, dtype=torch.float64, requires_grad=True)
    target = torch.randn(target_shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(custom_loss, (pred, target))


def test_gradient_at_the_kink_is_zero_like_abs():
    pred = torch.zeros(3, requires_grad=True)
    custom_loss(pred, torch.zeros(3)).sum().backward()
    assert torch.equal(pred.grad, torch.zeros(3))


def test_rejects_mixed_dtypes_with_a_clear_message():
    with pytest.raises(RuntimeError, match="target must have pred's dtype Float, got Double"):
        custom_loss(torch.ones(3), torch.ones(3, dtype=torch.float64))


@pytest.mark.slow
def test_spec_passes_every_check():
    report = run_spec(SPECS / "custom_loss.yaml")
    failed = [r for r in report.results if r.status.failed]
    assert not failed, describe(failed)
