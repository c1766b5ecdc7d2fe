"""The spec's `bench:` section and its bytes expressions: what loads, and file:line errors for what does not."""

from __future__ import annotations

import shutil

import pytest
from helpers import FIXTURES, SPECS

from opforge.core.errors import SpecError
from opforge.core.schema import return_names
from opforge.loading.spec import load_spec
from opforge.spec.bytes_expr import ExpressionError, TensorSize, evaluate, parse

BASE = """\
op: opforge_test::good
schema: "opforge_test::good(Tensor x) -> Tensor"
load:
  python: [broken_ops]
reference: broken_ops:reference
inputs:
  x: {shapes: [[], [7]], low: -2, high: 2, requires_grad: true}
dtypes: [float32]
"""

X = TensorSize((1024,), 4)
NAMES = {"x", "result", "grad_result", "grad_x", "alpha"}


def write(tmp_path, bench_yaml: str, base: str = BASE):
    shutil.copy(FIXTURES / "broken_ops.py", tmp_path / "broken_ops.py")
    path = tmp_path / "op.yaml"
    path.write_text(base + bench_yaml)
    return path


@pytest.mark.parametrize(
    "text, value",
    [
        ("x.nbytes + result.nbytes", 8192),
        ("x.numel() * x.element_size() * 2", 8192),
        ("numel(x) * element_size(x) + nbytes(result)", 8192),
        ("3 * x.nbytes // 2 - 0 ** 0 + 1", 6144),
        ("max(x.numel, 10) * 2 ** 2", 4096),
        ("x.ndim + alpha", 1.5),
        ("-x.numel + 2 * x.numel", 1024),
    ],
)
def test_expressions_evaluate(text, value):
    assert evaluate(parse(text, NAMES), {"x": X, "result": X, "alpha": 0.5}) == value


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("__import__('os').system('true')", "the attribute .system"),
        ("__import__('os')", "a call of __import__"),
        ("x.__class__", "the attribute .__class__"),
        ("open('f')", "a call of open"),
        ("'a' * 3", "the constant 'a'"),
        ("x.nbytes if x else 0", "IfExp"),
        ("x.nbytes < 3", "Compare"),
        ("[x.nbytes]", "List"),
        ("lambda: 1", "Lambda"),
        ("y.nbytes", "the unknown name 'y'"),
        ("x.nbytes +", "syntax error"),
        ("x.nbytes & 1", "BitAnd"),
        ("max(x.numel, key=1)", "keyword"),
        ("x.numel(2)", "arguments to .numel()"),
        ("True + 1", "the constant True"),
    ],
)
def test_expressions_outside_the_whitelist_are_refused(text, fragment):
    with pytest.raises(ExpressionError, match=None) as info:
        parse(text, NAMES)
    assert fragment in str(info.value)


def test_huge_exponents_and_missing_names_fail_at_evaluation():
    with pytest.raises(ExpressionError, match="exponent"):
        evaluate(parse("2 ** 10 ** 10", NAMES), {})
    with pytest.raises(ExpressionError, match="'grad_x', which this benchmark mode does not have"):
        evaluate(parse("grad_x.nbytes", NAMES), {"x": X})
    with pytest.raises(ExpressionError, match="non-tensor"):
        evaluate(parse("alpha.nbytes", NAMES), {"alpha": 0.1})


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("2 * x", "x is a tensor: use x.nbytes or x.numel()"),
        ("max(x, 10)", "x is a tensor: use x.nbytes or x.numel()"),
        ("-x", "x is a tensor"),
        ("x", "x is a tensor"),
        ("x.nbytes * 1e308 * 1e308", "not a finite number"),
    ],
)
def test_tensors_as_numbers_and_infinite_values_are_expression_errors(text, fragment):
    with pytest.raises(ExpressionError) as info:
        evaluate(parse(text, NAMES), {"x": X, "result": X})
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "schema, names",
    [
        ("ns::f(Tensor x) -> Tensor", ("result",)),
        ("ns::f(Tensor(a!) x) -> ()", ()),
        ("ns::f(Tensor x) -> (Tensor, Tensor)", ("result0", "result1")),
        ("ns::f(Tensor x) -> (Tensor values, Tensor indices)", ("values", "indices")),
        ("ns::f(Tensor(a!) x) -> Tensor(a!)", ("result",)),
    ],
)
def test_return_names(schema, names):
    assert return_names(schema) == names


def test_bundled_specs_declare_benchmarks():
    leaky = load_spec(SPECS / "leaky_swish.yaml").bench
    assert leaky.sizes == (2**12, 2**16, 2**20, 2**24) and leaky.modes == ("fwd", "bwd")
    assert dict(leaky.bytes)["bwd"] == "grad_result.nbytes + x.nbytes + grad_x.nbytes"
    loss = load_spec(SPECS / "custom_loss.yaml").bench
    assert loss.shapes == ((("pred", (4096, 4096)), ("target", (4096,))),)


