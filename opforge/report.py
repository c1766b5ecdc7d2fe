"""Everything opforge shows a person. The only module that owns a rich Console.

Readable without a TTY (CI logs): no live redraws, a fixed width, and NO_COLOR honoured (rich reads it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from opforge.results import CaseResult, OpReport, RunReport, Status, describe_mismatch, failure_details
from opforge.spec import KNOWN_DEVICES, KNOWN_DTYPES

# Width used when stdout is not a terminal, so CI logs do not wrap the tables at rich's default 80 columns.
LOG_WIDTH = 140
# The column header under which the dtypes check's unclaimed dtypes are folded.
UNCLAIMED_COLUMN = "other"
# Failure panels printed in full; the rest are counted and left to --json / --junit.
MAX_FAILURE_PANELS = 20

_STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.XPASS: "bold red",
    Status.SKIP: "dim",
    Status.XFAIL: "yellow",
    Status.CRASH: "bold red",
    Status.TIMEOUT: "bold red",
}
_LABEL = {
    Status.PASS: "pass",
    Status.FAIL: "FAIL",
    Status.ERROR: "ERROR",
    Status.XPASS: "XPASS",
    Status.SKIP: "skip",
    Status.XFAIL: "xfail",
    Status.CRASH: "CRASH",
    Status.TIMEOUT: "TIMEOUT",
}
# A cell shows the most severe status among its cases.
_SEVERITY = [
    Status.CRASH,
    Status.TIMEOUT,
    Status.ERROR,
    Status.FAIL,
    Status.XPASS,
    Status.XFAIL,
    Status.PASS,
    Status.SKIP,
]


def _make_console(stderr: bool = False) -> Console:
    interactive = Console(stderr=stderr).is_terminal
    width = None if interactive or os.environ.get("COLUMNS") else LOG_WIDTH
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)


console = _make_console()
err_console = _make_console(stderr=True)


def error(message: str) -> None:
    err_console.print(Text("error: ", style="bold red") + Text(message))


def info(message: str) -> None:
    console.print(message)


def warning(message: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(message))


@contextmanager
def spinner(message: str) -> Iterator[None]:
    if console.is_terminal:
        with console.status(message):
            yield
    else:
        console.print(message)
        yield


class RunProgress:
    """One progress bar per op on a terminal (ops may run side by side in worker processes); silent in a log."""

    def __init__(self, bar: Progress | None):
        self._bar = bar
        self._tasks: dict[str, Any] = {}
        self._failures: dict[str, int] = defaultdict(int)

    def planned(self, op: str, total: int) -> None:
        if self._bar is not None:
            self._tasks[op] = self._bar.add_task(op, total=total, failed="")

    def result(self, op: str, result: CaseResult) -> None:
        if self._bar is None or op not in self._tasks:
            return
        self._failures[op] += result.status.failed
        failed = self._failures[op]
        self._bar.update(self._tasks[op], advance=1, failed=f"{failed} failed" if failed else "")


@contextmanager
def run_progress() -> Iterator[RunProgress]:
    if not console.is_terminal:
        yield RunProgress(None)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[failed]}", style="red"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        yield RunProgress(bar)


def render_run(report: RunReport, verbose: bool = False) -> None:
    for op in report.ops:
        render_op(op, verbose)
    render_failures(report)
    render_totals(report)


def render_op(op: OpReport, verbose: bool = False) -> None:
    cells: dict[tuple[str, str], dict[tuple[str, str], list[CaseResult]]] = defaultdict(lambda: defaultdict(list))
    for r in op.results:
        cells[(r.target, r.check)][(r.device, r.dtype)].append(r)
    _fold_unclaimed_dtypes(cells)
    columns = sorted({c for by_column in cells.values() for c in by_column}, key=_column_order)
    table = Table(title=f"{op.op}  ({op.spec_path})", title_justify="left", show_lines=False)
    table.add_column("implementation", no_wrap=True)
    table.add_column("check", no_wrap=True)
    for device, dtype in columns:
        table.add_column(f"{dtype}\n{device}", justify="center")
    rows = sorted(cells.items(), key=lambda item: _row_order(op, item[0]))
    for (target, check), by_column in rows:
        table.add_row(
            target, check.replace("opcheck:test_", "opcheck:"), *(_cell(by_column.get(c, [])) for c in columns)
        )
    console.print(table)
    for reason in dict.fromkeys(r.message for r in op.results if r.status == Status.SKIP and r.message):
        console.print(f"[dim]skip: {reason}[/dim]")
    # Passes with something to say: a dtype the spec does not claim that works anyway.
    for target, note in dict.fromkeys(
        (r.target, r.message) for r in op.results if r.status == Status.PASS and r.message
    ):
        console.print(Text(f"note: {target}: {note}", style="dim"))
    build = op.build or {}
    if build.get("skipped_sources"):
        console.print(
            f"[dim]not built: {', '.join(os.path.basename(s) for s in build['skipped_sources'])} "
            f"({build['cuda_skipped_because']})[/dim]"
        )
    if verbose:
        for r in op.results:
            console.print(
                f"  {_LABEL[r.status]:5s} {r.full_id}  [dim]{r.seconds * 1e3:.1f} ms[/dim]"
                + (f"  {r.message.splitlines()[0]}" if r.message and not r.status.failed else "")
            )


def _fold_unclaimed_dtypes(cells) -> None:
    """The dtypes check also visits dtypes the spec does not claim: a column each would crowd the table, so they
    share one column per device ("other"), which shows the most severe of them."""
    claimed = {c for (_, check), by_column in cells.items() if check != "dtypes" for c in by_column}
    if not claimed:
        return
    for (_, check), by_column in cells.items():
        if check == "dtypes":
            for device, dtype in [c for c in by_column if c not in claimed]:
                by_column[(device, UNCLAIMED_COLUMN)] += by_column.pop((device, dtype))


def _column_order(column: tuple[str, str]) -> tuple[int, int]:
    device, dtype = column
    return (
        KNOWN_DEVICES.index(device) if device in KNOWN_DEVICES else 99,
        KNOWN_DTYPES.index(dtype) if dtype in KNOWN_DTYPES else 99,
    )


def _row_order(op: OpReport, row: tuple[str, str]) -> tuple[int, int]:
    targets = list(dict.fromkeys(r.target for r in op.results if r.status != Status.SKIP)) or [row[0]]
    checks = list(dict.fromkeys(r.check for r in op.results))
    return (targets.index(row[0]) if row[0] in targets else 99, checks.index(row[1]))


def _cell(results: list[CaseResult]) -> Text:
    """The most severe status among a cell's cases: `pass 36`, `FAIL 2/36`, `skip`."""
    if not results:
        return Text("")
    worst = min((r.status for r in results), key=_SEVERITY.index)
    if worst == Status.PASS:
        return Text(f"pass {len(results)}", style=_STYLE[worst])
    if worst == Status.SKIP:
        return Text("skip", style=_STYLE[worst])
    count = sum(r.status == worst for r in results)
    return Text(f"{_LABEL[worst]} {count}/{len(results)}", style=_STYLE[worst])


