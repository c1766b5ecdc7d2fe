"""The terminal format of `opforge check`: a progress bar per op while it runs (on a terminal only), then a table
per op (implementation x check rows, dtype/device columns), the failures with their worst mismatch and rerun
command, and the totals."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from opforge.checks.catalog import CATALOG
from opforge.core.results import CaseResult, OpReport, RunReport, Status, failure_details
from opforge.core.shard import shard_text
from opforge.engine.plan import LOAD_CHECK
from opforge.reporters.base import Reporter
from opforge.reporters.console import HEARTBEAT_S, Heartbeat, console, error
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES

# The column header under which the dtypes check's unclaimed dtypes are folded.
UNCLAIMED_COLUMN = "other"
# The column that stands for every dtype of a device on which every result was skipped (CUDA on a CPU machine).
ALL_SKIPPED_COLUMN = "all"
# Dtype column headers short enough for an 80-column terminal.
SHORT_DTYPES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "complex64": "c64",
    "complex128": "c128",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
}


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


class TerminalReport(Reporter):
    """A progress bar per op while the run goes (ops may run side by side in worker processes; on a terminal only),
    then the tables, the failures and the totals."""

    def __init__(self, verbose: bool = False, heartbeat_interval: float = HEARTBEAT_S):
        self.verbose = verbose
        self._bar: Progress | None = None
        self._tasks: dict[str, Any] = {}
        self._failures: dict[str, int] = defaultdict(int)
        self._planned: dict[str, int] = {}
        self._done: dict[str, int] = defaultdict(int)
        # Without a terminal (a CI log) there is no bar: one heartbeat line every interval instead, saying where the
        # run is: the step under way (a worker compiling the op) or the results done and the last one.
        self._step: str | None = None
        self._last: tuple[str, CaseResult] | None = None
        self._heartbeat = Heartbeat(self._where, interval=heartbeat_interval)

    def start(self) -> None:
        if not console.is_terminal:
            self._heartbeat.start()
            return
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[failed]}", style="red"),
        )
        self._bar = Progress(*columns, console=console, transient=True)
        self._bar.start()

    def step(self, message: str) -> None:
        console.print(message)
        self._step = message

    def planned(self, op: str, total: int) -> None:
        self._step = None
        self._planned[op] = total
        if self._bar is not None:
            self._tasks[op] = self._bar.add_task(op, total=total, failed="")

    def result(self, op: str, result: CaseResult) -> None:
        self._step = None
        self._failures[op] += result.status.failed
        self._done[op] += 1
        self._last = (op, result)
        if self._bar is not None and op in self._tasks:
            failed = self._failures[op]
            self._bar.update(self._tasks[op], advance=1, failed=f"{failed} failed" if failed else "")

    def _where(self) -> str:
        if self._step is not None:
            return f"still {self._step}"
        if self._last is None:
            return "starting"
        op, result = self._last
        total = self._planned.get(op)
        done = f"{self._done[op]}/{total}" if total else str(self._done[op])
        return f"{op}: {done} results done, {self._failures[op]} failed; last {result.check} [{result.case_id}]"

    def stop(self) -> None:
        """Ends the heartbeat and the bar; the run may have ended early (an error, Ctrl-C). Idempotent."""
        self._heartbeat.stop()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, run: RunReport) -> None:
        self.stop()
        render_run(run, self.verbose)


def render_run(report: RunReport, verbose: bool = False) -> None:
    for op in report.ops:
        render_op(op, verbose)
    render_failures(report)
    render_totals(report)
    # Each op that could not load gets its error as a line of its own, as a single op's error would be shown.
    for op in report.ops:
        if op.load_exit_code is not None:
            result = op.results[-1]
            error(result.message)
            if result.repro:
                console.print(Text("repro: ", style="dim") + Text(result.repro), soft_wrap=True)


def render_op(op: OpReport, verbose: bool = False) -> None:
    cells: _Cells = defaultdict(lambda: defaultdict(list))
    for r in op.results:
        cells[(r.implementation, r.check)][(r.device, r.dtype)].append(r)
    _fold_unclaimed_dtypes(cells)
    _fold_skipped_devices(cells)
    columns = sorted({c for by_column in cells.values() for c in by_column}, key=_column_order)
    rows = sorted(cells.items(), key=lambda item: _row_order(op, item[0]))
    title = f"{op.op}  ({op.spec_path})"
    # The title on a line of its own: as a table title it would wrap at the width of a narrow table.
    whole = _result_table(rows, columns)
    if _narrowest(whole) <= console.width:
        console.print(Text(title, style="italic"), whole)
    else:  # too wide for the terminal (two devices, or ten dtypes, at 80 columns): tables that fit, every column kept
        for device in dict.fromkeys(d for d, _ in columns):
            parts = _fitting_parts(rows, [c for c in columns if c[0] == device], console.width)
            for number, part in enumerate(parts, 1):
                which = f", part {number} of {len(parts)}" if len(parts) > 1 else ""
                console.print(Text(f"{title}  on {device}{which}", style="italic"), _result_table(rows, part))
    _render_op_notes(op, verbose)


# A table's rows: (implementation, check) -> (device, dtype) column -> the results in that cell.
_Cells = dict[tuple[str, str], dict[tuple[str, str], list[CaseResult]]]
_Row = tuple[tuple[str, str], dict[tuple[str, str], list[CaseResult]]]


def _fitting_parts(rows: list[_Row], columns: list[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
    """`columns` in order, split into runs whose table fits `width` (at least one column each: a run that cannot
    fit one column still shows it, wrapped)."""
    parts: list[list[tuple[str, str]]] = [[]]
    for column in columns:
        if parts[-1] and _narrowest(_result_table(rows, [*parts[-1], column])) > width:
            parts.append([])
        parts[-1].append(column)
    return parts


# Columns of a table: padding on both sides and a border.
_COLUMN_FRAME = 3


def _narrowest(table: Table) -> int:
    return sum((c.min_width or 0) + _COLUMN_FRAME for c in table.columns) + 1


def _result_table(rows: list[_Row], columns: list[tuple[str, str]]) -> Table:
    """Names keep their width; cells wrap at their space ("pass\n40") rather than being cut to "…": an
    80-column terminal still reads every word."""
    table = Table(show_lines=False)
    table.add_column("impl", no_wrap=True, min_width=max((len(t) for (t, _), _ in rows), default=4))
    table.add_column("check", no_wrap=True, min_width=max((len(_row_label(c)) for (_, c), _ in rows), default=5))
    for device, dtype in columns:
        header = SHORT_DTYPES.get(dtype, dtype)
        table.add_column(f"{header}\n{device}", justify="center", min_width=max(4, len(header), len(device)))
    for (implementation, check), by_column in rows:
        table.add_row(implementation, _row_label(check), *(_cell(by_column.get(c, [])) for c in columns))
    return table


def _render_op_notes(op: OpReport, verbose: bool) -> None:
    for reason in dict.fromkeys(r.message for r in op.results if r.status == Status.SKIP and r.message):
        console.print(f"[dim]skip: {reason}[/dim]")
    # Passes with something to say: a dtype the spec does not claim that works anyway.
    for implementation, note in dict.fromkeys(
        (r.implementation, r.message) for r in op.results if r.status == Status.PASS and r.message
    ):
        console.print(Text(f"note: {implementation}: {note}", style="dim"))
    build = op.build or {}
    if build.get("skipped_sources"):
        console.print(
            f"[dim]not built: {', '.join(os.path.basename(s) for s in build['skipped_sources'])} "
            f"({build['cuda_skipped_because']})[/dim]"
        )
    if verbose:
        for r in op.results:
            said = "" if r.status.failed else (r.message or r.detail)
            console.print(
                f"  {_LABEL[r.status]:5s} {r.full_id}  [dim]{r.seconds * 1e3:.1f} ms[/dim]"
                + (f"  {said.splitlines()[0]}" if said else "")
            )


# Words shortened in row labels so that the longest (opcheck's sub-tests) fits an 80-column table.
_LABEL_ABBREVIATIONS = {":test_": ":", "aot_dispatch_": "aot_", "_registration": "_reg"}


def _row_label(name: str) -> str:
    """A result name as the table's row label shows it: opcheck:test_aot_dispatch_dynamic as opcheck:aot_dynamic."""
    for long, short in _LABEL_ABBREVIATIONS.items():
        name = name.replace(long, short)
    return name