def test_a_spec_without_bench_has_none(tmp_path):
    assert load_spec(write(tmp_path, "")).bench is None


def test_bench_section_loads_with_defaults_left_empty(tmp_path):
    bench = load_spec(write(tmp_path, "bench:\n  sizes: [7, 2**4, '2^5']\n  bytes: '2 * x.nbytes'\n")).bench
    assert bench.sizes == (7, 16, 32) and bench.dtypes == () and bench.modes == ()
    assert bench.bytes == (("fwd", "2 * x.nbytes"),) and dict(bench.lines)["fwd"] == 11


@pytest.mark.parametrize(
    "bench_yaml, line, key, fragment",
    [
        ("bench:\n  sizes: [8]\n  bytes: 'x.nbytes + os.system(1)'\n", 11, "bench.bytes", "the attribute .system"),
        (
            "bench:\n  sizes: [8]\n  bytes: {fwd: 'x.nbytes', bwd: 'grad_y.nbytes'}\n",
            11,
            "bench.bytes.bwd",
            "the unknown name 'grad_y'",
        ),
        ("bench:\n  sizes: [8]\n  bytes: {fdw: 'x.nbytes'}\n", 11, "bench.bytes.fdw", "Did you mean 'fwd'?"),
        ("bench:\n  sizes: [8, -3]\n", 10, "bench.sizes[1]", "a number of elements > 0"),
        ("bench:\n  sizes: [2**k]\n", 10, "bench.sizes[0]", "a number of elements > 0"),
        ("bench:\n  dtypes: [float32]\n", 10, "bench", "`sizes:` (numel of every tensor input) or `shapes:`"),
        ("bench:\n  sizes: [8]\n  mode: [fwd]\n", 11, "bench.mode", "Did you mean 'modes'?"),
        ("bench:\n  sizes: [8]\n  modes: [fwd, back]\n", 11, "bench.modes[1]", "one of fwd, bwd, fwd+bwd"),
        ("bench:\n  shapes: {y: [[8]]}\n", 10, "bench.shapes.y", "unknown key 'y'"),
        # A forward has no gradients; a backward has no gradient of an input without requires_grad.
        ("bench:\n  sizes: [8]\n  bytes: 'grad_x.nbytes'\n", 11, "bench.bytes", "the unknown name 'grad_x'"),
        (
            "bench:\n  sizes: [8]\n  bytes: {bwd: 'grad_result.nbytes + grad_x.nbytes + grad_y.nbytes'}\n",
            11,
            "bench.bytes.bwd",
            "the unknown name 'grad_y'",
        ),
        (
            "bench:\n  sizes: [8]\n  dtypes: [float32, bfloat16]\n",
            11,
            "bench.dtypes[1]",
            "one of the spec's dtypes (float32), got 'bfloat16'",
        ),
        (
            "bench:\n  sizes: [8]\n  devices: [cuda]\n",
            11,
            "bench.devices[0]",
            "one of the spec's devices (cpu), got 'cuda'",
        ),
    ],
)
def test_bad_bench_sections_name_file_line_and_key(tmp_path, bench_yaml, line, key, fragment):
    path = write(tmp_path, bench_yaml)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: {key}: expected "), message
    assert fragment in message


def test_paired_bench_shapes_must_agree(tmp_path):
    base = BASE.replace("Tensor x) -> Tensor", "Tensor x, Tensor y) -> Tensor").replace(
        "  x: {shapes: [[], [7]], low: -2, high: 2, requires_grad: true}\n",
        "  x: {shapes: [[], [7]], low: -2, high: 2, requires_grad: true}\n  y: {shapes: [[], [7]]}\n",
    )
    path = write(tmp_path, "bench:\n  shapes: {x: [[8, 4], [8]], y: [[4]]}\n", base)
    with pytest.raises(SpecError, match=r"op.yaml:11: bench.shapes: expected the same number of shapes .* x: 2, y: 1"):
        load_spec(path)


def test_backward_modes_need_a_differentiable_op(tmp_path):
    path = write(tmp_path, "differentiable: false\nbench:\n  sizes: [8]\n  modes: [fwd, bwd]\n")
    with pytest.raises(SpecError, match=r"op.yaml:12: bench.modes: expected only fwd"):
        load_spec(path)


def test_backward_modes_need_an_input_that_requires_grad(tmp_path):
    base = BASE.replace("requires_grad: true", "requires_grad: false")
    path = write(tmp_path, "bench:\n  sizes: [8]\n  modes: [fwd+bwd]\n", base)
    with pytest.raises(
        SpecError,
        match=r"op.yaml:11: bench.modes: expected only fwd for an op with differentiable: "
        r"false or no input with requires_grad: true, got fwd\+bwd",
    ):
        load_spec(path)
    assert load_spec(write(tmp_path, "bench:\n  sizes: [8]\n", base)).bench_modes == ("fwd",)
