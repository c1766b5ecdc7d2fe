"""What the checks share about an implementation and its reference: making a case's inputs, calling both with failures
attributed to the right side, gradients, and comparing what they return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opforge.building.op import NATIVE, Implementation, LoadedOp
from opforge.cases.arguments import CaseInputs, make_inputs
from opforge.cases.compare import Baseline, as_tuple, check_result, leaves, paired_leaves, returned_values, rule_for
from opforge.cases.matrix import Case
from opforge.core.outcomes import CheckFailure, PassDetail, ReferenceFailure, short
from opforge.core.schema import return_names
from opforge.spec.model import FLOATING_DTYPES, OpSpec

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch._C import JitType

# How a mutated argument is named among the compared values.
MUTATED = " (mutated)"


def inputs_for(loaded: LoadedOp, case: Case, base_seed: int, requires_grad: bool = False) -> CaseInputs:
    try:
        return make_inputs(
            loaded.spec, loaded.arguments, case, base_seed, requires_grad, loaded.generators, loaded.samples
        )
    except Exception as exc:
        raise ReferenceFailure(f"could not make the inputs: {short(exc)}") from exc


def call_implementation(
    implementation: Implementation, inputs: CaseInputs, after_launch: Callable[[], None] | None = None
) -> Any:
    """`after_launch`: called once the op returned, before its kernels are waited for (the stream check looks at
    its producer stream there: after the wait every stream is idle)."""
    try:
        returned = implementation.fn(*inputs.args, **inputs.kwargs)
        if after_launch is not None:
            after_launch()
        wait_for_cuda_kernels(inputs)
    except Exception as exc:
        raise CheckFailure(f"{implementation.name} raised {short(exc)}") from exc
    pending = pending_launch_error(inputs)
    if pending:
        raise CheckFailure(
            f"{implementation.name} returned with a CUDA error pending ({pending}): one of its kernel launches failed "
            "and nothing checked it, so the next CUDA call anywhere would raise it. Check every launch with "
            "C10_CUDA_KERNEL_LAUNCH_CHECK(), and launch nothing for empty tensors (a grid of 0 blocks is an invalid "
            "configuration)."
        )
    return returned


def _cuda_devices(inputs: CaseInputs) -> set[torch.device]:
    import torch

    values = [*inputs.args, *inputs.kwargs.values()]
    tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return {t.device for t in tensors if t.is_cuda}


def wait_for_cuda_kernels(inputs: CaseInputs) -> None:
    """Synchronize the CUDA devices of the op's inputs. A kernel's device-side assert or fault surfaces at the next
    synchronization, wherever that is: waiting here makes it the op's failure, not an ERROR in the comparison or
    the reference that touched the GPU next. Skipped while a CUDA graph is captured, where it is illegal."""
    import torch

    if not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing():
        return
    for device in _cuda_devices(inputs):
        torch.cuda.synchronize(device)


def pending_launch_error(inputs: CaseInputs) -> str | None:
    """The CUDA error a failed, unchecked kernel launch of the op left behind, if any (cleared, so the next case
    runs clean). A launch error (a grid of 0 blocks) is not sticky: synchronizing does not see it, and the next
    kernel launch that checks for errors, anywhere, raises it. So launch one such kernel on each device now."""
    import torch

    if not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing():
        return None
    for device in _cuda_devices(inputs):
        try:
            torch.empty(1, device=device).fill_(0)
        except Exception as exc:  # the stale launch error surfaces as a RuntimeError (AcceleratorError in newer torch)
            return str(exc).splitlines()[0]
    return None


def outputs_of(
    loaded: LoadedOp,
    implementation: Implementation,
    inputs: CaseInputs,
    after_launch: Callable[[], None] | None = None,
) -> tuple[Any, ...]:
    """What the op returned, one value per schema return: () for an op that returns nothing (it only mutates)."""
    return op_outputs(loaded, call_implementation(implementation, inputs, after_launch))


def op_outputs(loaded: LoadedOp, returned: Any) -> tuple[Any, ...]:
    """A call's returned value as one value per schema return (a `Tensor[]` return is one list)."""
    return returned_values(len(loaded.overload._schema.returns), returned)


