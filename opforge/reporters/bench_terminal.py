"""The terminal format of `opforge bench`: a progress bar over (point, contender) pairs on a terminal, a table per
op, the regression gate's summary, the points slower than a baseline and the totals."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from opforge.core.results import describe_mismatch
from opforge.engine.events import Events
from opforge.reporters import console as out
from opforge.reporters.console import Heartbeat, console, error, warning

if TYPE_CHECKING:
    from opforge.bench.baseline import Comparison
    from opforge.bench.model import BenchResult, BenchRun


@contextmanager
def bench_progress(total: int) -> Iterator[Callable[[BenchResult], None]]:
    """A progress bar over (point, contender) pairs on a terminal; in a log, a heartbeat line every few seconds."""
    if not console.is_terminal:
        done: list[str] = []
        with Heartbeat(lambda: f"bench: {len(done)}/{total} results done" + (f", last {done[-1]}" if done else "")):
            yield lambda result: done.append(result.id)
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

        def advance(result: BenchResult) -> None:
            bar.update(task, advance=1, last=result.id)

        yield advance


class BenchProgress(Events):
    """What `opforge bench` shows while it runs, subscribed to the run's events: a spinner over each long task
    (loading an op, measuring a peak), the build's messages, then the progress bar (bench_progress) from `planned`
    to `finish`."""

    def __init__(self) -> None:
        self._tasks: dict[str, ExitStack] = {}
        self._bar = ExitStack()
        self._advance: Callable[[BenchResult], None] = lambda result: None

    def task_started(self, name: str) -> None:
        stack = self._tasks[name] = ExitStack()
        stack.enter_context(out.spinner(name))

    def task_finished(self, name: str) -> None:
        self._tasks.pop(name).close()

    def step(self, message: str) -> None:
        out.info(message)

    def planned(self, op: str, total: int) -> None:
        self._advance = self._bar.enter_context(bench_progress(total))

    def result(self, op: str, result: BenchResult) -> None:
        self._advance(result)

    def finish(self, run: BenchRun) -> None:
        self._bar.close()


# IQR / median above which a result is flagged noisy: two contenders 10% apart are then not told apart by their
# medians alone.
NOISY_IQR = 0.10


def noise_note(median_s: float | None, iqr_s: float | None) -> str:
    if not median_s or iqr_s is None or iqr_s / median_s <= NOISY_IQR:
        return ""
    return f"noisy: IQR {iqr_s / median_s:.0%} of median"


LABEL_COLUMNS = ("dtype", "mode", "device")
NUMBER_COLUMNS = ("median", "IQR", "GB/s", "% peak")
# Every cell but the case label and the note, a number above all, is never cut: its column is as wide as its widest
# cell. The case label breaks after its commas (x=8192x8192,/weight=8192) down to MIN_SIZE_WIDTH columns, and the
# note folds into what is left, at least MIN_NOTE_WIDTH where there is a note.
MIN_SIZE_WIDTH = 20
MIN_NOTE_WIDTH = 12


def _table(title: str, headers: list[str], kept: list[int], body: list[list[Text]], size_width: int = 0) -> Table:
    table = Table(title=title, title_justify="left")
    # The note takes what the other columns leave (rich's own share-out came out a column too wide, and the
    # console then cut the table's right edge).
    note_width = max(len("note"), console.width - _fixed_width(headers, kept, body, note=False) - size_width)
    for i in kept:
        name = headers[i]
        if name == "size":
            table.add_column(name, overflow="fold", min_width=size_width)
        elif name == "note":
            table.add_column(name, overflow="fold", max_width=note_width)
        else:
            widest = max([len(name), *(cells[i].cell_len for cells in body)])
            right = name in NUMBER_COLUMNS or name.startswith("vs ")
            table.add_column(name, no_wrap=True, min_width=widest, justify="right" if right else "left")
    for cells in body:
        row = [cells[i] for i in kept]
        if headers[kept[0]] == "size":
            row[0] = Text(_broken_at_commas(cells[0].plain, size_width))
        table.add_row(*row)
    return table


def _fixed_width(headers: list[str], kept: list[int], body: list[list[Text]], note: bool) -> int:
    """The table's width but for the case label's content: each other column as wide as its widest cell (the note,
    when counted, at MIN_NOTE_WIDTH or its widest, the narrower), plus a border and a space either side of each."""
    fixed = 3 * len(kept) + 1
    for i in kept:
        cells = [cells[i].cell_len for cells in body]
        if headers[i] == "note":
            fixed += max(len("note"), min(MIN_NOTE_WIDTH, max(cells, default=0))) if note else 0
        elif headers[i] != "size":
            fixed += max([len(headers[i]), *cells])
    return fixed


def _size_width(headers: list[str], kept: list[int], body: list[list[Text]]) -> int:
    """How wide the case label's column can be on this console: the whole label where it fits beside the other
    columns, else what is left; 0 where less than MIN_SIZE_WIDTH is left."""
    widest_label = max([len("size"), *(cells[0].cell_len for cells in body)])
    width = min(widest_label, console.width - _fixed_width(headers, kept, body, note=True))
    return width if width >= min(widest_label, MIN_SIZE_WIDTH) else 0


def _broken_at_commas(label: str, width: int) -> str:
    """The label on lines of at most `width` characters, broken after commas (a longer piece is folded by rich)."""
    parts = label.split(",")
    lines = [""]
    for piece in [p + "," for p in parts[:-1]] + parts[-1:]:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def render_bench(run: BenchRun) -> None:
    """One table per op: a row per (point, contender), speedups over each baseline timed on the same point."""
    from opforge.bench.model import BASELINE

    for device, peak in run.peaks.items():
        origin = "cached" if peak.get("cached") else "measured now"
        console.print(f"[dim]peak {device}: {peak['gbps']:.1f} GB/s ({peak['method']}; {origin})[/dim]")
    baselines = list(dict.fromkeys(r.contender for r in run.results if r.role == BASELINE))
    headers = ["size", *LABEL_COLUMNS, "contender", *NUMBER_COLUMNS, *(f"vs {b}" for b in baselines), "note"]
    for op in run.ops():
        op_results = [r for r in run.results if r.op == op]
        body = [_bench_cells(r, op_results, baselines) for r in op_results]
        # A label every row shares goes to the title: one column less to fit.
        shared = {name: body[0][i].plain for i, name in enumerate(headers) if name in LABEL_COLUMNS}
        shared = {
            name: value for name, value in shared.items() if all(c[headers.index(name)].plain == value for c in body)
        }
        title = f"opforge bench {op}" + (f" ({', '.join(shared.values())})" if shared else "")
        kept = [i for i, name in enumerate(headers) if name not in shared]
        size_width = _size_width(headers, kept, body)
        if size_width:
            console.print(_table(title, headers, kept, body, size_width))
        else:
            # Too wide even with the case label broken: a table per point (case and the labels that differ), all of
            # them in its title.
            labels = [i for i in kept if headers[i] == "size" or headers[i] in LABEL_COLUMNS]
            columns = [i for i in kept if i not in labels]
            for point in dict.fromkeys(tuple(cells[i].plain for i in labels) for cells in body):
                rows_of_point = [cells for cells in body if tuple(cells[i].plain for i in labels) == point]
                console.print(_table(f"{title} {' '.join(point)}", headers, columns, rows_of_point))
        if any(_noise(r) for r in op_results):
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


def _bench_cells(r: BenchResult, op_results: list[BenchResult], baselines: list[str]) -> list[Text]:
    """One table row: the point, the timing (or the status where there is none), the speedups and the notes."""
    from opforge.bench.baseline import format_seconds
    from opforge.bench.model import ERROR, SKIP, WRONG, speedups

    if r.status in (WRONG, ERROR, SKIP):
        label, style = {WRONG: ("WRONG", "bold red"), ERROR: ("ERROR", "bold red"), SKIP: ("skip", "dim")}[r.status]
        timing = [Text(label, style=style)] + [Text("")] * (3 + len(baselines))
        note = r.message.splitlines()[0] if r.message else ""
    else:
        ups = speedups(r, op_results)
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
    return [Text(r.case), Text(r.dtype), Text(r.mode), Text(r.device), Text(r.contender), *timing, notes]


def _noise(r: BenchResult) -> str:
    from opforge.bench.model import ERROR, SKIP, WRONG

    return "" if r.status in (WRONG, ERROR, SKIP) else noise_note(r.median_s, r.iqr_s)


def _fixed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _significant(value: float | None) -> str:
    """Three significant digits, so 0.00437 GB/s of a tiny size is not shown as 0.0."""
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def render_comparison(comparison: Comparison, markdown: str) -> None:
    for difference in comparison.environment_differences:
        warning(f"environment differs from the baseline: {difference}")
    for ident, differences in comparison.incomparable:
        warning(f"{ident} was timed differently from the baseline ({'; '.join(differences)}): not gated")
    if comparison.only_old:
        warning(f"{len(comparison.only_old)} case(s) of the baseline were not run: {', '.join(comparison.only_old)}")
    console.print(markdown, markup=False, highlight=False, soft_wrap=True)


def render_trailing(run: BenchRun, gated: tuple[str, ...]) -> None:
    """The implementations' points slower than a baseline beyond the noise: failures for a baseline named by
    --fail-slower-than, the others for the reader; and each such baseline that nothing was compared with."""
    from opforge.bench.trailing import nothing_compared, uncompared

    for name in uncompared(run.results, gated):
        error(nothing_compared(name))
    if not run.trailing:
        return
    console.print(Text("slower than a baseline of this run, beyond its noise:", style="bold"))
    for trail in run.trailing:
        style = "yellow" if trail.declared or trail.baseline not in gated else "red"
        known = Text(f"; declared in its spec: {trail.declared}", style="dim") if trail.declared else Text("")
        console.print(Text(f"  {trail.result}: ", style=style) + Text(trail.describe()) + known, soft_wrap=True)


def render_bench_totals(run: BenchRun, comparison: Comparison | None = None) -> None:
    from opforge.bench.model import ERROR, OK, SKIP, WRONG, status_word

    counts = {s: sum(r.status == s for r in run.results) for s in (OK, WRONG, ERROR, SKIP)}
    parts = [f"{counts[OK]} timed"] + [f"{counts[s]} {status_word(s)}" for s in (WRONG, ERROR, SKIP) if counts[s]]
    if run.trailing:
        declared = sum(bool(t.declared) for t in run.trailing)
        parts.append(f"{len(run.trailing)} slower than a baseline" + (f" ({declared} declared)" if declared else ""))
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
        why += [f"{counts[s]} {status_word(s)}" for s in (WRONG, ERROR, SKIP) if counts[s]] or (
            [] if why else ["no case planned"]
        )
        error(
            f"opforge bench: expected at least one timed case, got none ({'; '.join(why)}). Pick a device, dtype, "
            "mode and contender that can run here (--device, --dtype, --mode, --contender), or fix the errors above."
        )
    verdict, style = "OK", "bold green"
    if run.failed:
        verdict, style = "FAILED", "bold red"
    elif run.nothing_timed:
        verdict, style = "NOTHING TIMED", "bold yellow"
    console.print(
        Text(f"{verdict}: ", style=style) + Text(", ".join(parts)) + Text(f" in {run.seconds:.1f} s", style="dim")
    )
