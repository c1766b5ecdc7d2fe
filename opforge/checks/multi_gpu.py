"""multi_gpu: the op on tensors that live on another GPU than the current one.

A kernel whose host function forgets `c10::cuda::CUDAGuard` launches on the current device (GPU 0) with pointers
into another GPU's memory, or allocates its output on the current device: it returns garbage, all zeros
(pytorch#76586) or a tensor on the wrong GPU, and every single-GPU test passes. OpInfo checks only the output's
device; this check checks the values too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opforge.building.op import Implementation
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes, all_cases
from opforge.checks.op_and_reference import (
    against_reference,
    call_reference,
    compare_with_reference,
    inputs_for,
    mutated_values,
    on_device,
    output_baseline,
    outputs_of,
)
from opforge.core.outcomes import CheckFailure, CheckSkipped, short

if TYPE_CHECKING:
    import torch

# The current device while the op runs: the inputs live elsewhere.
HOME_DEVICE = 0
MIN_GPUS = 2


def multi_gpu(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
    """Inputs on the last visible GPU, GPU 0 current: outputs (and mutated arguments) must live on the inputs' GPU
    and match the reference."""
    import torch

    other = far_device(torch.cuda.device_count())
    loaded = ctx.loaded
    inputs = on_device(inputs_for(loaded, case, ctx.base_seed), other)
    baseline = output_baseline(loaded, inputs, case.dtype)
    with torch.cuda.device(HOME_DEVICE):
        got = outputs_of(loaded, implementation, inputs)
    # Both GPUs: an unguarded kernel runs on cuda:0's stream while the comparison below reads the inputs' GPU, so
    # waiting for that GPU alone would race the kernel and leave its fault to a later task.
    for device in (torch.device("cuda", HOME_DEVICE), other):
        _synchronize(implementation, device)
    compared = against_reference(loaded, got, mutated_values(loaded, inputs), call_reference(loaded, inputs))
    label = f" (inputs on {other}, current device cuda:{HOME_DEVICE})"
    for name, g, _ in compared:
        require_device(f"{name}{label}", g, other)
    compare_with_reference(loaded, case.dtype, "cuda", compared, baseline, label=label)
    return {"multi_gpu": None}


def far_device(count: int) -> torch.device:
    """The last visible GPU, or a skip when there is no second one."""
    import torch

    if count < MIN_GPUS:
        raise CheckSkipped(
            f"needs {MIN_GPUS} GPUs to put the inputs on another GPU than the current one, {count} visible"
        )
    return torch.device("cuda", count - 1)


def require_device(name: str, value: Any, device: torch.device) -> None:
    import torch

    if isinstance(value, torch.Tensor) and value.device != device:
        raise CheckFailure(
            f"{name}: expected the result on the input's device {device}, got one on {value.device}. "
            "Put `const c10::cuda::CUDAGuard guard(x.device());` first in the kernel's host function "
            "and allocate outputs with the input's options."
        )


def _synchronize(implementation: Implementation, device: torch.device) -> None:
    import torch

    try:
        torch.cuda.synchronize(device)
    except Exception as exc:
        raise CheckFailure(
            f"{implementation.name} with its inputs on another GPU than the current cuda:{HOME_DEVICE}: "
            f"expected it to run on the inputs' GPU, got a fault on {device}: {short(exc)}. Put "
            "`const c10::cuda::CUDAGuard guard(x.device());` first in the kernel's host function."
        ) from exc


CHECKS = (
    Check(
        "multi_gpu",
        "inputs on another GPU than the current one: a missing device guard (needs 2 GPUs)",
        all_cases,
        multi_gpu,
        devices=("cuda",),
        gpus=MIN_GPUS,
    ),
)