def reference_values(loaded: LoadedOp, result: Any) -> tuple[Any, ...]:
    """What the reference returned, as the op's outputs followed by each mutated argument's new value. One value is
    taken whole when the schema makes it a list (a `Tensor[]` return or argument), else a tuple of one is unpacked
    as before; None is nothing."""
    if result is None:
        return ()
    count = len(loaded.overload._schema.returns) + len(loaded.mutated_arguments)
    if count == 1 and _is_list_typed(_only_value_type(loaded)):
        return (result,)
    return as_tuple(result) if count <= 1 else tuple(result)


def _only_value_type(loaded: LoadedOp) -> JitType:
    returns = loaded.overload._schema.returns
    if returns:
        return returns[0].type
    mutated = loaded.mutated_arguments[0]
    return next(a.type for a in loaded.arguments if a.name == mutated)


def _is_list_typed(type_: JitType) -> bool:
    return str(type_).startswith("List[")


def differentiated(loaded: LoadedOp, inputs: CaseInputs) -> list[str]:
    """The tensor inputs the spec marks requires_grad; a spec that marks none cannot have its gradients checked."""
    names = [n for n in inputs.tensor_names if argument(inputs, loaded, n).requires_grad]
    if not names:
        raise ReferenceFailure("no tensor input has requires_grad: true in the spec, so there is no gradient to check")
    return names


def vector_jacobian_products(
    loaded: LoadedOp, implementation: Implementation, case: Case, base_seed: int, inputs: CaseInputs, names: list[str]
) -> tuple[tuple[Tensor | None, ...], tuple[Tensor | None, ...], Baseline]:
    """The op's and the reference's gradients with respect to `names`, for one random grad_output seeded by the
    case (drawn in float64, then rounded to each output's dtype, so both sides see the same values), and the
    gradients through the reference computed in the case's dtype (the low-precision baseline, named grad[x])."""

    baseline_args = reference_in_op_dtypes(loaded, inputs)
    named = differentiable_leaves(outputs_of(loaded, implementation, inputs))
    outs = [leaf for _, leaf in named]
    ref_outs, _ = split_reference(loaded, call_reference(loaded, inputs))
    grad_outs = seeded_grad_outputs(outs, case, base_seed)
    grads = op_gradients(implementation, outs, [argument(inputs, loaded, n) for n in names], grad_outs)
    leaf_names = [name for name, _ in named]
    try:
        ref_grads = gradients(
            matching_leaves(leaf_names, ref_outs),
            [argument(inputs, loaded, n, reference=True) for n in names],
            [g.double().cpu() for g in grad_outs],
        )
    except Exception as exc:
        raise ReferenceFailure(f"backward of the reference raised {short(exc)}") from exc
    return grads, ref_grads, _gradient_baseline(loaded, baseline_args, names, leaf_names, grad_outs, case.dtype)


def differentiable_outputs(outputs: tuple[Any, ...]) -> list[Tensor]:
    """The outputs with a gradient graph, a list output's tensors each: those a grad_output goes to."""
    return [leaf for _, leaf in differentiable_leaves(outputs)]


def differentiable_leaves(outputs: tuple[Any, ...]) -> list[tuple[str, Tensor]]:
    """differentiable_outputs, each with its place among the outputs' leaves (`1[0]`: output 1's first tensor)."""
    import torch

    flat = [leaf for i, o in enumerate(outputs) for leaf in leaves(str(i), o)]
    return [(name, o) for name, o in flat if isinstance(o, torch.Tensor) and o.requires_grad]