_FAILURE_STYLE: dict[str, Callable[[str], Text]] = {
    "message": Text,
    "mismatch": lambda text: Text(text, style="bold"),
    "seed": lambda text: Text(text, style="dim"),
    "repro": lambda text: Text("repro: ", style="dim") + Text(text),
    "warning": lambda text: Text(f"warning: {text}", style="yellow"),
}


def render_failures(report: RunReport) -> None:
    failures = [r for r in report.results() if r.status.failed]
    for r in failures[:MAX_FAILURE_PANELS]:
        details = failure_details(r) or [("message", r.status.value)]
        body = Text("\n").join(_FAILURE_STYLE[kind](text) for kind, text in details)
        console.print(
            Panel(body, title=f"[bold red]{_LABEL[r.status]}[/] {r.full_id}", title_align="left", border_style="red")
        )
    if len(failures) > MAX_FAILURE_PANELS:
        console.print(
            f"[red]... and {len(failures) - MAX_FAILURE_PANELS} more failures (write them all with "
            "--json or --junit).[/red]"
        )


def render_totals(report: RunReport) -> None:
    counts = report.counts()
    parts = [f"{counts[s.value]} {s.value}" for s in Status if counts[s.value]]
    style = "bold red" if report.failed else "bold green"
    verdict = "FAILED" if report.failed else "OK"
    suffix = " (incomplete)" if report.incomplete else ""
    for note in report.notes:
        console.print(Text("note: ", style="bold yellow") + Text(note))
    console.print(
        Text(f"{verdict}{suffix}: ", style=style)
        + Text(", ".join(parts) or "nothing ran")
        + Text(f" in {report.seconds:.1f} s", style="dim")
    )


def render_spec_list(rows: list[tuple[str, str, str]]) -> None:
    table = Table(title="opforge specs", title_justify="left")
    for name in ("op", "spec", "description"):
        table.add_column(name)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def render_builds(rows: list[tuple[str, str, str]]) -> None:
    table = Table(title="opforge build", title_justify="left")
    table.add_column("op", no_wrap=True)
    table.add_column("library", overflow="fold")
    table.add_column("status")
    for row in rows:
        table.add_row(*row)
    console.print(table)


# ------------------------------------------------------------------------------------------------------ bench


