"""The environment fingerprint a benchmark is recorded with, and what differs between two of them."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

# Fields whose difference makes two runs' timings incomparable; the gate warns about each.
COMPARED_FIELDS = (
    "cpu_model",
    "cpu_count",
    "torch_threads",
    "torch",
    "torch_cuda",
    "gpu_name",
    "gpu_driver",
    "gpu_clocks_max_sm_mhz",
    "gpu_clocks_max_mem_mhz",
)
_SMI_FIELDS = (
    "name",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "persistence_mode",
)
_COMMAND_TIMEOUT_S = 10


def fingerprint(devices: tuple[str, ...]) -> dict[str, Any]:
    import torch

    env = {
        "opforge": __import__("opforge").__version__,
        "git_revision": git_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    if "cuda" in devices and torch.cuda.is_available():
        env.update(gpu_fingerprint())
    return env


def gpu_fingerprint() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env = {
        "gpu_name": props.name,
        "gpu_capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": props.total_memory,
        "gpu_l2_bytes": getattr(props, "L2_cache_size", None),
        "gpu_sm_count": props.multi_processor_count,
        "gpu_count": torch.cuda.device_count(),
    }
    smi = nvidia_smi(gpu_smi_id(props))
    env.update(
        {
            "gpu_driver": smi.get("driver_version"),
            "gpu_clocks_sm_mhz": smi.get("clocks.sm"),
            "gpu_clocks_mem_mhz": smi.get("clocks.mem"),
            "gpu_clocks_max_sm_mhz": smi.get("clocks.max.sm"),
            "gpu_clocks_max_mem_mhz": smi.get("clocks.max.mem"),
            "gpu_power_limit_w": smi.get("power.limit"),
            "gpu_persistence_mode": smi.get("persistence_mode"),
        }
    )
    return env


def gpu_smi_id(props: object) -> str | None:
    """The GPU's id for nvidia-smi: its UUID, since torch's device index counts only CUDA_VISIBLE_DEVICES while
    nvidia-smi's counts every GPU. None where torch does not expose the UUID (nvidia-smi is then not asked)."""
    uuid = getattr(props, "uuid", None)
    if not uuid:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def nvidia_smi(gpu_id: str | None) -> dict[str, str]:
    """Driver and clocks from nvidia-smi for the GPU `gpu_id` (a UUID), {} where it is missing or fails (a
    container without it) or the GPU cannot be named."""
    if gpu_id is None or not shutil.which("nvidia-smi"):
        return {}
    command = ["nvidia-smi", f"--id={gpu_id}", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
    return {k: v for k, v in zip(_SMI_FIELDS, values) if v and "N/A" not in v}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> str | None:
    """The opforge checkout's commit, with `-dirty` when it has uncommitted changes; None outside git."""
    root = Path(__file__).resolve().parent.parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old -> new` for each compared field that differs (a field missing on one side counts)."""
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in COMPARED_FIELDS if old.get(key) != new.get(key)]
