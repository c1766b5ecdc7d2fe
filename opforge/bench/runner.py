"""Planning and running a spec's benchmarks: cases, verification against the reference, bytes moved, timing.

Every implementation (the op itself, the spec's `implementations`) is first checked on the benchmark's own inputs
with the same checks `opforge check` runs (`correctness` for the forward, `grad_lowp` for the gradients); one
that does not match the reference at the spec's tolerance is a WRONG row and is not timed. The baselines, the
reference run eagerly in the benchmark's dtype and `torch.compile` of it, are timed as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from opforge.bench import expr
from opforge.bench.model import BASELINE, ERROR, IMPLEMENTATION, OK, WRONG, BenchResult
from opforge.bench.timing import TimingOptions, time_callable
from opforge.cases import Case, CaseInputs, make_inputs
from opforge.compare import CheckFailure, ReferenceFailure, as_tuple
from opforge.errors import SpecError, UsageError
from opforge.loading import LoadedOp, Target
from opforge.spec import POWER_OF_TWO, BENCH_MODES, FLOATING_DTYPES, BenchSpec, OpSpec, ScalarInput

EAGER, COMPILE = "eager", "compile"
BASELINES = (EAGER, COMPILE)


@dataclass(frozen=True)
class BenchFilters:
    """Command-line selections; empty means the spec's `bench:` defaults."""

    devices: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    impls: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class BenchPoint:
    """One (device, dtype, mode, size) point every contender is timed on."""

    mode: str
    case: Case
    label: str
    elements: int

    @property
    def device(self) -> str:
        return self.case.device

    @property
    def dtype(self) -> str:
        return self.case.dtype


@dataclass(frozen=True)
class Contender:
    name: str
    role: str
    fn: Callable[..., Any] | None  # None for the compile baseline: compiled per point
    target: Target | None = None


# ---------------------------------------------------------------------------------------------------- planning


def bench_section(spec: OpSpec, filters: BenchFilters) -> BenchSpec:
    if spec.bench is None and not filters.sizes:
        raise UsageError(f"opforge bench {spec.name}", f"a `bench:` section in {spec.path}", "none",
                         "Add one (see docs/specs.md, `bench`) or pass --sizes.")
    return spec.bench or BenchSpec()


