"""opforge::custom_loss: direct tests of the kernels, then the whole spec through opforge's own checks."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPE_IDS, DTYPES, SPECS, describe, requires_cuda, run_spec

from opforge.cases.compare import worst_mismatch
from opforge.core.results import describe_mismatch
from opforge.ops.custom_loss import _backward, _grads, _grads_repeated, custom_loss, reference
from opforge.spec.model import Tolerance

# (pred shape, target shape): same shapes, broadcasting either way, 0-d, empty. Rows of 16 elements or more are
# read in place by the CPU kernels (a target repeated per row; one spanning two of three dimensions; a repeated
# pred); shorter ones are copied to the full shape first.
PAIRS = [
    ((), ()),
    ((0,), (0,)),
    ((7,), (7,)),
    ((33, 65), (65,)),
    ((7,), (3, 7)),
    ((3, 1), (1, 4)),
    ((2, 3, 40), (3, 40)),
    ((40,), (6, 1, 40)),
]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pred_shape, target_shape", PAIRS, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
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


# ------------------------------------------------------------------- the one-pass backward (custom_loss_grads)


def _reference_grads(grad, pred, target):
    """dL/dpred and dL/dtarget in the broadcast shape, through autograd of the float64 reference."""
    p = pred.detach().double().cpu().expand(grad.shape).clone().requires_grad_()
    t = target.detach().double().cpu().expand(grad.shape).clone().requires_grad_()
    return torch.autograd.grad(reference(p, t), (p, t), grad.double().cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pred_shape, target_shape", PAIRS, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_grads_op_returns_both_gradients_from_one_call(dtype, atol, rtol, pred_shape, target_shape, device):
    pred = torch.randn(pred_shape, device=device).to(dtype)
    target = torch.randn(target_shape, device=device).to(dtype)
    grad = torch.randn(torch.broadcast_shapes(pred_shape, target_shape), device=device).to(dtype)
    grad_pred, grad_target = _grads(grad, pred, target)
    expected_pred, expected_target = _reference_grads(grad, pred, target)
    assert grad_pred.dtype == grad_target.dtype == dtype and grad_pred.shape == grad_target.shape == grad.shape
    torch.testing.assert_close(grad_pred.cpu(), expected_pred.to(dtype), atol=atol, rtol=rtol)
    torch.testing.assert_close(grad_target.cpu(), expected_target.to(dtype), atol=atol, rtol=rtol)
    # The same formula as the one-output backward, negated exactly for the target.
    torch.testing.assert_close(grad_pred, _backward(grad, pred, target), atol=0, rtol=0)
    torch.testing.assert_close(grad_target, -grad_pred, atol=0, rtol=0)


@pytest.mark.parametrize("pred_shape, target_shape", PAIRS, ids=str)
@pytest.mark.parametrize("wanted", ["both", "pred", "target"])
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_autograd_gives_each_wanted_gradient_in_its_input_shape(dtype, atol, rtol, wanted, pred_shape, target_shape):
    pred = torch.randn(pred_shape).to(dtype).requires_grad_(wanted in ("both", "pred"))
    target = torch.randn(target_shape).to(dtype).requires_grad_(wanted in ("both", "target"))
    out = custom_loss(pred, target)
    grad = torch.randn(out.shape).to(dtype)
    inputs = [t for t in (pred, target) if t.requires_grad]
    got = torch.autograd.grad(out, inputs, grad)
    p64 = pred.detach().double().requires_grad_(pred.requires_grad)
    t64 = target.detach().double().requires_grad_(target.requires_grad)
    expected = torch.autograd.grad(reference(p64, t64), [t for t in (p64, t64) if t.requires_grad], grad.double())
    # A broadcast input's gradient is a sum over the broadcast rows: the dtype's rounding of that sum, not of each
    # term, is what the tolerance allows (the float32 accumulation for float16/bfloat16 keeps it so).
    rows = max(out.numel() // max(t.numel(), 1) for t in (pred, target))
    for g, e, t in zip(got, expected, inputs):
        assert g.shape == t.shape and g.dtype == dtype
        torch.testing.assert_close(g, e.to(dtype), atol=atol * rows, rtol=rtol)


def test_grads_op_rejects_a_grad_of_another_shape():
    with pytest.raises(RuntimeError, match=r"opforge::custom_loss_grads: grad must have the broadcast shape \[3, 7\]"):
        _grads(torch.ones(7), torch.ones(3, 7), torch.ones(7))


def test_grads_op_has_a_fake_for_torch_compile():
    torch.library.opcheck(_grads, (torch.randn(33, 65), torch.randn(33, 65), torch.randn(65)))


# --------------------------------------------- a per-feature target: custom_loss_grads_repeated sums it in the pass

# (pred shape, target shape): target repeated over pred's leading dimensions; rows of 1, 7, 33 and 0, a target
# with a leading 1, a 0-d target (one value repeated over every element), and 517 rows: on CUDA several blocks of
# rows, each over several row steps.
REPEATED = [
    ((33, 65), (65,)),
    ((2, 3, 40), (3, 40)),
    ((5, 7), (1, 7)),
    ((4,), ()),
    ((1, 300), (300,)),
    ((0, 9), (9,)),
    ((517, 96), (96,)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pred_shape, target_shape", REPEATED, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_grads_repeated_op_sums_the_target_gradient_over_the_rows(dtype, atol, rtol, pred_shape, target_shape, device):
    pred = torch.randn(pred_shape, device=device).to(dtype)
    target = torch.randn(target_shape, device=device).to(dtype)
    grad = torch.randn(pred_shape, device=device).to(dtype)
    grad_pred, grad_target = _grads_repeated(grad, pred, target)
    expected_pred, expected_full = _reference_grads(grad, pred, target)
    expected_target = expected_full.sum_to_size(target_shape)
    assert grad_pred.shape == pred.shape and grad_target.shape == target.shape
    assert grad_pred.dtype == grad_target.dtype == dtype
    # dL/dpred is the one-output backward's, bit for bit; dL/dtarget a sum over the rows, rounded once.
    torch.testing.assert_close(grad_pred.cpu(), expected_pred.to(dtype), atol=atol, rtol=rtol)
    torch.testing.assert_close(grad_pred, _backward(grad, pred, target), atol=0, rtol=0)
    rows = max(pred.numel() // max(target.numel(), 1), 1)
    mismatch = worst_mismatch("grad_target", grad_target.cpu(), expected_target, Tolerance(atol * rows, rtol))
    assert mismatch is None, describe_mismatch(mismatch)


def test_grads_repeated_op_rejects_a_target_that_is_not_repeated_over_rows():
    message = (
        r"custom_loss_grads_repeated: target must repeat over pred's leading dimensions .*\[3, 7\]\), got \[3, 1\]"
    )
    with pytest.raises(RuntimeError, match=message):
        _grads_repeated(torch.ones(3, 7), torch.ones(3, 7), torch.ones(3, 1))


def test_grads_repeated_op_has_a_fake_for_torch_compile():
    torch.library.opcheck(_grads_repeated, (torch.randn(33, 65), torch.randn(33, 65), torch.randn(65)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_per_feature_target_takes_one_pass_without_full_size_float_copies(dtype):
    # Before the op, a bfloat16 backward cast grad and pred to float32 full-size (0.37x torch.compile on the CPU).
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.seen.append((str(func.overloadpacket), [tuple(t.shape) for t in args if isinstance(t, torch.Tensor)]))
            return out

    pred = torch.randn(64, 32).to(dtype).requires_grad_()
    target = torch.randn(32).to(dtype).requires_grad_()
    out = custom_loss(pred, target)
    with Calls() as calls:
        out.backward(torch.ones_like(out))
    names = [name for name, _ in calls.seen]
    assert "opforge.custom_loss_grads_repeated" in names, names
    full_size = [c for c in calls.seen if c[0] != "opforge.custom_loss_grads_repeated" and (64, 32) in c[1]]
    assert not [c for c in full_size if "copy" in c[0] or "_to_copy" in c[0] or "sum" in c[0]], calls.seen
