"""What the machine offers a run: which devices can run cases, and the environment a report records.

torch is imported inside the functions: a parent process that only supervises workers never needs it.
"""

from __future__ import annotations

import platform
from typing import Any


def device_unavailable(device: str) -> str | None:
    """Why `device` cannot run cases here, or None when it can."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        if not torch.version.cuda:
            return f"CUDA is not available: torch {torch.__version__} is a CPU-only build"
        return "CUDA is not available: no GPU is visible"
    return None


def environment() -> dict[str, Any]:
    """The machine and software a run's results were produced with."""
    import torch

    env = {
        **host_environment(),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def host_environment() -> dict[str, Any]:
    """What a process that never imported torch can say (a run whose workers all died before reporting theirs)."""
    return {
        "opforge": __import__("opforge").__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