def selected(spec: OpSpec, filters: BenchFilters) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(devices, dtypes, modes): the command line's choice, checked against what the op claims, else the bench
    section's, else the spec's."""
    bench = bench_section(spec, filters)
    modes_claimed = BENCH_MODES if spec.differentiable else ("fwd",)
    devices = _choose(filters.devices, bench.devices or spec.devices, spec.devices, "--device", spec)
    default_dtypes = bench.dtypes or tuple(d for d in spec.dtypes if d in FLOATING_DTYPES) or spec.dtypes
    dtypes = _choose(filters.dtypes, default_dtypes, spec.dtypes, "--dtype", spec)
    default_modes = bench.modes or (("fwd", "bwd") if spec.differentiable else ("fwd",))
    modes = _choose(filters.modes, default_modes, modes_claimed, "--mode", spec)
    return devices, dtypes, modes


def _choose(given: tuple[str, ...], default: tuple[str, ...], claimed: tuple[str, ...], option: str,
            spec: OpSpec) -> tuple[str, ...]:
    for value in given:
        if value not in claimed:
            raise UsageError(option, f"one of {', '.join(claimed)} (what {spec.name}'s spec claims)", repr(value),
                             f"Pick one the op supports or add it to {spec.path.name}.")
    return given or default


def size_points(spec: OpSpec, filters: BenchFilters) -> list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]]:
    """(label, shape of each tensor input) per size point: `sizes` give every tensor input the shape (n,)."""
    bench = bench_section(spec, filters)
    tensors = [t.name for t in spec.tensor_inputs()]
    sizes = filters.sizes or bench.sizes
    points = [(f"n={_size_label(n)}", tuple((name, (n,)) for name in tensors)) for n in sizes]
    if not filters.sizes:
        points += [(",".join(f"{name}={'x'.join(map(str, shape)) or '0d'}" for name, shape in shapes), shapes)
                   for shapes in bench.shapes]
    return points


def parse_sizes(texts: list[str]) -> tuple[int, ...]:
    """--sizes values: comma-separated element counts, each an integer or 2**k / 2^k."""
    sizes = []
    for text in texts:
        for item in filter(None, (t.strip() for t in text.split(","))):
            match = POWER_OF_TWO.match(item)
            value = 2 ** int(match.group(1)) if match else int(item) if item.isdigit() else 0
            if value <= 0:
                raise UsageError("--sizes", "element counts > 0 such as 65536 or 2**24", repr(item),
                                 "Separate sizes with commas.")
            sizes.append(value)
    return tuple(sizes)


def _size_label(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


def plan_points(spec: OpSpec, filters: BenchFilters, devices: tuple[str, ...]) -> list[BenchPoint]:
    _, dtypes, modes = selected(spec, filters)
    values = tuple((i.name, i.values[0]) for i in spec.inputs if isinstance(i, ScalarInput))
    points = []
    for device in devices:
        for dtype in dtypes:
            for mode in modes:
                for index, (label, shapes) in enumerate(size_points(spec, filters)):
                    case = Case(dtype, device, "contiguous", shapes, values, values_index=0, shape_index=index)
                    elements = max((math.prod(s) for _, s in shapes), default=1)
                    points.append(BenchPoint(mode, case, label, elements))
    return points


def contenders(loaded: LoadedOp, filters: BenchFilters) -> list[Contender]:
    everyone = [Contender(t.name, IMPLEMENTATION, t.fn, t) for t in loaded.targets] + \
        [Contender(EAGER, BASELINE, loaded.reference), Contender(COMPILE, BASELINE, None)]
    known = [c.name for c in everyone]
    for name in filters.impls:
        if name not in known:
            raise UsageError("--impl", f"one of {', '.join(known)}", repr(name), "Pick one of the op's contenders.")
    return [c for c in everyone if not filters.impls or c.name in filters.impls]


# ----------------------------------------------------------------------------------------------------- running


def run_point(loaded: LoadedOp, point: BenchPoint, chosen: list[Contender], timing: TimingOptions, seed: int,
              peak_gbps: float | None, on_result: Callable[[BenchResult], None] | None = None) -> list[BenchResult]:
    """Every contender on one point. Inputs are made once and shared, so contenders see the same values."""
    results = []

    def emit(contender: Contender, status: str, **fields) -> None:
        result = BenchResult(loaded.spec.name, contender.name, contender.role, point.device, point.dtype, point.mode,
                             point.label, point.elements, status, peak_gbps=peak_gbps, **fields)
        results.append(result)
        if on_result:
            on_result(result)

    try:
        inputs = make_inputs(loaded.spec, loaded.arguments, point.case, seed, requires_grad=point.mode != "fwd")
    except Exception as exc:
        for contender in chosen:
            emit(contender, ERROR, message=f"could not make the inputs: {_short(exc)}")
        return results
    nbytes = bytes_moved(loaded, point.mode, inputs)
    for contender in chosen:
        status, fields = _run_contender(loaded, point, contender, inputs, timing, seed)
        emit(contender, status, bytes=nbytes, **fields)
    return results


def _run_contender(loaded: LoadedOp, point: BenchPoint, contender: Contender, inputs: CaseInputs,
                   timing: TimingOptions, seed: int) -> tuple[str, dict]:
    fields: dict = {}
    if contender.role == IMPLEMENTATION:
        status, fields = verify(loaded, contender.target, point, seed)
        if status is not None:
            return status, fields
    try:
        fn = contender.fn if contender.fn is not None else compiled_reference(loaded)
        call = mode_callable(loaded, fn, inputs, point.mode, seed)
        return OK, {**fields, "timing": time_callable(call, point.device, timing)}
    except Exception as exc:  # a contender that cannot run costs its row, not the benchmark
        return ERROR, {"message": f"{contender.name} raised {_short(exc)}"}


def verify(loaded: LoadedOp, target: Target, point: BenchPoint, seed: int) -> tuple[str | None, dict]:
    """(None, fields) when the implementation may be timed, else (WRONG or ERROR, the row's fields).

    A mismatch the spec declares as xfail (for this implementation, check, dtype, device) is timed, with a note.
    """
    from opforge.checks import CheckContext
    from opforge.checks.numerics import correctness, grad_lowp

    checks = {"fwd": [("correctness", correctness)], "bwd": [("grad_lowp", grad_lowp)],
              "fwd+bwd": [("correctness", correctness), ("grad_lowp", grad_lowp)]}[point.mode]
    context = CheckContext(loaded, seed)
    notes = []
    for name, check in checks:
        try:
            check(context, target, point.case)
        except CheckFailure as failure:
            xfail = loaded.spec.xfail_for(target.name, name, point.dtype, point.device)
            if xfail is None:
                return WRONG, {"message": f"{name}: {failure.message}", "mismatch": failure.mismatch}
            notes.append(f"{name} xfail: {xfail.reason}")
        except ReferenceFailure as exc:
            return ERROR, {"message": str(exc)}
    return None, {"message": "; ".join(notes)} if notes else {}


def compiled_reference(loaded: LoadedOp) -> Callable[..., Any]:
    """torch.compile of the reference, compiled afresh for each point with static shapes: one compilation per
    point is what a user's model gets, and dynamo's recompile limit (8 per function) would otherwise send later
    points back to eager silently."""
    import torch

    torch._dynamo.reset()
    return torch.compile(loaded.reference, dynamic=False)


def mode_callable(loaded: LoadedOp, fn: Callable[..., Any], inputs: CaseInputs, mode: str,
                  seed: int) -> Callable[[], Any]:
    """What one timed call does. fwd: the call. bwd: autograd.grad through a graph built once (retain_graph), so
    only the backward runs. fwd+bwd: the call, then autograd.grad."""
    import torch

    def call():
        return fn(*inputs.args, **inputs.kwargs)

    if mode == "fwd":
        return call
    from opforge.checks.calls import argument, differentiated

    wrt = [argument(inputs, loaded, name) for name in differentiated(loaded, inputs)]
    outputs = _differentiable(call())
    if not outputs:
        raise RuntimeError("no output requires grad: there is no backward to time")
    grad_outputs = [_random_like(o, seed + i) for i, o in enumerate(outputs)]
    if mode == "bwd":
        return lambda: torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=True)
    return lambda: torch.autograd.grad(_differentiable(call()), wrt, grad_outputs)


def _differentiable(returned: Any) -> list[Any]:
    import torch

    return [o for o in as_tuple(returned) if isinstance(o, torch.Tensor) and o.requires_grad]


def _random_like(t, seed: int):
    import torch

    generator = torch.Generator(device=t.device).manual_seed(seed)
    return torch.randn(t.shape, generator=generator, dtype=t.dtype, device=t.device)


def _short(exc: BaseException) -> str:
    from opforge.checks.calls import short

    return short(exc)


# ----------------------------------------------------------------------------------------------- bytes moved


def bytes_moved(loaded: LoadedOp, mode: str, inputs: CaseInputs) -> int | None:
    """Bytes one call moves: the spec's `bench.bytes` expression for the mode, else the default count.

    Default: fwd reads every tensor input once and writes every output (and mutated argument) once; bwd reads each
    output's gradient and every tensor input once and writes each differentiated input's gradient once; fwd+bwd is
    the sum. None when the op's outputs cannot be known (its call raised: its row says why).
    """
    sizes = _sizes(loaded, inputs, with_gradients=mode != "fwd")
    if sizes is None:
        return None
    expressions = dict(loaded.spec.bench.bytes) if loaded.spec.bench else {}
    if mode in expressions:
        return _evaluate(loaded.spec, mode, expressions[mode], sizes)
    if mode == "fwd+bwd":
        return sum(bytes_moved_for(loaded, part, expressions, sizes) for part in ("fwd", "bwd"))
    return bytes_moved_for(loaded, mode, expressions, sizes)


def bytes_moved_for(loaded: LoadedOp, mode: str, expressions: dict[str, str], sizes: dict[str, Any]) -> int:
    if mode in expressions:
        return _evaluate(loaded.spec, mode, expressions[mode], sizes)
    tensors = {n: s for n, s in sizes.items() if isinstance(s, expr.TensorSize)}
    inputs = [s for n, s in tensors.items() if n in _input_names(loaded)]
    outputs = [s for n, s in tensors.items() if n in _output_names(loaded)]
    if mode == "fwd":
        mutated = [tensors[n] for n in loaded.mutated_arguments if n in tensors]
        return sum(t.nbytes for t in inputs + outputs + mutated)
    grads = [s for n, s in tensors.items() if n.startswith("grad_") and n[5:] in _input_names(loaded)]
    return sum(t.nbytes for t in outputs + inputs + grads)


def _sizes(loaded: LoadedOp, inputs: CaseInputs, with_gradients: bool) -> dict[str, Any] | None:
    """The names an expression can use, bound to TensorSize (tensors) or values (scalars); grad_<output> and
    grad_<input> (the same sizes) for the modes that run a backward."""
    import torch

    from opforge.checks.calls import argument

    names = _input_names(loaded)
    values = {n: _size_of(argument(inputs, loaded, n)) for n in names}
    try:
        with torch.no_grad():
            returned = loaded.overload(*inputs.args, **inputs.kwargs)
    except Exception:
        return None
    returned = as_tuple(returned) if loaded.overload._schema.returns else ()
    for name, value in zip(_output_names(loaded), returned):
        values[name] = _size_of(value)
        if with_gradients:
            values[f"grad_{name}"] = values[name]
    for name in inputs.tensor_names if with_gradients else ():
        if isinstance(values.get(name), expr.TensorSize) and argument(inputs, loaded, name).requires_grad:
            values[f"grad_{name}"] = values[name]
    return values


def _size_of(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return expr.TensorSize(tuple(value.shape), value.element_size())
    return value


def _input_names(loaded: LoadedOp) -> list[str]:
    return [i.name for i in loaded.spec.inputs]


def _output_names(loaded: LoadedOp) -> tuple[str, ...]:
    return expr.return_names(loaded.spec.schema)


def _evaluate(spec: OpSpec, mode: str, text: str, sizes: dict[str, Any]) -> int:
    key = "bench.bytes" if dict(spec.bench.bytes).keys() == {"fwd"} and mode == "fwd" else f"bench.bytes.{mode}"
    try:
        value = expr.evaluate(expr.parse(text, set(sizes)), sizes)
    except (expr.ExpressionError, ArithmeticError) as exc:
        raise SpecError(spec.path, dict(spec.bench.lines).get(mode), key, "an expression this mode can evaluate",
                        str(exc), "Use the names listed (see docs/specs.md, `bench.bytes`).") from None
    if not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
        raise SpecError(spec.path, dict(spec.bench.lines).get(mode), key, "a number of bytes >= 0", repr(value),
                        "Fix the expression.")
    return int(value)


def runnable_devices(spec: OpSpec, filters: BenchFilters) -> tuple[tuple[str, ...], dict[str, str]]:
    """(devices to run, {device: why it is skipped})."""
    from opforge.runner import device_unavailable

    devices, _, _ = selected(spec, filters)
    reasons = {d: device_unavailable(d) for d in devices}
    return tuple(d for d in devices if reasons[d] is None), {d: r for d, r in reasons.items() if r}
