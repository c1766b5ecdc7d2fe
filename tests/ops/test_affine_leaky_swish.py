"""opforge::affine_leaky_swish: direct tests of the NCHW and NHWC kernels, forward and backward, and their layouts."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPE_IDS, DTYPES, requires_cuda

from opforge.ops.affine_leaky_swish import affine_leaky_swish, fold_batch_norm, output_format, reference

# (N, C, H, W): the spec's shapes; 7 channels; 33 x 65 planes (no multiple of any vector width); H * W = 1 (both
# walks see the same buffer); one channel; no channels; no batch; and one big enough for several threads and tiles.
SHAPES = [
    (2, 3, 5, 4),
    (1, 8, 7, 9),
    (2, 7, 33, 65),
    (3, 5, 1, 1),
    (2, 1, 6, 5),
    (2, 0, 3, 3),
    (0, 4, 2, 2),
    (4, 16, 64, 65),
]
FORMATS = [torch.contiguous_format, torch.channels_last]
FORMAT_IDS = ["nchw", "nhwc"]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def make_inputs(shape, dtype, memory_format, device="cpu", seed=0, requires_grad=False):
    """x in [-4, 4], scale and shift in [-2, 2], drawn in float64 and rounded to dtype."""
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 8 - 4).to(dtype)
    scale = (torch.rand(c, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    shift = (torch.rand(c, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    x = x.to(device).contiguous(memory_format=memory_format)
    return tuple(t.to(device).requires_grad_(requires_grad) for t in (x, scale, shift))


def float64_cpu(*tensors):
    return tuple(t.detach().double().cpu().requires_grad_(True) for t in tensors)


def expected_strides(x):
    return torch.empty_like(x, memory_format=output_format(x)).stride()


# ------------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_forward_matches_reference(dtype, atol, rtol, shape, memory_format, device):
    x, scale, shift = make_inputs(shape, dtype, memory_format, device)
    got = affine_leaky_swish(x, scale, shift, 0.1)
    assert got.dtype == dtype and got.device == x.device
    torch.testing.assert_close(
        got.double().cpu(), reference(*float64_cpu(x, scale, shift), 0.1).detach(), atol=atol, rtol=rtol
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 8, 7, 9), (2, 0, 3, 3), (0, 4, 2, 2)], ids=str)
def test_output_keeps_the_memory_format(shape, memory_format, device):
    x, scale, shift = make_inputs(shape, torch.float32, memory_format, device)
    out = affine_leaky_swish(x, scale, shift)
    assert out.stride() == torch.empty_like(x, memory_format=memory_format).stride()
    assert out.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make",
    [
        lambda x: x[:, :, ::2],  # a strided slice of an NCHW tensor: computed in NCHW
        lambda x: x.contiguous(memory_format=torch.channels_last)[..., 1:],  # a slice of an NHWC one: NHWC
        lambda x: x.transpose(2, 3),  # dense, but neither format: NCHW
        lambda x: x[:1].expand(3, -1, -1, -1),  # stride 0
    ],
    ids=["nchw_slice", "nhwc_slice", "transposed", "expanded"],
)
def test_other_layouts_are_copied_into_the_suggested_format(make, device):
    base, scale, shift = make_inputs((2, 8, 6, 5), torch.float32, torch.contiguous_format, device)
    x = make(base)
    out = affine_leaky_swish(x, scale, shift, -0.25)
    # The fake (output_format) and the kernel agree on the layout; opcheck checks the same in test_opcheck.
    assert out.stride() == expected_strides(x)
    torch.testing.assert_close(
        out.double().cpu(), reference(*float64_cpu(x, scale, shift), -0.25).detach(), atol=1e-5, rtol=1.3e-6
    )


@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
def test_special_values_propagate(memory_format):
    x, scale, shift = make_inputs((1, 4, 2, 3), torch.float32, memory_format)
    x = x.clone()
    x[0, :, 0, 0] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40])
    scale = scale.clone()
    scale[3] = float("inf")
    got = affine_leaky_swish(x, scale, shift, 0.1)
    expected = reference(*float64_cpu(x, scale, shift), 0.1).detach()
    # NaN where the reference has NaN, infinities of the same sign where it has them.
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1.3e-6, equal_nan=True)


@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
def test_results_do_not_depend_on_thread_count(memory_format):
    x, scale, shift = make_inputs((4, 24, 67, 65), torch.float32, memory_format, requires_grad=True)
    grad = torch.randn(x.shape).contiguous(memory_format=memory_format)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            out = affine_leaky_swish(x, scale, shift)
            results.append((out, *torch.autograd.grad(out, (x, scale, shift), grad)))
    finally:
        torch.set_num_threads(threads)
    for one, many in zip(*results):
        assert torch.equal(one, many)


# ------------------------------------------------------------------------------------------------ backward


def reference_gradients(x, scale, shift, grad, alpha):
    """The float64 gradients, and the sums of the absolute terms behind each scale/shift gradient: a sum of K terms
    rounded in float32 is off by up to about eps * sum(|terms|), however small the sum itself."""
    x64, scale64, shift64 = float64_cpu(x, scale, shift)
    grad64 = grad.double().cpu()
    grads = torch.autograd.grad(reference(x64, scale64, shift64, alpha), (x64, scale64, shift64), grad64)
    # The terms: d = grad * f'(v) for shift, d * x for scale.
    v = (x64 * scale64.reshape(1, -1, 1, 1) + shift64.reshape(1, -1, 1, 1)).detach().requires_grad_(True)
    (d,) = torch.autograd.grad(v * (torch.sigmoid(v) + alpha), v, grad64)
    return grads, (None, (d * x64.detach()).abs().sum((0, 2, 3)), d.abs().sum((0, 2, 3)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_gradients_match_reference(dtype, atol, rtol, shape, memory_format, device):
    x, scale, shift = make_inputs(shape, dtype, memory_format, device, requires_grad=True)
    # A contiguous incoming gradient for a channels_last x, as autograd often hands in.
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype).to(device)
    got = torch.autograd.grad(affine_leaky_swish(x, scale, shift, 0.1), (x, scale, shift), grad)
    expected, magnitudes = reference_gradients(x, scale, shift, grad, 0.1)
    for name, g, e, magnitude in zip(("x", "scale", "shift"), got, expected, magnitudes):
        assert g.dtype == dtype and g.shape == e.shape, name
        sum_atol = atol if magnitude is None or magnitude.numel() == 0 else atol + rtol * magnitude.max().item()
        torch.testing.assert_close(g.double().cpu(), e, atol=sum_atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 5, 3, 7), (3, 4, 1, 1), (2, 1, 2, 3)], ids=str)
def test_gradcheck_in_float64(shape, memory_format):
    x, scale, shift = make_inputs(shape, torch.float64, memory_format, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: affine_leaky_swish(*t, 0.3), (x, scale, shift))


@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
def test_gradient_of_x_keeps_the_memory_format(memory_format):
    x, scale, shift = make_inputs((2, 8, 7, 9), torch.float32, memory_format, requires_grad=True)
    (grad_x,) = torch.autograd.grad(affine_leaky_swish(x, scale, shift).sum(), (x,))
    assert grad_x.stride() == x.stride()


def test_only_requested_gradients_are_returned():
    x, scale, shift = make_inputs((2, 3, 5, 4), torch.float32, torch.contiguous_format)
    scale.requires_grad_(True)
    affine_leaky_swish(x, scale, shift).sum().backward()
    assert scale.grad is not None and x.grad is None and shift.grad is None


# ------------------------------------------------------------------------------------- registration, errors


@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (3, 5, 1, 1), (0, 4, 2, 2)], ids=str)
def test_opcheck(shape, memory_format):
    # test_faketensor compares the fake's strides with the kernel's.
    x, scale, shift = make_inputs(shape, torch.float32, memory_format, requires_grad=True)
    torch.library.opcheck(torch.ops.opforge.affine_leaky_swish.default, (x, scale, shift, 0.1))


def test_opcheck_on_a_layout_that_is_copied():
    x, scale, shift = make_inputs((2, 8, 6, 5), torch.float32, torch.channels_last, requires_grad=True)
    # A leaf view of the same strides: opcheck's fake copy of a non-leaf reads its .grad, which torch warns about.
    sliced = x[..., 1:].detach().requires_grad_()
    torch.library.opcheck(torch.ops.opforge.affine_leaky_swish.default, (sliced, scale, shift, 0.1))


@pytest.mark.parametrize(
    "args, message",
    [
        (
            (torch.ones(1, 2, 3, 3, dtype=torch.int32), torch.ones(2), torch.ones(2)),
            "x must be float32, float64, float16 or bfloat16, got Int",
        ),
        (
            (torch.ones(2, 3, 5), torch.ones(3), torch.ones(3)),
            r"x must be 4-D \(N, C, H, W\), got 3-D shape \[2, 3, 5\]",
        ),
        ((torch.ones(()), torch.ones(1), torch.ones(1)), "x must be 4-D .*got 0-D"),
        (
            (torch.ones(1, 3, 2, 2), torch.ones(4), torch.ones(3)),
            r"scale must be 1-D with x's 3 channels, got shape \[4\]",
        ),
        ((torch.ones(1, 3, 2, 2), torch.ones(3), torch.ones(1, 3)), r"shift must be 1-D with x's 3 channels"),
        (
            (torch.ones(1, 3, 2, 2), torch.ones(3), torch.ones(3, dtype=torch.float64)),
            "shift must have x's dtype Float, got Double",
        ),
    ],
    ids=["integer", "3d", "0d", "scale_size", "shift_2d", "shift_dtype"],
)
def test_rejects_invalid_calls_with_a_clear_message(args, message):
    with pytest.raises(RuntimeError, match=message):
        affine_leaky_swish(*args)


def test_backward_op_checks_the_gradient_shape():
    x, scale, shift = make_inputs((2, 3, 5, 4), torch.float32, torch.contiguous_format)
    with pytest.raises(RuntimeError, match="grad must have x's shape"):
        torch.ops.opforge.affine_leaky_swish_backward(torch.ones(2, 3, 5), x, scale, shift, 0.1)


def test_folded_batch_norm_matches_eval_batch_norm():
    bn = torch.nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 6, 5, 7)
    scale, shift = fold_batch_norm(bn)
    with torch.no_grad():
        v = bn(x)
        torch.testing.assert_close(affine_leaky_swish(x, scale, shift, 0.1), v * (torch.sigmoid(v) + 0.1))


# ---------------------------------------------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("memory_format", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize(
    "shape",
    # Vectorized (C or H * W a multiple of every vector width) and element-by-element walks; several row blocks.
    [(2, 64, 8, 8), (2, 3, 5, 7), (3, 40, 9, 9), (64, 24, 17, 16), (1, 2048, 3, 3)],
    ids=str,
)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_cuda_matches_cpu_and_is_deterministic(dtype, atol, rtol, shape, memory_format):
    x, scale, shift = make_inputs(shape, dtype, memory_format, "cuda", requires_grad=True)
    grad = torch.randn(shape, device="cuda").to(dtype)
    runs = []
    for _ in range(2):
        out = affine_leaky_swish(x, scale, shift)
        runs.append((out, *torch.autograd.grad(out, (x, scale, shift), grad)))
    for first, second in zip(*runs):
        assert torch.equal(first, second)
    expected, magnitudes = reference_gradients(x, scale, shift, grad, 0.1)
    torch.testing.assert_close(
        runs[0][0].double().cpu(), reference(*float64_cpu(x, scale, shift)).detach(), atol=atol, rtol=rtol
    )
    for name, g, e, magnitude in zip(("x", "scale", "shift"), runs[0][1:], expected, magnitudes):
        sum_atol = atol if magnitude is None else atol + rtol * magnitude.max().item()
        torch.testing.assert_close(g.double().cpu(), e, atol=sum_atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


@requires_cuda
def test_cuda_misaligned_and_other_layouts():
    storage = torch.randn(2 * 8 * 6 * 5 + 1, device="cuda")
    x = storage[1:].view(2, 8, 6, 5)  # 4 bytes past a 16-byte boundary: the element-by-element walk
    scale, shift = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
    for view in (x, x.contiguous(memory_format=torch.channels_last)[..., 1:], x.transpose(2, 3)):
        out = affine_leaky_swish(view, scale, shift)
        assert out.stride() == expected_strides(view)
        torch.testing.assert_close(out.cpu(), affine_leaky_swish(view.cpu(), scale.cpu(), shift.cpu()))


@requires_cuda
def test_cuda_runs_on_the_current_stream():
    x, scale, shift = make_inputs((8, 64, 32, 32), torch.float32, torch.channels_last, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = affine_leaky_swish(x, scale, shift)
    stream.synchronize()
    torch.testing.assert_close(out.cpu(), affine_leaky_swish(x.cpu(), scale.cpu(), shift.cpu()))