@contextmanager
def bench_progress(total: int) -> Iterator[Callable[[object], None]]:
    """A progress bar over (point, contender) pairs on a terminal; nothing in a log."""
    if not console.is_terminal:
        yield lambda result: None
        return
    columns = (
        TextColumn("[bold]bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}", style="dim"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("bench", total=total, last="")

        def advance(result) -> None:
            bar.update(task, advance=1, last=result.id)

        yield advance


def render_bench(run) -> None:
    """One table per op: a row per (point, contender), speedups over each baseline timed on the same point."""
    from opforge.bench.baseline import format_seconds
    from opforge.bench.model import BASELINE, ERROR, SKIP, WRONG, speedups

    for device, peak in run.peaks.items():
        origin = "cached" if peak.get("cached") else "measured now"
        console.print(f"[dim]peak {device}: {peak['gbps']:.1f} GB/s ({peak['method']}; {origin})[/dim]")
    baselines = list(dict.fromkeys(r.impl for r in run.results if r.role == BASELINE))
    for op in run.ops():
        rows = [r for r in run.results if r.op == op]
        table = Table(title=f"opforge bench {op}", title_justify="left")
        for name in ("size", "dtype", "mode", "device", "impl", "median", "IQR", "GB/s", "% peak"):
            table.add_column(
                name, no_wrap=True, justify="right" if name in ("median", "IQR", "GB/s", "% peak") else "left"
            )
        for b in baselines:
            table.add_column(f"vs {b}", justify="right", no_wrap=True)
        table.add_column("note")
        for r in rows:
            ups = speedups(r, rows)
            if r.status in (WRONG, ERROR, SKIP):
                label, style = {WRONG: ("WRONG", "bold red"), ERROR: ("ERROR", "bold red"), SKIP: ("skip", "dim")}[
                    r.status
                ]
                cells = [Text(label, style=style)] + [Text("")] * (3 + len(baselines))
                note = r.message.splitlines()[0] if r.message else ""
            else:
                cells = [
                    Text(format_seconds(r.median_s)),
                    Text(format_seconds(r.iqr_s)),
                    Text(_significant(r.gbps)),
                    Text(_fixed(r.pct_of_peak, 1)),
                ]
                cells += [
                    Text(f"{ups[b]:.2f}x", style="green" if ups[b] >= 1 else "yellow") if b in ups else Text("")
                    for b in baselines
                ]
                note = r.message
            table.add_row(r.case, r.dtype, r.mode, r.device, r.impl, *cells, Text(note, style="dim"))
        console.print(table)
    for r in run.results:
        if r.mismatch is not None:
            console.print(Text(f"WRONG {r.id}: ", style="bold red") + Text(describe_mismatch(r.mismatch)))
    for device, reason in run.skipped.items():
        console.print(f"[dim]skip {device}: {reason}[/dim]")


def _fixed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _significant(value: float | None) -> str:
    """Three significant digits, so 0.00437 GB/s of a tiny size is not shown as 0.0."""
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def render_comparison(comparison, markdown: str) -> None:
    for difference in comparison.environment_differences:
        warning(f"environment differs from the baseline: {difference}")
    for ident, differences in comparison.incomparable:
        warning(f"{ident} was timed differently from the baseline ({'; '.join(differences)}): not gated")
    if comparison.only_old:
        warning(f"{len(comparison.only_old)} case(s) of the baseline were not run: {', '.join(comparison.only_old)}")
    console.print(markdown, markup=False, highlight=False, soft_wrap=True)


def render_bench_totals(run, comparison=None) -> None:
    from opforge.bench.model import ERROR, OK, SKIP, WRONG

    counts = {s: sum(r.status == s for r in run.results) for s in (OK, WRONG, ERROR, SKIP)}
    parts = [f"{counts[OK]} timed"] + [f"{counts[s]} {s}" for s in (WRONG, ERROR, SKIP) if counts[s]]
    if comparison is not None:
        parts.append(f"{len(comparison.regressions)} regression(s)")
        if comparison.nothing_compared:
            error(
                f"opforge bench --baseline: expected at least one case compared with {comparison.baseline_path}, "
                f"got none ({len(comparison.only_old)} of its cases not run, {len(comparison.incomparable)} timed "
                "differently). Run the cases the baseline holds, with its timing options, or record a new one."
            )
    if run.nothing_timed:
        why = [f"skip {device}: {reason}" for device, reason in run.skipped.items()]
        why += [f"{counts[s]} {s}" for s in (WRONG, ERROR, SKIP) if counts[s]] or ([] if why else ["no case planned"])
        error(
            f"opforge bench: expected at least one timed case, got none ({'; '.join(why)}). Pick a device, dtype, "
            "mode and contender that can run here (--device, --dtype, --mode, --impl), or fix the errors above."
        )
    failed = run.failed or (comparison is not None and comparison.failed)
    console.print(
        Text("FAILED: " if failed else "OK: ", style="bold red" if failed else "bold green")
        + Text(", ".join(parts))
        + Text(f" in {run.seconds:.1f} s", style="dim")
    )
