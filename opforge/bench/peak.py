"""The measured bandwidth ceiling "% of peak" is computed against: a device-to-device copy on a GPU, a memcpy
(tensor copy) on the CPU, timed by the same timers as the ops, once per device, and cached.

The cache (`<opforge cache>/bench/peak.json`) is keyed by what changes the figure: the device model, the driver
and torch versions and, on the CPU, the thread count. `opforge bench --refresh-peak` measures again.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opforge.bench.timing import TimingOptions

# Bytes copied to measure the ceiling. GPU: 1 GiB, >> any L2 (H200: 60 MiB), ~0.5 ms at 4 TB/s. CPU: 256 MiB,
# >> any L3 of the machines opforge runs on, ~50 ms on the 2-core VM.
GPU_COPY_BYTES = 2**30
CPU_COPY_BYTES = 2**28
# Bump when the measurement changes, so old cached figures are not reused.
PEAK_METHOD_VERSION = 2  # 2: the CPU copy is timed by Timer.timeit blocks, no longer adaptive_autorange
PEAK_TIMING = TimingOptions(budget_s=3.0, warmup_s=0.3, noise_target=0.01, min_reps=25, min_time_s=0.2)


@dataclass(frozen=True)
class Peak:
    device: str
    key: str
    gbps: float  # bytes read + bytes written per second / 1e9
    method: str
    copy_bytes: int
    measured_at: str
    cached: bool = False


def device_key(device: str, env: dict[str, Any]) -> str:
    parts: tuple[object, ...]
    if device == "cuda":
        parts = (env.get("gpu_name"), env.get("gpu_driver"), env.get("torch"), env.get("torch_cuda"))
    else:
        parts = (env.get("cpu_model"), f"threads={env.get('torch_threads')}", env.get("torch"))
    return f"{device}|v{PEAK_METHOD_VERSION}|" + "|".join(str(p) for p in parts)


def cache_file() -> Path:
    from opforge.building.extension import cache_root

    return cache_root() / "bench" / "peak.json"


def peak_bandwidth(
    device: str,
    env: dict[str, Any],
    refresh: bool = False,
    path: Path | None = None,
    measure: Callable[[str], tuple[float, str, int]] | None = None,
) -> Peak:
    """The cached peak of this device, or a fresh measurement (stored). `measure(device)` returns
    (GB/s, method, bytes copied); tests pass a fake."""
    path = path or cache_file()
    key = device_key(device, env)
    cache = _read(path)
    if not refresh and key in cache:
        return Peak(**{**cache[key], "cached": True})
    gbps, method, nbytes = (measure or measure_copy)(device)
    peak = Peak(device, key, gbps, method, nbytes, datetime.datetime.now(datetime.timezone.utc).isoformat())
    cache[key] = {k: v for k, v in asdict(peak).items() if k != "cached"}
    from opforge.core.files import write_atomically

    write_atomically(path, json.dumps(cache, indent=1) + "\n")
    return peak


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # no cache yet, or a corrupt one: measure again and overwrite it
    return data if isinstance(data, dict) else {}


def measure_copy(device: str) -> tuple[float, str, int]:
    """GB/s of `dst.copy_(src)`, counting the read and the write."""
    import torch

    from opforge.bench.stats import median
    from opforge.bench.timing import time_callable

    nbytes = GPU_COPY_BYTES if device == "cuda" else CPU_COPY_BYTES
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = time_callable(lambda: dst.copy_(src), device, PEAK_TIMING)
    method = f"{'device-to-device' if device == 'cuda' else 'memcpy'} copy of {nbytes >> 20} MiB, {timing.method}"
    return 2 * nbytes / median(timing.samples) / 1e9, method, nbytes