def _visits_unclaimed_dtypes(name: str) -> bool:
    return name in CATALOG.result_names and CATALOG.of_result(name).visits_unclaimed_dtypes


def _fold_unclaimed_dtypes(cells: _Cells) -> None:
    """A check that also visits dtypes the spec does not claim (dtypes) would crowd the table with a column each:
    they share one column per device ("other"), which shows the most severe of them."""
    claimed = {c for (_, check), by_column in cells.items() if not _visits_unclaimed_dtypes(check) for c in by_column}
    if not claimed:
        return
    for (_, check), by_column in cells.items():
        if _visits_unclaimed_dtypes(check):
            for device, dtype in [c for c in by_column if c not in claimed]:
                by_column[(device, UNCLAIMED_COLUMN)] += by_column.pop((device, dtype))


def _fold_skipped_devices(cells: _Cells) -> None:
    """A device on which every result was skipped gets one column, not one per dtype: its skip lines say why."""
    devices = {device for by_column in cells.values() for device, _ in by_column}
    for device in devices:
        results = [r for by_column in cells.values() for (d, _), rs in by_column.items() if d == device for r in rs]
        if all(r.status == Status.SKIP for r in results):
            for by_column in cells.values():
                for column in [c for c in by_column if c[0] == device]:
                    by_column[(device, ALL_SKIPPED_COLUMN)] += by_column.pop(column)


