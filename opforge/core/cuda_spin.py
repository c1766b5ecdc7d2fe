"""A GPU-side wait of a given length: torch.cuda._sleep spins for clock cycles, timed once per process."""

from __future__ import annotations

import functools

# Cycles spun once per process to convert seconds into cycles.
CALIBRATION_CYCLES = 10_000_000


@functools.cache
def cycles_per_second() -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    elapsed_ms: float = start.elapsed_time(end)  # torch leaves Event.elapsed_time unannotated
    return CALIBRATION_CYCLES / (elapsed_ms / 1e3)


def spin(seconds: float) -> None:
    """Keep the current stream busy for about `seconds`; returns at once on the host."""
    import torch

    torch.cuda._sleep(int(cycles_per_second() * seconds))
