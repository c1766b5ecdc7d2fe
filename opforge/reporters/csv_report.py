"""`opforge bench --csv`: one row per result, with the speedup over each baseline timed on the same case."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from opforge.bench.model import BASELINE, BenchRun, speedups
from opforge.core.files import write_atomically
from opforge.reporters.base import Reporter


class BenchCsvReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: BenchRun) -> None:
        write_csv(run, self.path)


CSV_COLUMNS = (
    "id",
    "op",
    "contender",
    "role",
    "device",
    "dtype",
    "mode",
    "case",
    "elements",
    "status",
    "bytes",
    "median_s",
    "iqr_s",
    "gbps",
    "pct_of_peak",
    "peak_gbps",
    "reps",
    "method",
    "threads",
    "message",
)


def write_csv(run: BenchRun, path: Path) -> None:
    baselines = sorted({r.contender for r in run.results if r.role == BASELINE})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + tuple(f"speedup_vs_{b}" for b in baselines))
    for r in run.results:
        row = r.to_json()
        timing = row["timing"] or {}
        row.update(reps=len(timing.get("samples") or []), method=timing.get("method"), threads=timing.get("threads"))
        ups = speedups(r, run.results)
        writer.writerow([_cell(row.get(c)) for c in CSV_COLUMNS] + [_cell(ups.get(b)) for b in baselines])
    write_atomically(path, out.getvalue())


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
