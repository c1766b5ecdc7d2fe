"""The terminal format of `opforge bench`: a progress bar over (point, contender) pairs on a terminal, a table per
op, the regression gate's summary and the totals."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from opforge.reporters.console import Heartbeat, console, error, warning
from opforge.results import describe_mismatch


@contextmanager
def bench_progress(total: int) -> Iterator[Callable[[object], None]]:
    """A progress bar over (point, contender) pairs on a terminal; in a log, a heartbeat line every few seconds."""
    if not console.is_terminal:
        done: list[str] = []
        with Heartbeat(lambda: f"bench: {len(done)}/{total} rows done" + (f", last {done[-1]}" if done else "")):
            yield lambda result: done.append(result.id)  # type: ignore[attr-defined]
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


# IQR / median above which a row is flagged noisy: two contenders 10% apart are then not told apart by their
# medians alone.
NOISY_IQR = 0.10


def noise_note(median_s: float | None, iqr_s: float | None) -> str:
    if not median_s or iqr_s is None or iqr_s / median_s <= NOISY_IQR:
        return ""
    return f"noisy: IQR {iqr_s / median_s:.0%} of median"


LABEL_COLUMNS = ("dtype", "mode", "device")
NUMBER_COLUMNS = ("median", "IQR", "GB/s", "% peak")
# The case label folds onto more lines before it gets narrower than this (the note folds freely); every other cell,
# a number above all, is never cut: its column is as wide as its widest cell.
MIN_SIZE_WIDTH = 20


def _table(title: str, headers: list[str], kept: list[int], body: list[list[Text]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i in kept:
        table.add_column(headers[i], **_column_style(headers[i], [cells[i] for cells in body]))
    for cells in body:
        table.add_row(*(cells[i] for i in kept))
    return table


def _narrowest(headers: list[str], kept: list[int], body: list[list[Text]]) -> int:
    """The table's width with every column at its minimum: each column's cells (the note at its header's width),
    plus a border and a space either side of each."""
    widths = [_column_style(headers[i], [cells[i] for cells in body]).get("min_width", len(headers[i])) for i in kept]
    return sum(widths) + 3 * len(widths) + 1


def _column_style(name: str, cells: list[Text]) -> dict:
    widest = max([len(name), *(c.cell_len for c in cells)])
    if name == "size":
        return {"overflow": "fold", "min_width": min(widest, MIN_SIZE_WIDTH)}
    if name == "note":
        return {"overflow": "fold"}
    right = name in NUMBER_COLUMNS or name.startswith("vs ")
    return {"no_wrap": True, "min_width": widest, "justify": "right" if right else "left"}


def render_bench(run) -> None:
    """One table per op: a row per (point, contender), speedups over each baseline timed on the same point."""
    from opforge.bench.model import BASELINE

    for device, peak in run.peaks.items():
        origin = "cached" if peak.get("cached") else "measured now"
        console.print(f"[dim]peak {device}: {peak['gbps']:.1f} GB/s ({peak['method']}; {origin})[/dim]")
    baselines = list(dict.fromkeys(r.impl for r in run.results if r.role == BASELINE))
    headers = ["size", *LABEL_COLUMNS, "impl", *NUMBER_COLUMNS, *(f"vs {b}" for b in baselines), "note"]
    for op in run.ops():
        rows = [r for r in run.results if r.op == op]
        body = [_bench_cells(r, rows, baselines) for r in rows]
        # A label every row shares goes to the title: one column less to fit.
        shared = {name: body[0][i].plain for i, name in enumerate(headers) if name in LABEL_COLUMNS}
        shared = {
            name: value for name, value in shared.items() if all(c[headers.index(name)].plain == value for c in body)
        }
        title = f"opforge bench {op}" + (f" ({', '.join(shared.values())})" if shared else "")
        kept = [i for i, name in enumerate(headers) if name not in shared]
        if _narrowest(headers, kept, body) <= console.width:
            console.print(_table(title, headers, kept, body))
        else:
            # Too wide even with the case label folded: a table per case, the label in its title.
            for case in dict.fromkeys(cells[0].plain for cells in body):
                rows_of_case = [cells for cells in body if cells[0].plain == case]
                console.print(_table(f"{title} {case}", headers, kept[1:], rows_of_case))
        if any(_noise(r) for r in rows):
            console.print(
                Text(
                    f"noisy: an IQR above {NOISY_IQR:.0%} of the median makes speedups unreliable. Time longer "
                    "(--budget, --min-reps), set transparent huge pages to madvise for CPU runs (opforge doctor), or "
                    "keep other work off the cores (taskset, an idle GPU).",
                    style="yellow",
                )
            )
    for r in run.results:
        if r.mismatch is not None:
            console.print(Text(f"WRONG {r.id}: ", style="bold red") + Text(describe_mismatch(r.mismatch)))
    for device, reason in run.skipped.items():
        console.print(f"[dim]skip {device}: {reason}[/dim]")


def _bench_cells(r, rows: list, baselines: list[str]) -> list[Text]:
    """One table row: the point, the timing (or the status where there is none), the speedups and the notes."""
    from opforge.bench.baseline import format_seconds
    from opforge.bench.model import ERROR, SKIP, WRONG, speedups

    if r.status in (WRONG, ERROR, SKIP):
        label, style = {WRONG: ("WRONG", "bold red"), ERROR: ("ERROR", "bold red"), SKIP: ("skip", "dim")}[r.status]
        timing = [Text(label, style=style)] + [Text("")] * (3 + len(baselines))
        note = r.message.splitlines()[0] if r.message else ""
    else:
        ups = speedups(r, rows)
        timing = [
            Text(format_seconds(r.median_s)),
            Text(format_seconds(r.iqr_s)),
            Text(_significant(r.gbps)),
            Text(_fixed(r.pct_of_peak, 1)),
        ]
        timing += [
            Text(f"{ups[b]:.2f}x", style="green" if ups[b] >= 1 else "yellow") if b in ups else Text("")
            for b in baselines
        ]
        note = r.message
    noise = _noise(r)
    notes = Text(note, style="dim") + Text(("; " if note and noise else "") + noise, style="yellow")
    return [Text(r.case), Text(r.dtype), Text(r.mode), Text(r.device), Text(r.impl), *timing, notes]


def _noise(r) -> str:
    from opforge.bench.model import ERROR, SKIP, WRONG

    return "" if r.status in (WRONG, ERROR, SKIP) else noise_note(r.median_s, r.iqr_s)


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
    verdict, style = "OK", "bold green"
    if failed:
        verdict, style = "FAILED", "bold red"
    elif run.nothing_timed:
        verdict, style = "NOTHING TIMED", "bold yellow"
    console.print(
        Text(f"{verdict}: ", style=style) + Text(", ".join(parts)) + Text(f" in {run.seconds:.1f} s", style="dim")
    )
