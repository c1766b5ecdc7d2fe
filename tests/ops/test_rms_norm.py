"""opforge::rms_norm: direct tests of the kernels, then the whole spec through opforge's own checks."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPE_IDS, DTYPES, SPECS, describe, requires_cuda, run_spec

from opforge.ops.rms_norm import RMSNorm, _backward, _backward_input, reference, rms_norm

# (x shape, weight shape): a row no multiple of any vector width, odd rows, 3-D, no columns, no rows, a row of one,
# long rows, and a few rows wider than a block of the CPU kernel's sums (split by columns).
SHAPES = [
    ((7,), (7,)),
    ((33, 65), (65,)),
    ((4, 7, 128), (128,)),
    ((3, 0), (0,)),
    ((0, 16), (16,)),
    ((5, 1), (1,)),
    ((2, 4096), (4096,)),
    ((3, 5000), (5000,)),
]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
EPS = 1e-6


def sampled(shape, dtype, device="cpu", low=-3.0, high=3.0):
    """Uniform values already rounded to `dtype`, so the float64 reference sees exactly what the op sees."""
    return (torch.rand(shape, dtype=torch.float64, device=device) * (high - low) + low).to(dtype)


def reference_grads(x, weight, grad, eps=EPS):
    """grad_x and grad_weight of the float64 reference on the CPU, for the same (rounded) values."""
    x64 = x.detach().double().cpu().requires_grad_()
    w64 = weight.detach().double().cpu().requires_grad_()
    return torch.autograd.grad(reference(x64, w64, eps), (x64, w64), grad.double().cpu())


def assert_close(name, got, expected, atol, rtol):
    """torch.testing.assert_close of `got` against a float64 `expected`, whose message names the worst element."""
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(
        got.double().cpu(), expected.double().cpu(), atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}"
    )


# ------------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, w_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("eps", [EPS, 0.1])
def test_forward_matches_reference(dtype, atol, rtol, x_shape, w_shape, device, eps):
    x, w = sampled(x_shape, dtype, device), sampled(w_shape, dtype, device, -2, 2)
    y = rms_norm(x, w, eps)
    assert y.dtype == dtype and y.device == x.device and y.is_contiguous()
    assert_close("y", y, reference(x.double().cpu(), w.double().cpu(), eps), atol, rtol)


# Rows whose squares overflow float (past ~1.8e19, which float32 and bfloat16 hold): their norm is finite. "max" is
# the dtype's largest value.
HUGE_ROWS = [[3e30], ["-max"], ["max"], [2e19], [1.0], [3e30, -1e30, 2.0, 5e29, 0.0, 1.0, -7e29]]


def huge_row(row, dtype, device="cpu"):
    """One of HUGE_ROWS as a 1-row x of `dtype`, with a weight (and a gradient) of ordinary values."""
    largest = torch.finfo(dtype).max
    values = [{"max": largest, "-max": -largest}.get(v, v) for v in row]
    x = torch.tensor([values], dtype=torch.float64).to(dtype=dtype, device=device)
    return x, sampled((len(row),), dtype, device, 0.5, 2.0), sampled((1, len(row)), dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", [DTYPES[0], DTYPES[3]], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("row", HUGE_ROWS, ids=str)
def test_a_row_whose_squares_overflow_float_is_normalized_not_zeroed(dtype, atol, rtol, row, device):
    # F.rms_norm, and the kernels until they summed such a row again in double, gave zeros.
    x, w, _ = huge_row(row, dtype, device)
    y = rms_norm(x, w, EPS)
    assert_close("y", y, reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)


# Each width reaches another of the CUDA forward's shapes: 1 the scalar kernel's one-warp rows; 1024 a row group of
# two warps (float32) or one (bfloat16), several groups a block; 4096 a block of 8 warps on one row (float32) or two
# groups of 4 (bfloat16); 73728 the loop kernel, which reads a row twice. On the CPU, one row at a time. Every CUDA
# shape, forward and backward: test_cuda_rows_whose_squares_overflow_float_in_every_kernel.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", [DTYPES[0], DTYPES[3]], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("width", [1, 1024, 4096, 73728])
def test_an_overflowing_row_is_normalized_and_leaves_its_neighbours_bits_alone(dtype, atol, rtol, width, device):
    x, w = sampled((9, width), dtype, device), sampled((width,), dtype, device, 0.5, 2.0)
    ordinary = rms_norm(x, w, EPS)
    x[4, width // 2] = 3e30  # its square overflows float: this row alone is summed again in double
    y = rms_norm(x, w, EPS)
    others = [0, 1, 2, 3, 5, 6, 7, 8]
    assert torch.equal(y[others], ordinary[others]), "a row's output changed with its neighbour's values"
    assert_close("y[4]", y[4], reference(x[4:5].double().cpu(), w.double().cpu(), EPS)[0], atol, rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", [DTYPES[0], DTYPES[3]], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("row", HUGE_ROWS, ids=str)
def test_the_gradient_of_a_row_whose_squares_overflow_float_is_finite_and_right(dtype, atol, rtol, row, device):
    x, w, grad = huge_row(row, dtype, device)
    grad_x, grad_w = _backward(grad, x, w, EPS)
    expected_x, expected_w = reference_grads(x, w, grad)
    assert_close("grad_x", grad_x, expected_x, atol, rtol)
    assert_close("grad_weight", grad_w, expected_w, atol, rtol)


# One row of 2^22: `opforge bench rms_norm --sizes 2**22` grows the spec's 1-D pairing to it. The CPU kernel summed
# each of its 32 lanes over 131,072 squares in float and was 8.6e-6 off; it now sums blocks of 4096 and adds the
# blocks in double (so do the backward's sums of a bfloat16 row, which ran in float the same way).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", [DTYPES[0], DTYPES[3]], ids=["float32", "bfloat16"])
def test_one_very_wide_row_keeps_its_dtypes_accuracy(dtype, atol, rtol, device):
    torch.manual_seed(0)
    width = 2**22
    x, w, grad = (sampled((width,), dtype, device) for _ in range(3))
    assert_close("y", rms_norm(x, w, EPS), reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
    grad_x, grad_w = _backward(grad, x, w, EPS)
    expected_x, expected_w = reference_grads(x, w, grad)
    assert_close("grad_x", grad_x, expected_x, atol, rtol)
    assert_close("grad_weight", grad_w, expected_w, atol, rtol)


def test_default_eps_is_1e_6():
    x, w = sampled((3, 8), torch.float64), sampled((8,), torch.float64)
    assert torch.equal(rms_norm(x, w), rms_norm(x, w, 1e-6))
    assert torch.equal(torch.ops.opforge.rms_norm(x, w), rms_norm(x, w, 1e-6))


def noncontiguous_inputs(dtype, device):
    """(name, x, weight): a transposed x, a strided slice, rows that are one broadcast row, a strided weight."""
    transposed = sampled((65, 33), dtype, device).t()
    sliced = sampled((33, 130), dtype, device)[:, ::2]
    expanded = sampled((1, 65), dtype, device).expand(5, 65)
    weight = sampled((65,), dtype, device, -2, 2)
    strided_weight = sampled((130,), dtype, device, -2, 2)[::2]
    return [
        ("transposed x", transposed, weight),
        ("strided x", sliced, weight),
        ("expanded x", expanded, weight),
        ("strided weight", sliced, strided_weight),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_noncontiguous_inputs_give_contiguous_results(dtype, atol, rtol, device):
    for name, x, w in noncontiguous_inputs(dtype, device):
        assert not (x.is_contiguous() and w.is_contiguous()), name
        y = rms_norm(x, w, EPS)
        assert y.is_contiguous(), name
        assert_close(f"{name}: y", y, reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
        grad = sampled(x.shape, dtype, device)
        gx, gw = _backward(grad, x, w, EPS)
        rx, rw = reference_grads(x, w, grad)
        assert_close(f"{name}: grad_x", gx, rx, atol, rtol)
        assert_close(f"{name}: grad_weight", gw, rw, atol, rtol)


def test_special_values_stay_in_their_row():
    x = sampled((4, 16), torch.float32)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    w = sampled((16,), torch.float32)
    y = rms_norm(x, w, EPS)
    assert y[1].isnan().all(), "a NaN makes its row's rms NaN"
    assert y[2, 5].isnan() and (y[2, :5] == 0).all(), "an inf: rms is inf, x / rms is inf / inf there, 0 elsewhere"
    torch.testing.assert_close(
        y.double(), reference(x.double(), w.double(), EPS), atol=1e-5, rtol=1.3e-6, equal_nan=True
    )


def test_row_of_zeros_gives_zeros_and_finite_gradients():
    x = torch.zeros(3, 32)
    w = sampled((32,), torch.float32)
    assert torch.equal(rms_norm(x, w, EPS), torch.zeros(3, 32))
    gx, gw = _backward(torch.ones(3, 32), x, w, EPS)
    assert torch.isfinite(gx).all() and torch.equal(gw, torch.zeros(32))


# ------------------------------------------------------------------------------------------------ backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, w_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_autograd_matches_reference(dtype, atol, rtol, x_shape, w_shape, device):
    x = sampled(x_shape, dtype, device).requires_grad_()
    w = sampled(w_shape, dtype, device, -2, 2).requires_grad_()
    grad = sampled(x_shape, dtype, device)
    gx, gw = torch.autograd.grad(rms_norm(x, w, EPS), (x, w), grad)
    rx, rw = reference_grads(x, w, grad)
    assert gx.dtype == dtype and gw.dtype == dtype
    assert_close("grad_x", gx, rx, atol, rtol)
    assert_close("grad_weight", gw, rw, atol, rtol)


@pytest.mark.parametrize("x_shape, w_shape", [s for s in SHAPES if 0 not in s[0]], ids=str)
@pytest.mark.parametrize("eps", [EPS, 0.1])
def test_gradcheck_in_float64(x_shape, w_shape, eps):
    x = sampled(x_shape, torch.float64).requires_grad_()
    w = sampled(w_shape, torch.float64, low=-2, high=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, eps), (x, w), fast_mode=x.numel() > 512)


def test_no_rows_give_a_zero_weight_gradient():
    x = torch.empty(0, 16, requires_grad=True)
    w = sampled((16,), torch.float32).requires_grad_()
    gx, gw = torch.autograd.grad(rms_norm(x, w, EPS), (x, w), torch.empty(0, 16))
    assert gx.shape == (0, 16)
    assert torch.equal(gw, torch.zeros(16))


@pytest.mark.parametrize("device", DEVICES)
def test_frozen_weight_takes_the_input_only_backward(device):
    x = sampled((33, 65), torch.float32, device).requires_grad_()
    w = sampled((65,), torch.float32, device)
    grad = sampled((33, 65), torch.float32, device)
    (gx,) = torch.autograd.grad(rms_norm(x, w, EPS), (x,), grad)
    assert torch.equal(gx, _backward_input(grad, x.detach(), w, EPS))
    assert torch.equal(gx, _backward(grad, x.detach(), w, EPS)[0])


def test_frozen_input_still_gets_a_weight_gradient():
    x = sampled((33, 65), torch.float32)
    w = sampled((65,), torch.float32).requires_grad_()
    grad = sampled((33, 65), torch.float32)
    (gw,) = torch.autograd.grad(rms_norm(x, w, EPS), (w,), grad)
    assert_close("grad_weight", gw, reference_grads(x, w, grad)[1], 1e-5, 1.3e-6)


def test_double_backward_says_it_is_not_implemented():
    x = sampled((4, 8), torch.float64).requires_grad_()
    w = sampled((8,), torch.float64).requires_grad_()
    (gx,) = torch.autograd.grad(rms_norm(x, w, EPS).sum(), (x,), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward is not implemented"):
        gx.sum().backward()


# 1000 rows of 300: the weight gradient sums 10 fixed chunks of 110 rows, split 5/5 over two threads. One row of
# 3 x 4096 + 5: split by columns, its blocks summed on whichever thread, added in block order.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [(1000, 300), (1, 3 * 4096 + 5)], ids=str)
def test_results_do_not_depend_on_thread_count(dtype, shape):
    x, w, grad = sampled(shape, dtype), sampled(shape[-1:], dtype), sampled(shape, dtype)
    x[0, shape[-1] - 7] = 3e30  # the first row's squares overflow float: summed again in double, both ways
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = (rms_norm(x, w, EPS), *_backward(grad, x, w, EPS))
        torch.set_num_threads(max(2, threads))
        many = (rms_norm(x, w, EPS), *_backward(grad, x, w, EPS))
    finally:
        torch.set_num_threads(threads)
    for name, a, b in zip(("y", "grad_x", "grad_weight"), one, many):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{name} differs between 1 and 2+ threads"


@pytest.mark.parametrize("device", DEVICES)
def test_float32_weight_gradient_over_many_rows_keeps_float32_accuracy(device):
    # A sum over 32768 rows: accumulated in float it drifts by ~1e-4 (outside float32's tolerance wherever the rows
    # cancel); the kernels sum float32's weight gradient in double, so only the final rounding remains.
    rows, hidden = 32768, 64
    x, w = sampled((rows, hidden), torch.float32, device), sampled((hidden,), torch.float32, device)
    grad = torch.randn(rows, hidden, device=device)
    gw = _backward(grad, x, w, EPS)[1]
    assert_close("grad_weight", gw, reference_grads(x, w, grad)[1], atol=1e-5, rtol=1.3e-6)


# ------------------------------------------------------------------------------------------ checks and module


@pytest.mark.parametrize("device", DEVICES)
def test_rejects_bad_arguments_with_clear_messages(device):
    x, w = torch.ones(4, 7, device=device), torch.ones(7, device=device)
    cases = [
        ((x.int(), w.int()), "x must be float32, float64, float16 or bfloat16, got Int"),
        ((x, w.double()), "weight must have x's dtype Float, got Double"),
        ((x, torch.ones(6, device=device)), r"weight must be 1-D with x.size\(-1\) = 7 elements, got shape \[6\]"),
        (
            (x, torch.ones(1, 7, device=device)),
            r"weight must be 1-D with x.size\(-1\) = 7 elements, got shape \[1, 7\]",
        ),
        ((torch.ones((), device=device), torch.ones(1, device=device)), "x must have at least 1 dimension"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            rms_norm(*args)
    with pytest.raises(RuntimeError, match=r"grad must have x's shape \[4, 7\], got \[4, 6\]"):
        _backward(torch.ones(4, 6, device=device), x, w, EPS)
    with pytest.raises(RuntimeError, match="grad must have x's dtype Float, got Double"):
        _backward_input(torch.ones(4, 7, device=device, dtype=torch.float64), x, w, EPS)


@requires_cuda
def test_rejects_weight_on_another_device():
    with pytest.raises(RuntimeError, match="weight must be on x's device"):
        rms_norm(torch.ones(4, 7), torch.ones(7, device="cuda"))


def test_module_matches_the_op():
    module = RMSNorm(65, eps=1e-5)
    assert torch.equal(module.weight.detach(), torch.ones(65))
    with torch.no_grad():
        module.weight.copy_(sampled((65,), torch.float32))
    x = sampled((33, 65), torch.float32)
    assert torch.equal(module(x), rms_norm(x, module.weight, 1e-5))
    assert repr(module) == "RMSNorm(65, eps=1e-05)"
    module.reset_parameters()
    assert torch.equal(module.weight.detach(), torch.ones(65))


def test_compiles_without_graph_breaks():
    x = sampled((33, 65), torch.float32)
    w = sampled((65,), torch.float32)
    grad = sampled((33, 65), torch.float32)

    def loss(a, b):
        return (rms_norm(a, b, EPS) * grad).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (compiled, loss):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(a, b).backward()
        grads.append((a.grad, b.grad))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected)


# -------------------------------------------------------------------------------------------------- CUDA

# Hidden sizes that land in every shape of the CUDA kernels' dispatch tables (rms_norm.cu): in bfloat16 units of 8
# elements, 1, 32, 33, 64, 128, 256, 512, 1024, 2048 (the backward's last register-resident shape), 2049 (its loop
# kernel), 8192 (the forward's last), 8193 (its loop kernel); odd sizes take the scalar fallback (4097: past its
# forward shapes). Rows are enough for the backward's blocks (a few per SM on 132 SMs) to loop over several row
# steps, and for the loop kernels' blocks too at 16392.
CUDA_SWEEP = [
    (20000, 8),
    (9000, 256),
    (9000, 264),
    (5000, 512),
    (3000, 1024),
    (3000, 2048),
    (1500, 4096),
    (700, 8192),
    (300, 16384),
    (600, 16392),
    (40, 65536),
    (40, 65544),
    (9000, 7),
    (3000, 129),
    (700, 1025),
    (300, 2049),
    (300, 4097),
]


def grad_weight_atol(rows: int, dtype) -> float:
    # float32 is summed in double: only the final rounding. float16/bfloat16 are summed in float (their rounding
    # to 16 bits dominates, and rtol covers it); float64's error grows with the number of terms.
    if dtype == torch.float32:
        return 1e-5
    return (1e-12 if dtype == torch.float64 else 2e-6) * rows + 1e-5


@requires_cuda
@pytest.mark.parametrize("rows, hidden", CUDA_SWEEP, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_cuda_kernels_match_reference_in_every_shape(dtype, atol, rtol, rows, hidden):
    x, w = sampled((rows, hidden), dtype, "cuda"), sampled((hidden,), dtype, "cuda", -2, 2)
    grad = sampled((rows, hidden), dtype, "cuda")
    assert_close("y", rms_norm(x, w, EPS), reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
    gx, gw = _backward(grad, x, w, EPS)
    rx, rw = reference_grads(x, w, grad)
    assert_close("grad_x", gx, rx, atol, rtol)
    assert_close("grad_weight", gw, rw, grad_weight_atol(rows, dtype), rtol)
    assert torch.equal(_backward_input(grad, x, w, EPS), gx)


# Widths reaching every shape of the CUDA kernels' dispatch tables (rms_norm.cu), forward and backward: in 16-byte
# units (4 float32 or 8 bfloat16 elements) 1, 64, 128, 256 and 512 (several row groups a block: a group sums again
# while the others go on), 1024, 2048 (the backward's last register-resident shape), 4096 (its loop kernel), 8192 (the
# forward's last), 8193 (its loop kernel); and odd widths for the scalar fallback: 1, 7, 65, 1023, 2047 (its
# backward's last), 4095 (its forward's last), 4097 (both loop kernels).
OVERFLOW_UNITS = [1, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 8193]
OVERFLOW_SCALAR_WIDTHS = [1, 7, 65, 1023, 2047, 4095, 4097]
OVERFLOW_CASES = [
    pytest.param(dtype, atol, rtol, width, id=f"{dtype_id}-{width}")
    for (dtype, atol, rtol), dtype_id in [(DTYPES[0], "float32"), (DTYPES[3], "bfloat16")]
    for width in sorted({units * (16 // dtype.itemsize) for units in OVERFLOW_UNITS} | set(OVERFLOW_SCALAR_WIDTHS))
]


@requires_cuda
@pytest.mark.parametrize("dtype, atol, rtol, width", OVERFLOW_CASES)
def test_cuda_rows_whose_squares_overflow_float_in_every_kernel(dtype, atol, rtol, width):
    rows = 9
    x, w = sampled((rows, width), dtype, "cuda"), sampled((width,), dtype, "cuda", 0.5, 2.0)
    grad = sampled((rows, width), dtype, "cuda")
    ordinary = (rms_norm(x, w, EPS), _backward(grad, x, w, EPS)[0])
    largest = torch.finfo(dtype).max
    x[2, width // 2] = 2e19  # past ~1.8e19: its square overflows float
    x[4, width // 2] = -largest
    x[6] = (1 - 2 * (torch.arange(width, device="cuda") % 2)).to(dtype) * largest  # every element +-max
    y = rms_norm(x, w, EPS)
    grad_x, grad_w = _backward(grad, x, w, EPS)
    others = [0, 1, 3, 5, 7, 8]
    for name, got, before in zip(("y", "grad_x"), (y, grad_x), ordinary):
        assert torch.equal(got[others], before[others]), f"{name}: a row changed with its neighbours' values"
    assert_close("y", y, reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
    expected_x, expected_w = reference_grads(x, w, grad)
    assert_close("grad_x", grad_x, expected_x, atol, rtol)
    assert_close("grad_weight", grad_w, expected_w, grad_weight_atol(rows, dtype), rtol)
    assert torch.equal(_backward_input(grad, x, w, EPS), grad_x)


# A few wide rows are split across blocks (rms_norm.cu, "wide rows"): 1 and 8 rows at the smallest width that splits
# (8192 units: 32768 float32, 65536 bfloat16 elements), one unit more, and an odd width (the scalar path's units).
# Each row holds one value whose square overflows float, which the split kernels' double sums must carry.
SPLIT_CASES = [
    pytest.param(dtype, atol, rtol, rows, width, id=f"{dtype_id}-{rows}x{width}")
    for (dtype, atol, rtol), dtype_id in [(DTYPES[0], "float32"), (DTYPES[3], "bfloat16")]
    for rows in (1, 8)
    for width in (8192 * (16 // dtype.itemsize), 8193 * (16 // dtype.itemsize), 8193)
]


@requires_cuda
@pytest.mark.parametrize("dtype, atol, rtol, rows, width", SPLIT_CASES)
def test_cuda_few_wide_rows_split_across_blocks_match_the_reference(dtype, atol, rtol, rows, width):
    x, w = sampled((rows, width), dtype, "cuda"), sampled((width,), dtype, "cuda", 0.5, 2.0)
    grad = sampled((rows, width), dtype, "cuda")
    x[:, width // 3] = 2e19
    y = rms_norm(x, w, EPS)
    grad_x, grad_w = _backward(grad, x, w, EPS)
    assert_close("y", y, reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
    expected_x, expected_w = reference_grads(x, w, grad)
    assert_close("grad_x", grad_x, expected_x, atol, rtol)
    assert_close("grad_weight", grad_w, expected_w, grad_weight_atol(rows, dtype), rtol)
    assert torch.equal(_backward_input(grad, x, w, EPS), grad_x)
    assert torch.equal(rms_norm(x, w, EPS), y), "a second call gave other bits"


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_unaligned_pointers_take_the_scalar_path(dtype):
    rows, hidden = 300, 4096
    # Contiguous, but one element past a 16-byte boundary: the kernels must not issue 16-byte loads.
    x = sampled(rows * hidden + 1, dtype, "cuda")[1:].view(rows, hidden)
    w = sampled(hidden + 1, dtype, "cuda")[1:]
    grad = sampled((rows, hidden), dtype, "cuda")
    assert x.data_ptr() % 16 != 0
    atol, rtol = {torch.float32: (1e-5, 1.3e-6), torch.bfloat16: (1e-5, 1.6e-2)}[dtype]
    assert_close("y", rms_norm(x, w, EPS), reference(x.double().cpu(), w.double().cpu(), EPS), atol, rtol)
    gx, gw = _backward(grad, x, w, EPS)
    rx, rw = reference_grads(x, w, grad)
    assert_close("grad_x", gx, rx, atol, rtol)
    assert_close("grad_weight", gw, rw, grad_weight_atol(rows, dtype), rtol)


@requires_cuda
@pytest.mark.parametrize("rows, hidden", [(4096, 4096), (3000, 129), (40, 65544)], ids=str)
def test_cuda_backward_is_deterministic(rows, hidden):
    x, w, grad = (
        sampled((rows, hidden), torch.bfloat16, "cuda"),
        sampled((hidden,), torch.bfloat16, "cuda"),
        sampled((rows, hidden), torch.bfloat16, "cuda"),
    )
    first = _backward(grad, x, w, EPS)
    for _ in range(3):
        again = _backward(grad, x, w, EPS)
        for name, a, b in zip(("grad_x", "grad_weight"), first, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} differs between runs"


@requires_cuda
def test_cuda_backward_replays_in_a_cuda_graph():
    rows, hidden = 1500, 4096
    x, w, grad = (
        sampled((rows, hidden), torch.bfloat16, "cuda"),
        sampled((hidden,), torch.bfloat16, "cuda"),
        sampled((rows, hidden), torch.bfloat16, "cuda"),
    )
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _backward(grad, x, w, EPS)  # warm-up outside capture, as CUDA graphs require
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _backward(grad, x, w, EPS)
    for t in (x, w, grad):
        t.copy_(sampled(t.shape, t.dtype, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    for name, got, expected in zip(("grad_x", "grad_weight"), captured, _backward(grad, x, w, EPS)):
        assert torch.equal(got, expected), f"{name}: the graph's replay differs from an eager call on the new inputs"


@pytest.mark.slow
def test_spec_passes_every_check():
    report = run_spec(SPECS / "rms_norm.yaml")
    failed = [r for r in report.results if r.status.failed]
    assert not failed, describe(failed)
