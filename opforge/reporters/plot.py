"""`opforge bench --plot`: GB/s against size, one panel per (op, device, dtype, mode), one line per implementation,
the device's measured peak as a dashed line. Needs matplotlib (`pip install 'opforge[plot]'`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from opforge.bench.model import BenchResult, BenchRun
from opforge.reporters.base import NotWritten, Reporter


class BenchPlotReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: BenchRun) -> None:
        if not write_plot(run, self.path):
            raise NotWritten("no case has a GB/s figure to plot")


def require_plotting() -> None:
    """Fail before minutes of timing, not after, when --plot cannot be honoured."""
    import importlib.util

    from opforge.core.errors import UsageError

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "--plot",
            "matplotlib to be importable",
            "no module named matplotlib",
            "Install it (pip install 'opforge[plot]') or drop --plot.",
        )


def write_plot(run: BenchRun, path: Path) -> bool:
    """GB/s against size, one line per implementation and kind of case, one panel per (op, device, dtype, mode);
    the measured peak of the device as a dashed line. False (nothing written) when no result has a GB/s figure."""
    panels: dict[tuple[str, str, str, str], dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in run.results:
        if r.gbps is not None:
            panels[(r.op, r.device, r.dtype, r.mode)][series_label(r)].append((r.elements, r.gbps))
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI machines
    import matplotlib.pyplot as plt

    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    for ax, ((op, device, dtype, mode), lines) in zip(axes.flat, sorted(panels.items())):
        for label, points in lines.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        peak = run.peaks.get(device, {}).get("gbps")
        if peak:
            ax.axhline(peak, linestyle="--", color="gray", label=f"measured peak ({peak:.0f} GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{op} {mode} {dtype} {device}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def series_label(result: BenchResult) -> str:
    """`sizes` points (every input n elements) share a line per implementation; a `shapes` point is its own
    series, since its element count says nothing of its shapes (pred=4096x4096,target=4096 has as many elements
    as n=2^24 and moves half the bytes)."""
    return result.contender if result.case.startswith("n=") else f"{result.contender} ({result.case})"