def _column_order(column: tuple[str, str]) -> tuple[int, int]:
    device, dtype = column
    return (
        KNOWN_DEVICES.index(device) if device in KNOWN_DEVICES else 99,
        KNOWN_DTYPES.index(dtype) if dtype in KNOWN_DTYPES else 99,
    )


def _row_order(op: OpReport, row: tuple[str, str]) -> tuple[int, int]:
    implementations = list(dict.fromkeys(r.implementation for r in op.results if r.status != Status.SKIP)) or [row[0]]
    checks = list(dict.fromkeys(r.check for r in op.results))
    return (implementations.index(row[0]) if row[0] in implementations else 99, checks.index(row[1]))


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
    """One panel per root cause: the failures of one implementation and check whose messages differ only in their
    numbers are one group, shown by its first case with the count and the others' ids. A build or load error is
    left to the error line under the totals (printed once). Repro commands go under the panel on one unwrapped
    line, so that they copy and paste."""
    unloaded = {op.op for op in report.ops if op.load_exit_code is not None}
    groups = group_failures(
        [r for r in report.results() if r.status.failed and not (r.check == LOAD_CHECK and r.op in unloaded)]
    )
    for members in list(groups.values())[:MAX_FAILURE_PANELS]:
        first = members[0]
        details = failure_details(first) or [("message", first.status.value)]
        body = Text("\n").join(_FAILURE_STYLE[kind](text) for kind, text in details if kind != "repro")
        if len(members) > 1:
            body.append(f"\n{len(members)} cases: {_case_list(members)}", style="dim")
        title = f"[bold red]{_LABEL[first.status]}[/] {first.op}/{first.implementation}::{first.check}"
        title += f" ({len(members)} cases)" if len(members) > 1 else f"[{first.case_id}]"
        console.print(Panel(body, title=title, title_align="left", border_style="red"))
        if first.repro:
            console.print(Text("repro: ", style="dim") + Text(first.repro), soft_wrap=True)
    if len(groups) > MAX_FAILURE_PANELS:
        left = sum(len(m) for m in list(groups.values())[MAX_FAILURE_PANELS:])
        console.print(
            f"[red]... and {len(groups) - MAX_FAILURE_PANELS} more kinds of failure ({left} results; write them all "
            "with --json or --junit).[/red]"
        )


# Case ids named under a grouped failure.
SHOWN_CASES = 4
# What a failure message says that differs from case to case of one cause: numbers and dtype names.
_NUMBER = re.compile(r"\b(b?float|complex|u?int)\d+\b|[-+]?\d+(\.\d+)?(e[-+]?\d+)?|\b(nan|inf)\b")


def group_failures(failures: list[CaseResult]) -> dict[tuple[str, ...], list[CaseResult]]:
    """Failures by (op, implementation, check, status, first line of the message with its numbers blanked)."""
    groups: dict[tuple[str, ...], list[CaseResult]] = {}
    for r in failures:
        signature = _NUMBER.sub("#", (r.message or "").splitlines()[0] if r.message else "")
        groups.setdefault((r.op, r.implementation, r.check, r.status.value, signature), []).append(r)
    return groups


def _case_list(members: list[CaseResult]) -> str:
    ids = [r.case_id for r in members]
    more = f" and {len(ids) - SHOWN_CASES} more" if len(ids) > SHOWN_CASES else ""
    return ", ".join(ids[:SHOWN_CASES]) + more


def render_totals(report: RunReport) -> None:
    counts = report.counts()
    parts = [f"{counts[s.value]} {s.value}" for s in Status if counts[s.value]]
    verdict, style = run_verdict(report)
    suffix = " (incomplete)" if report.incomplete else ""
    if report.shard is not None:
        suffix += f" (shard {shard_text(report.shard)}: merge the shards' --json with opforge merge-reports)"
    for note in report.notes:
        console.print(Text("note: ", style="bold yellow") + Text(note))
    if report.nothing_ran and not report.failed:
        error(
            "opforge check: expected at least one check to run, got none (every case skipped or filtered out; the "
            "skip lines above say why). Pick dtypes, devices and checks the specs claim and this machine has (--dtype, "
            "--device, --check, -k), or run where the device is. A run that checks nothing exits 5, never 0."
        )
    console.print(
        Text(f"{verdict}{suffix}: ", style=style)
        + Text(", ".join(parts) or "nothing ran")
        + Text(f" in {report.seconds:.1f} s", style="dim")
    )


def run_verdict(report: RunReport) -> tuple[str, str]:
    """The run's one-word verdict and its style: FAILED, NOTHING RAN (exit 5) or OK."""
    if report.failed:
        return "FAILED", "bold red"
    if report.nothing_ran:
        return "NOTHING RAN", "bold yellow"
    return "OK", "bold green"