def matching_leaves(names: list[str], outputs: tuple[Any, ...]) -> list[Any]:
    """The reference's leaves at the places `names` (differentiable_leaves of the op's outputs) name, so that each
    grad_output reaches the same value on both sides (None where the reference has no such leaf)."""
    by_place = dict(leaf for i, o in enumerate(outputs) for leaf in leaves(str(i), o))
    return [by_place.get(name) for name in names]


def seeded_grad_outputs(outputs: list[Tensor], case: Case, base_seed: int) -> list[Tensor]:
    """One random grad_output per output, seeded by the case (drawn in float64, then rounded to the output's dtype,
    so every side that uses it sees the same values)."""
    import torch

    generator = torch.Generator().manual_seed(case.seed(base_seed) + 1)
    return [torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype).to(o.device) for o in outputs]


def op_gradients(
    implementation: Implementation,
    outputs: list[Tensor],
    wrt: list[Tensor],
    grad_outputs: list[Tensor],
    retain_graph: bool = False,
) -> tuple[Tensor | None, ...]:
    """The op's gradients with respect to `wrt` (None where nothing reaches one); a backward that raises is the op's
    failure. retain_graph keeps the graph for another backward through it."""
    import torch

    try:
        return torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=retain_graph, allow_unused=True)
    except Exception as exc:
        raise CheckFailure(f"backward of {implementation.name} raised {short(exc)}") from exc


def differentiates(loaded: LoadedOp, case: Case) -> bool:
    """Whether a check takes the op's gradients on this case: a differentiable op that mutates nothing (autograd
    refuses in-place writes to leaves), in a floating dtype."""
    return loaded.spec.differentiable and not loaded.mutated_arguments and case.dtype in FLOATING_DTYPES


def _gradient_baseline(
    loaded: LoadedOp,
    arguments: tuple[tuple[Any, ...], dict[str, Any]],
    names: list[str],
    leaf_names: list[str],
    grad_outs: list[Tensor],
    dtype: str,
) -> Baseline:

    args, kwargs = arguments
    positions = [a.name for a in loaded.arguments]

    def grads_at(call_args: tuple[Any, ...], call_kwargs: dict[str, Any], wide: bool) -> dict[str, Tensor]:
        wrt = [call_args[positions.index(n)] if positions.index(n) < len(call_args) else call_kwargs[n] for n in names]
        outputs, _ = split_reference(loaded, reference_values(loaded, loaded.reference(*call_args, **call_kwargs)))
        seeds = [g.detach().cpu() for g in grad_outs]
        grads = gradients(matching_leaves(leaf_names, outputs), wrt, [g.double() if wide else g for g in seeds])
        return {f"grad[{n}]": g for n, g in zip(names, grads) if g is not None}

    def perturbed(scale: float, draw: int) -> dict[str, Tensor]:
        return grads_at(*_perturbed_call(loaded, (args, kwargs), scale, draw), wide=True)

    return Baseline(dtype, lambda: grads_at(args, kwargs, wide=False), perturbed=perturbed, own=_own(loaded))


