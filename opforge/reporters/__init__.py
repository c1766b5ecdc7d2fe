"""Reporters: one module per format. Each receives a run's results as they arrive and the finished run; the tables
below register the file formats, and the CLI builds its report options (`--json`, `--junit`, ...) from them.

Formats of `opforge check`: `terminal` (always), `json_report`, `junit`, `markdown`, `lastfailed` (always: what
`--last-failed` reruns). Of `opforge bench`: `bench_terminal` (always), `json_report`, `csv_report`, `plot`.
`console` owns the rich Console; `base` says what a reporter and a file format are.
"""

from __future__ import annotations

from opforge.reporters.base import ReportFormat


def _require_plotting() -> None:
    from opforge.reporters.plot import require_plotting

    require_plotting()


CHECK_FORMATS = (
    ReportFormat("--json", "Write a JSON report here.", "JSON report", "json_report:JsonReport"),
    ReportFormat("--junit", "Write a JUnit XML report here.", "JUnit report", "junit:JunitReport"),
    ReportFormat(
        "--markdown",
        "Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).",
        "Markdown summary",
        "markdown:MarkdownReport",
    ),
)
BENCH_FORMATS = (
    ReportFormat(
        "--json",
        "Write every result with its raw samples and the environment here.",
        "JSON",
        "json_report:BenchJsonReport",
    ),
    ReportFormat("--csv", "Write one CSV row per result here.", "CSV", "csv_report:BenchCsvReport"),
    ReportFormat(
        "--plot", "Plot GB/s against size into this PNG.", "plot", "plot:BenchPlotReport", preflight=_require_plotting
    ),
)
