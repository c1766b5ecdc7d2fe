"""The terminal format of `opforge profile`: per point, one line per implementation, then its heaviest kernels."""

from __future__ import annotations

from itertools import groupby

from rich.table import Table
from rich.text import Text

from opforge.bench.baseline import format_seconds
from opforge.reporters.console import console
from opforge.tools.profile import SHOWN_KERNELS, Profiled, ProfileRun


def render_profile(run: ProfileRun) -> None:
    for device, reason in run.skipped_devices.items():
        console.print(f"[dim]skip {device}: {reason}[/dim]")
    key = lambda r: (r.point, r.dtype, r.mode, r.device)  # noqa: E731
    for (point, dtype, mode, device), group in groupby(run.results, key=key):
        results = list(group)
        console.print(Text(f"{run.op}  {point}  {dtype}  {mode}  {device}  ({run.calls} calls each)", style="bold"))
        console.print(_summary(results, device))
        for r in results:
            if r.kernels:
                console.print(_kernels(r, device))
            if r.trace:
                console.print(f"[dim]trace: {r.trace}[/dim]")


def _summary(results: list[Profiled], device: str) -> Table:
    on_device = device == "cuda"
    table = Table(show_lines=False)
    table.add_column("contender", no_wrap=True)
    table.add_column("wall/call", justify="right")
    table.add_column("kernels/call" if on_device else "ops/call", justify="right")
    table.add_column("device time" if on_device else "op time", justify="right")
    table.add_column("host/call", justify="right")
    table.add_column("GB/s", justify="right")
    for r in results:
        if r.error:
            table.add_row(r.contender, Text(r.error, style="red"), "", "", "", "")
            continue
        count = r.launches if on_device else sum(k.calls for k in r.kernels)
        table.add_row(
            r.contender,
            format_seconds(r.wall_seconds),
            f"{count:.3g}",
            format_seconds(r.work_seconds),
            format_seconds(r.host_seconds),
            f"{r.gb_per_s:.3g}" if r.gb_per_s is not None else "-",
        )
    return table


def _kernels(r: Profiled, device: str) -> Table:
    title = f"{r.contender}: {'kernels' if device == 'cuda' else 'operators (own time)'} per call"
    table = Table(title=title, title_justify="left", show_header=True, box=None, pad_edge=False)
    table.add_column("name", overflow="fold", ratio=1)
    table.add_column("calls", justify="right")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for k in r.kernels[:SHOWN_KERNELS]:
        table.add_row(k.name, f"{k.calls:.3g}", format_seconds(k.seconds), f"{k.share:.0%}")
    rest = r.kernels[SHOWN_KERNELS:]
    if rest:
        table.add_row(
            f"({len(rest)} more)",
            f"{sum(k.calls for k in rest):.3g}",
            format_seconds(sum(k.seconds for k in rest)),
            f"{sum(k.share for k in rest):.0%}",
        )
    return table
