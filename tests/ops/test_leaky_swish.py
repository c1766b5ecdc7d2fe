"""opforge::leaky_swish: direct tests of the kernels, then the whole spec through opforge's own checks."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import DTYPE_IDS, DTYPES, SPECS, describe, requires_cuda, run_spec

from opforge.cases.compare import worst_mismatch
from opforge.core.results import describe_mismatch
from opforge.ops.leaky_swish import (
    LeakySwish,
    leaky_swish,
    leaky_swish_,
    leaky_swish_out,
    leaky_swish_prototype,
    reference,
)
from opforge.spec.model import Tolerance

SHAPES = [(), (0,), (7,), (33, 65), (2, 3, 5, 4)]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def assert_matches_reference(got, x, alpha, atol, rtol, dtype):
    expected = reference(x.double().cpu(), alpha)
    assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
    mismatch = worst_mismatch("result", got, expected, Tolerance(atol, rtol))
    assert mismatch is None, describe_mismatch(mismatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
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


# ------------------------------------------------------------------------ the in-place op and the out= overload

ALPHA = -0.25  # a negative alpha: the kernels must not assume the function is monotonic


def _sampled(shape, dtype, device):
    return (torch.rand(shape, dtype=torch.float64, device=device) * 16 - 8).to(dtype)


def _expected(x, alpha, dtype):
    return reference(x.double().cpu(), alpha).to(dtype)


def _strided_views(dtype, device):
    """(name, view, base): views whose elements are not one dense block, inside a base whose other elements must
    stay as they are."""
    sliced_base = _sampled((33, 130), dtype, device)
    transposed = _sampled((65, 33), dtype, device).t()
    channels_last = _sampled((2, 3, 5, 4), dtype, device).to(memory_format=torch.channels_last)
    return [
        ("strided slice", sliced_base[:, ::2], sliced_base),
        ("transposed", transposed, transposed),
        ("channels_last", channels_last, channels_last),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_inplace_writes_self_and_returns_it(dtype, atol, rtol, shape, device):
    x = _sampled(shape, dtype, device)
    expected = _expected(x, ALPHA, dtype)
    version, data = x._version, x.data_ptr()
    returned = leaky_swish_(x, ALPHA)
    assert returned is x
    assert x.data_ptr() == data and x.shape == shape and x.dtype == dtype
    assert x._version > version, "the version counter must record the write (autograd relies on it)"
    torch.testing.assert_close(x.cpu(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_inplace_on_strided_self_writes_only_its_elements(dtype, atol, rtol, device):
    for name, view, base in _strided_views(dtype, device):
        strides, before_view, before_base = view.stride(), view.clone(), base.clone()
        assert leaky_swish_(view, ALPHA) is view
        assert view.stride() == strides, name
        torch.testing.assert_close(
            view.cpu(),
            _expected(before_view, ALPHA, dtype),
            atol=atol,
            rtol=rtol,
            msg=lambda m, name=name: f"{name}: {m}",
        )
        untouched = torch.ones_like(base, dtype=torch.bool)
        untouched.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset()).fill_(False)
        assert torch.equal(base[untouched], before_base[untouched]), f"{name}: elements outside self were written"


def test_inplace_refuses_a_self_whose_elements_overlap():
    expanded = torch.randn(1, 5).expand(3, 5)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
        leaky_swish_(expanded)


def test_inplace_rejects_integer_self_with_a_clear_message():
    message = "opforge::leaky_swish_: self must be float32, float64, float16 or bfloat16, got Int"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        leaky_swish_(torch.ones(3, dtype=torch.int32))


@pytest.mark.parametrize("shape", [(7,), (4, 6)], ids=str)
def test_inplace_is_differentiable_like_torchs_inplace_ops(shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)

    def on_a_copy(t):
        return leaky_swish_(t * 1.5, 0.3)

    assert torch.autograd.gradcheck(on_a_copy, (x,))
    assert torch.autograd.gradgradcheck(on_a_copy, (x,))

    def on_a_view(t):
        copy = t.clone()
        leaky_swish_(copy[..., 1::2], 0.3)  # the rest of copy passes its gradient through unchanged
        return copy

    assert torch.autograd.gradcheck(on_a_view, (x,))
    assert torch.autograd.gradgradcheck(on_a_view, (x,))
    # The gradient is the functional op's, at the value self had before the write.
    y = x.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(leaky_swish(y * 2, 0.3).sum(), y)
    (got,) = torch.autograd.grad(leaky_swish_(x * 2, 0.3).sum(), x)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


def test_inplace_on_a_leaf_that_requires_grad_is_refused_as_torch_does():
    leaf = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"a leaf Variable that requires grad .* in-place operation"):
        leaky_swish_(leaf)
    with torch.no_grad():
        leaky_swish_(leaf)  # as torch.relu_ under no_grad: allowed, and untracked


def test_saved_self_overwritten_by_the_inplace_op_is_caught_at_backward():
    x = torch.randn(5, requires_grad=True)
    y = x * 1.0
    z = y.exp()  # saves y's value (its result) for backward
    w = y * y  # saves y
    leaky_swish_(y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (w.sum() + z.sum()).backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_out_writes_out_and_returns_it(dtype, atol, rtol, shape, device):
    x = _sampled(shape, dtype, device)
    x_before = x.clone()
    out = torch.full(shape, float("nan"), dtype=dtype, device=device)
    returned = leaky_swish_out(x, ALPHA, out=out)
    assert returned is out
    assert torch.equal(x, x_before), "x must not be written"
    torch.testing.assert_close(out.cpu(), _expected(x, ALPHA, dtype), atol=atol, rtol=rtol)
    # The same kernel as the functional op: bitwise the same values.
    torch.testing.assert_close(out, leaky_swish(x, ALPHA), atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES, ids=DTYPE_IDS)
def test_out_writes_through_a_strided_out(dtype, atol, rtol, device):
    for name, out, base in _strided_views(dtype, device):
        x = _sampled(out.shape, dtype, device)  # contiguous: out's layout differs from x's
        strides, before_base = out.stride(), base.clone()
        assert leaky_swish_out(x, ALPHA, out=out) is out
        assert out.stride() == strides, f"{name}: out of x's shape must keep its strides"
        torch.testing.assert_close(
            out.cpu(), _expected(x, ALPHA, dtype), atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}"
        )
        untouched = torch.ones_like(base, dtype=torch.bool)
        untouched.as_strided(out.shape, out.stride(), out.storage_offset() - base.storage_offset()).fill_(False)
        assert torch.equal(base[untouched], before_base[untouched]), f"{name}: elements outside out were written"


@pytest.mark.parametrize("x_shape, out_shape", [((33, 65), (3,)), ((7,), (2, 2)), ((), (5,)), ((0,), (4,))], ids=str)
def test_out_of_another_shape_is_resized_with_atens_warning(x_shape, out_shape, capfd):
    x = _sampled(x_shape, torch.float32, "cpu")
    out = torch.empty(out_shape)
    assert leaky_swish_out(x, ALPHA, out=out) is out
    assert out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out, _expected(x, ALPHA, torch.float32), atol=1e-5, rtol=1.3e-6)
    # ATen's resize_output warns through c10's handler, which prints to stderr for torch.ops calls.
    assert "An output with one or more elements was resized" in capfd.readouterr().err


def test_an_empty_out_is_resized_without_a_warning(capfd):
    x = _sampled((33, 65), torch.float32, "cpu")
    out = torch.empty(0)
    leaky_swish_out(x, out=out)
    assert out.shape == x.shape
    torch.testing.assert_close(out, _expected(x, 0.1, torch.float32), atol=1e-5, rtol=1.3e-6)
    assert "was resized" not in capfd.readouterr().err


def test_out_may_be_x_itself_but_not_overlap_it_partly():
    x = torch.randn(33, 65)
    expected = leaky_swish(x)
    assert leaky_swish_out(x, out=x) is x
    torch.testing.assert_close(x, expected, atol=0, rtol=0)
    base = torch.randn(10)
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor refer"):
        leaky_swish_out(base[1:], out=base[:-1])


@pytest.mark.parametrize(
    "out_dtype, message",
    [
        (torch.float64, "opforge::leaky_swish.out: out must have x's dtype Float, got Double. Allocate out"),
        (torch.bfloat16, "opforge::leaky_swish.out: out must have x's dtype Float, got BFloat16"),
        (torch.int32, "opforge::leaky_swish.out: out must have x's dtype Float, got Int"),
    ],
    ids=str,
)
def test_out_of_another_dtype_is_refused(out_dtype, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        leaky_swish_out(torch.randn(7), out=torch.empty(7, dtype=out_dtype))


def test_out_with_integer_x_is_refused():
    message = "opforge::leaky_swish.out: x must be float32, float64, float16 or bfloat16, got Int"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        leaky_swish_out(torch.ones(7, dtype=torch.int32), out=torch.empty(7, dtype=torch.int32))


@requires_cuda
def test_out_on_another_device_is_refused():
    with pytest.raises(RuntimeError, match="out must be on x's device cpu, got cuda"):
        leaky_swish_out(torch.randn(7), out=torch.empty(7, device="cuda"))
    with pytest.raises(RuntimeError, match="out must be on x's device cuda:0, got cpu"):
        leaky_swish_out(torch.randn(7, device="cuda"), out=torch.empty(7))


def test_out_refuses_autograd_as_torchs_out_ops_do():
    x = torch.randn(7, requires_grad=True)
    with pytest.raises(RuntimeError, match=re.escape("out=... arguments don't support automatic differentiation")):
        leaky_swish_out(x, out=torch.empty(7))
    out = torch.empty(7)
    with torch.no_grad():
        version = out._version
        leaky_swish_out(x, out=out)
    assert out._version > version
    torch.testing.assert_close(out, leaky_swish(x.detach()), atol=0, rtol=0)


@pytest.fixture
def uncached_compile():
    """torch.compile without its on-disk caches: the traced graphs come from the Python functionalization rules in
    opforge/ops/leaky_swish.py, which the caches' keys do not cover, so an entry written by an older version of those
    rules would be served as if it were current."""
    import torch._functorch.config
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.usefixtures("uncached_compile")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_accepts_both_mutating_ops(device):
    def step(x, out):
        y = x * 2
        leaky_swish_(y, 0.2)  # a graph intermediate, written in place
        leaky_swish_out(y, ALPHA, out=out)  # a graph input, written through out=
        return y + 1

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for shape in [(7,), (33, 65), (2, 3, 5, 4)]:
        x = _sampled(shape, torch.float32, device)
        eager_out, compiled_out = torch.empty_like(x), torch.empty_like(x)
        expected = step(x, eager_out)
        got = compiled(x, compiled_out)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1.3e-6)
        torch.testing.assert_close(compiled_out, eager_out, atol=1e-5, rtol=1.3e-6)
    # A graph input written in place, and the alias the op returns.
    inplace = torch.compile(lambda t: leaky_swish_(t, ALPHA), fullgraph=True, dynamic=True)
    x = _sampled((33, 65), torch.float32, device)
    expected = _expected(x, ALPHA, torch.float32)
    returned = inplace(x)
    torch.testing.assert_close(x.cpu(), expected, atol=1e-5, rtol=1.3e-6)
    torch.testing.assert_close(returned.cpu(), expected, atol=1e-5, rtol=1.3e-6)
    # A strided self under compile.
    base = _sampled((33, 130), torch.float32, device)
    view, before = base[:, ::2], base.clone()
    inplace(view)
    torch.testing.assert_close(
        base[:, ::2].cpu(), _expected(before[:, ::2], ALPHA, torch.float32), atol=1e-5, rtol=1.3e-6
    )
    assert torch.equal(base[:, 1::2], before[:, 1::2])


@pytest.mark.usefixtures("uncached_compile")
def test_torch_compile_differentiates_through_the_inplace_op():
    def loss(t):
        y = t * 1.5
        leaky_swish_(y, 0.3)
        return (y * y).sum()

    x = torch.randn(33, 65, requires_grad=True)
    (expected,) = torch.autograd.grad(loss(x), x)
    (got,) = torch.autograd.grad(torch.compile(loss, fullgraph=True, dynamic=True)(x), x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1.3e-6)


@pytest.mark.usefixtures("uncached_compile")
def test_torch_compile_of_the_functional_op_survives_its_out_overload():
    # torch 2.13's inductor lowers a functional custom op to an overload tagged torch.Tag.out and, with dynamic
    # shapes, fails an assertion doing so (leaky_swish.cpp tags the overload only from 2.14 on).
    def chain(x):
        y = leaky_swish(x * 2, 0.2)
        z = leaky_swish(y * 3, ALPHA)
        return y + z, z * 2

    compiled = torch.compile(chain, fullgraph=True, dynamic=True)
    for shape in [(7,), (33, 65)]:
        x = _sampled(shape, torch.float32, "cpu")
        for got, expected in zip(compiled(x), chain(x)):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1.3e-6)


@pytest.mark.usefixtures("uncached_compile")
def test_torch_compile_refuses_an_out_it_would_have_to_resize():
    compiled = torch.compile(lambda t, o: leaky_swish_out(t, out=o), fullgraph=True, dynamic=False)
    with pytest.raises(Exception, match=re.escape("out must have x's shape (5,) under torch.compile, got (3,)")):
        compiled(torch.randn(5), torch.empty(3))


def test_fakes_match_the_kernels():
    x = torch.randn(33, 65)
    torch.library.opcheck(torch.ops.opforge.leaky_swish_.default, (x.clone(), ALPHA))
    torch.library.opcheck(torch.ops.opforge.leaky_swish.out, (x, ALPHA), {"out": torch.empty_like(x)})