def gradients(outputs: list[Any], wrt: list[Tensor], grad_outputs: list[Tensor]) -> tuple[Tensor | None, ...]:
    """autograd.grad of the outputs that have a gradient graph; an output without one (a reference's
    `new_zeros(...)` for an empty input) is a constant and adds nothing. None where nothing reaches an input."""
    import torch

    live = [(o, g) for o, g in zip(outputs, grad_outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not live:
        return tuple(None for _ in wrt)
    return torch.autograd.grad([o for o, _ in live], wrt, [g for _, g in live], allow_unused=True)


def reference_in_op_dtypes(loaded: LoadedOp, inputs: CaseInputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The reference's arguments cast to the dtypes the op received (the values are the same: the op's inputs are
    the rounded ones), on the CPU, keeping requires_grad: calling the reference on them is the low-precision
    baseline."""
    import torch

    def cast(ref: Any, op: Any) -> Any:
        if not isinstance(ref, torch.Tensor) or not (ref.is_floating_point() or ref.is_complex()):
            return ref
        return ref.detach().to(op.dtype, copy=True).requires_grad_(ref.requires_grad)

    args = tuple(cast(r, o) for r, o in zip(inputs.reference_args, inputs.args))
    kwargs = {k: cast(v, inputs.kwargs[k]) for k, v in inputs.reference_kwargs.items()}
    return args, kwargs


def perturbed_arguments(
    arguments: tuple[tuple[Any, ...], dict[str, Any]],
    scale: float,
    draw: int,
    exact: frozenset[str] = frozenset(),
    positional_names: tuple[str, ...] = (),
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh float64 (complex128) copies of the floating tensor arguments, each element multiplied by
    1 + scale * r with r uniform in [-1, 1] from a generator seeded by `draw`, keeping requires_grad: the inputs of
    Baseline.spread's float64 reference runs. The arguments named in `exact` (positional ones by
    `positional_names`) and the other arguments as they are."""
    import torch

    generator = torch.Generator().manual_seed(draw)

    def perturb(value: Any, name: str) -> Any:
        if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
            return value
        wide = value.detach().to(torch.complex128 if value.is_complex() else torch.float64, copy=True)
        if scale and name not in exact:
            noise = torch.rand(wide.shape, generator=generator, dtype=torch.float64).mul_(2).sub_(1)
            wide = wide * (1 + scale * noise)
        return wide.requires_grad_(value.requires_grad)

    args, kwargs = arguments
    names = (*positional_names, *[""] * (len(args) - len(positional_names)))
    return tuple(perturb(a, n) for a, n in zip(args, names)), {k: perturb(v, k) for k, v in kwargs.items()}


def _perturbed_call(
    loaded: LoadedOp, arguments: tuple[tuple[Any, ...], dict[str, Any]], scale: float, draw: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """perturbed_arguments with the inputs a spec generator makes kept exact: structured values (boxes on a grid,
    sorted indices) that no rounding of the op's moves. Perturbing an roi's corners excused torchvision's roi_align
    computing its sample positions in float16 (8x eager's error): geometry is exact in the inputs, so its error is
    the op's."""
    generated = frozenset(t.name for t in loaded.spec.tensor_inputs() if t.generator is not None)
    return perturbed_arguments(arguments, scale, draw, generated, tuple(a.name for a in loaded.arguments))


def output_baseline(loaded: LoadedOp, inputs: CaseInputs, case_dtype: str) -> Baseline:
    """The reference computed in the case's dtype, by the names against_reference gives the compared values, and
    in float64 on perturbed inputs (Baseline.spread). Its arguments are taken now, before the op or the reference
    has run (either may write its arguments), and every call gets copies of them."""
    arguments = reference_in_op_dtypes(loaded, inputs)

    def named_results(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        outputs, new_values = split_reference(loaded, reference_values(loaded, loaded.reference(*args, **kwargs)))
        return dict(named_leaves(loaded, outputs, new_values))

    def compute() -> dict[str, Any]:
        args, kwargs = arguments
        return named_results(*_copies(args, kwargs))

    def perturbed(scale: float, draw: int) -> dict[str, Any]:
        return named_results(*_perturbed_call(loaded, arguments, scale, draw))

    def tracked() -> tuple[dict[str, Any], list[Tensor]]:
        import torch

        args, kwargs = perturbed_arguments(arguments, 0.0, 0)
        floating = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        for tensor in floating:
            tensor.requires_grad_(True)
        with torch.enable_grad():
            return named_results(args, kwargs), floating

    sizes = [a.numel() for a in (*inputs.args, *inputs.kwargs.values()) if hasattr(a, "numel")]
    return Baseline(case_dtype, compute, max(sizes, default=0), perturbed, tracked, own=_own(loaded))


def _own(loaded: LoadedOp) -> bool:
    """Whether the low-precision baseline is the op itself (a spec without a reference)."""
    return loaded.self_reference is not None


def _copies(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Tensors cloned (keeping requires_grad), the rest as they are: a reference that writes its arguments leaves
    the originals for the next call."""
    import torch

    def copy(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return value.detach().clone().requires_grad_(value.requires_grad)

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


def compare_with_reference(
    loaded: LoadedOp,
    case_dtype: str,
    device: str,
    compared: list[tuple[str, Any, Any]],
    baseline: Baseline | None,
    label: str = "",
    round_expected: bool = False,
) -> None:
    """Each (name, got, expected) of against_reference by the case dtype's rule (opforge.cases.compare): the fixed
    tolerance, or no worse than the reference computed in that dtype. `label` is added to the names in messages;
    `round_expected` rounds the float64 expected values to the dtype the op returns (what it can hold: 1.1 * max is
    inf in it). A spec without a reference says nothing of the dtype a floating output should have: it is the one
    the op itself returns in the case's dtype on contiguous inputs (the baseline)."""
    rule = rule_for(loaded.spec, case_dtype)
    result_dtype = floating_result_dtype(loaded.spec, case_dtype)
    against = loaded.reference_label
    for name, g, e in compared:
        dtype = compared_dtype(result_dtype, name, g, e)
        if loaded.self_reference is not None and baseline is not None and dtype is not None:
            dtype = _own_dtype(baseline, name, case_dtype, dtype)
        expected = e.to(dtype).to(e.dtype) if round_expected and hasattr(e, "to") and dtype is not None else e
        check_result(
            f"{name}{label}", g, expected, rule, dtype, device, against=against, baseline=baseline, baseline_key=name
        )


def _own_dtype(baseline: Baseline, name: str, case_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the op itself returns output `name` in, in the case's dtype on contiguous inputs (a float64 case:
    `dtype`, what the float64 reference returns)."""
    if case_dtype == "float64":
        return dtype
    own: torch.dtype = getattr(baseline.value(name), "dtype", dtype)
    return own


def judged_nothing(loaded: LoadedOp, implementation: Implementation, inputs: CaseInputs) -> bool:
    """Whether comparing this call of `implementation` with the reference's last call judges nothing: a spec
    without a reference, the op itself, called exactly as its reference calls it (the same dtypes, contiguous, on
    the reference's device). Call it after the reference ran on `inputs`."""
    own = loaded.self_reference
    if own is None or implementation.overload is not loaded.overload or implementation.name != NATIVE:
        return False
    return own.same_call(inputs.args, inputs.kwargs, inputs.reference_args, inputs.reference_kwargs)


def nothing_judged(loaded: LoadedOp) -> str:
    """The reason of a result that compared the op's call with itself (judged_nothing)."""
    return (
        f"the spec has no `reference:`, and this case is the op's own reference call ({loaded.reference_label}): "
        "nothing to compare it with"
    )


def compared_with(loaded: LoadedOp) -> PassDetail | None:
    """A passing result's detail for a spec without a reference: what its values were compared with."""
    return PassDetail(f"compared with {loaded.reference_label}") if loaded.self_reference is not None else None


def call_reference(loaded: LoadedOp, inputs: CaseInputs) -> tuple[Any, ...]:
    try:
        result = loaded.reference(*inputs.reference_args, **inputs.reference_kwargs)
    except Exception as exc:
        raise ReferenceFailure(f"the reference raised {short(exc)}") from exc
    return reference_values(loaded, result)


def split_reference(loaded: LoadedOp, expected: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The reference returns the op's outputs, then the new values of each mutated argument in schema order."""
    n_returns = len(loaded.overload._schema.returns)
    mutated = loaded.mutated_arguments
    if len(expected) != n_returns + len(mutated):
        raise ReferenceFailure(
            f"the reference returned {len(expected)} value(s), expected {n_returns} output(s)"
            + (f" plus the new values of {', '.join(mutated)}" if mutated else "")
            + ". Make it return what the op returns, then each mutated argument."
        )
    return expected[:n_returns], dict(zip(mutated, expected[n_returns:]))


def argument(inputs: CaseInputs, loaded: LoadedOp, name: str, reference: bool = False) -> Any:
    """Argument `name` as the op (or, with reference=True, the reference) receives it."""
    args, kwargs = (inputs.reference_args, inputs.reference_kwargs) if reference else (inputs.args, inputs.kwargs)
    index = [a.name for a in loaded.arguments].index(name)
    return args[index] if index < len(args) else kwargs[name]


def with_arguments(
    loaded: LoadedOp, inputs: CaseInputs, replacements: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The op's args and kwargs with the arguments named in `replacements` swapped for those values."""
    arg_names = [a.name for a in loaded.arguments]
    args = tuple(replacements.get(arg_names[i], v) for i, v in enumerate(inputs.args))
    kwargs = {k: replacements.get(k, v) for k, v in inputs.kwargs.items()}
    return args, kwargs


def paired(
    loaded: LoadedOp,
    got: tuple[Any, ...],
    mutated_now: dict[str, Any],
    expected: tuple[Any, ...],
    expected_mutated: dict[str, Any],
) -> list[tuple[str, Any, Any]]:
    """(name, got, expected) for each leaf of each output (a `Tensor[]` output's tensors are `result1[0]`, ...),
    then of each mutated argument ("x (mutated)"), after checking that the op returned as many values as expected
    and lists as long (zip would silently compare fewer)."""
    if len(got) != len(expected):
        raise CheckFailure(
            f"outputs: expected {len(expected)} value(s) (the schema's returns), got {len(got)}. "
            "Return exactly what the schema declares."
        )
    pairs = [leaf for n, g, e in zip(output_names(loaded), got, expected) for leaf in paired_leaves(n, g, e)]
    for name in loaded.mutated_arguments:
        pairs += [(f"{n}{MUTATED}", g, e) for n, g, e in paired_leaves(name, mutated_now[name], expected_mutated[name])]
    return pairs


def named_leaves(loaded: LoadedOp, outputs: tuple[Any, ...], mutated: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, value) of each leaf of the outputs, then of each mutated argument, named as `paired` names them."""
    named = [leaf for n, o in zip(output_names(loaded), outputs) for leaf in leaves(n, o)]
    return named + [(f"{n}{MUTATED}", v) for name, value in mutated.items() for n, v in leaves(name, value)]


def against_reference(
    loaded: LoadedOp, got: tuple[Any, ...], mutated_now: dict[str, Any], reference_result: tuple[Any, ...]
) -> list[tuple[str, Any, Any]]:
    """The op's outputs and the mutated arguments' values now, paired with what the reference returned."""
    outputs, new_values = split_reference(loaded, reference_result)
    return paired(loaded, got, mutated_now, outputs, new_values)


def mutated_values(loaded: LoadedOp, inputs: CaseInputs) -> dict[str, Any]:
    """The current value of each argument the op mutates, as the op received it."""
    return {name: argument(inputs, loaded, name) for name in loaded.mutated_arguments}


def on_device(inputs: CaseInputs, device: torch.device | str) -> CaseInputs:
    """The op's arguments copied to `device`, each tensor with its exact strides (a strided slice keeps its gaps);
    the reference's arguments stay as they are."""
    import torch

    def move(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        broadcast = [d for d in range(value.dim()) if value.stride(d) == 0 and value.size(d) > 1]
        if broadcast:  # an expanded input: no copy can write its repeated elements, so move one and expand it again
            narrowed = value
            for d in broadcast:
                narrowed = narrowed.narrow(d, 0, 1)
            return move(narrowed).expand(value.size())
        moved = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device)
        return moved.copy_(value.detach())

    return replace(
        inputs, args=tuple(move(a) for a in inputs.args), kwargs={k: move(v) for k, v in inputs.kwargs.items()}
    )


def output_names(loaded: LoadedOp) -> list[str]:
    """The outputs' names as failure messages and `bench.bytes` expressions both show them."""
    return list(return_names(str(loaded.overload._schema)))


def compared_dtype(case_dtype: str, name: str, got: Any, expected: Any) -> torch.dtype | None:
    """The dtype `got` must have: an output the case's (expected_dtype); a mutated argument keeps its own; None for
    a value that is no tensor (None, a number: compared as it is)."""
    if not hasattr(expected, "dtype") or not hasattr(got, "dtype"):
        return None
    return got.dtype if name.endswith(MUTATED) else expected_dtype(case_dtype, expected)


def floating_result_dtype(spec: OpSpec, case_dtype: str) -> str:
    """The dtype a floating output is expected in: the case's; in a case of an integer or bool dtype (an index's),
    the dtype the op's floating inputs are pinned to where they share one (a float32 table that an int32 index
    gathers from), since that is what the op computes in."""
    pinned = {t.dtype for t in spec.tensor_inputs() if t.dtype in FLOATING_DTYPES}
    if case_dtype in FLOATING_DTYPES or "complex" in case_dtype or len(pinned) != 1:
        return case_dtype
    return pinned.pop()


def expected_dtype(case_dtype: str, reference_value: torch.Tensor) -> torch.dtype:
    """The reference computes in float64; the op is expected to return the case's dtype for floating outputs."""
    import torch

    if reference_value.dtype == torch.float64:
        dtype: torch.dtype = getattr(torch, case_dtype)
        return dtype if dtype.is_floating_point else torch.float64
    if reference_value.dtype == torch.complex128:
        return {"complex64": torch.complex64}.get(case_dtype, torch.complex128)
    return reference_value.dtype


@dataclass(frozen=True)
class RunOutputs:
    """What one run of the op left (on one device, compiled or eager): its outputs and the values of the arguments
    it mutates. `label` names the run in messages; `device` is where its tensors must be."""

    label: str
    device: str
    outputs: tuple[Any, ...]
    mutated: dict[str, Any]


def _float64_reference(loaded: LoadedOp) -> str:
    return loaded.reference_label if loaded.self_reference is not None else "the float64 reference"


def agreement(
    loaded: LoadedOp,
    case_dtype: str,
    first: RunOutputs,
    second: RunOutputs,
    reference: Callable[[], tuple[Any, ...]],
    baseline: Baseline,
) -> None:
    """Raises CheckFailure unless the two results agree within the dtype's tolerance, or each is as close to the
    float64 reference as the correctness check asks (then they may differ by up to both their errors: a GPU's tree
    sum against a CPU's ordered one, inductor's float32 math for a bfloat16 op against eager's bfloat16 steps)."""
    tol = rule_for(loaded.spec, case_dtype).tol
    label = f"{first.label} vs {second.label}"
    disagreement = None
    for name, a, b in paired(loaded, first.outputs, first.mutated, second.outputs, second.mutated):
        try:
            dtype = getattr(b, "dtype", None)
            check_result(f"{name} ({label})", a, b, tol, dtype, first.device, against=f"the {second.label} result")
        except CheckFailure as failure:
            disagreement = disagreement or failure
    if disagreement is None:
        return
    expected = reference()
    against = _float64_reference(loaded)
    for result in (first, second):
        compared = against_reference(loaded, result.outputs, result.mutated, expected)
        try:
            compare_with_reference(loaded, case_dtype, result.device, compared, baseline, label=f" ({result.label})")
        except CheckFailure as failure:
            raise CheckFailure(
                f"{disagreement.message} Beyond that, the {result.label} result is not as close to {against} as "
                f"it must be: {failure.message}",
                failure.mismatch or disagreement.mismatch,
            ) from None
