"""multi_gpu: the op on tensors that live on another GPU than the current one.

A kernel whose host function forgets `c10::cuda::CUDAGuard` launches on the current device (GPU 0) with pointers
into another GPU's memory, or allocates its output on the current device: it returns garbage, all zeros
(pytorch#76586) or a tensor on the wrong GPU, and every single-GPU test passes. OpInfo checks only the output's
device; this check checks the values too.
"""

from __future__ import annotations

from opforge.cases import Case
from opforge.checks import CheckContext, Outcomes
from opforge.checks.calls import (argument, call_reference, expected_dtype, inputs_for, output_names, outputs_of,
                                  split_reference)
from opforge.compare import CheckFailure, CheckSkipped, check_result, tolerance_for
from opforge.loading import Target

# The current device while the op runs: the inputs live elsewhere.
HOME_DEVICE = 0
MIN_GPUS = 2


def multi_gpu_cases(loaded, target: Target, cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.device == "cuda"]


def multi_gpu(ctx: CheckContext, target: Target, case: Case) -> Outcomes:
    """Inputs on the last visible GPU, GPU 0 current: outputs (and mutated arguments) must live on the inputs' GPU
    and match the reference."""
    import torch

    other = far_device(torch.cuda.device_count())
    loaded = ctx.loaded
    inputs = on_device(inputs_for(loaded, case, ctx.base_seed), other)
    with torch.cuda.device(HOME_DEVICE):
        got = outputs_of(loaded, target, inputs)
        # A kernel that faulted on the wrong GPU reports it here, as this case's failure.
        _synchronize(target, other)
    outputs, new_values = split_reference(loaded, call_reference(loaded, inputs))
    tol = tolerance_for(loaded.spec, case.dtype)
    for name, g, e in zip(output_names(loaded), got, outputs):
        label = f"{name} (inputs on {other}, current device cuda:{HOME_DEVICE})"
        require_device(label, g, other)
        check_result(label, g, e, tol, expected_dtype(case.dtype, e), "cuda")
    for name, e in new_values.items():
        value = argument(inputs, loaded, name)
        check_result(f"{name} (mutated, on {other})", value, e, tol, value.dtype, "cuda")
    return {"multi_gpu": None}


def far_device(count: int):
    """The last visible GPU, or a skip when there is no second one."""
    import torch

    if count < MIN_GPUS:
        raise CheckSkipped(f"needs {MIN_GPUS} GPUs to put the inputs on another GPU than the current one, "
                           f"{count} visible")
    return torch.device("cuda", count - 1)


def require_device(name: str, value, device) -> None:
    import torch

    if isinstance(value, torch.Tensor) and value.device != device:
        raise CheckFailure(f"{name}: expected the result on the input's device {device}, got one on {value.device}. "
                           "Put `const c10::cuda::CUDAGuard guard(x.device());` first in the kernel's host function "
                           "and allocate outputs with the input's options.")


def on_device(inputs, device):
    """The same case inputs on `device`, each tensor with its exact strides (a strided slice keeps its gaps)."""
    import torch
    from dataclasses import replace

    def move(value):
        if not isinstance(value, torch.Tensor):
            return value
        moved = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device)
        return moved.copy_(value.detach())

    return replace(inputs, args=tuple(move(a) for a in inputs.args),
                   kwargs={k: move(v) for k, v in inputs.kwargs.items()})


def _synchronize(target: Target, device) -> None:
    import torch

    try:
        torch.cuda.synchronize(device)
    except Exception as exc:
        raise CheckFailure(f"{target.name} faulted on {device} while cuda:{HOME_DEVICE} was current: {exc}") from exc
