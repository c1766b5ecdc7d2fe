"""Reporters: one module per format. Each receives a run's results as they arrive and the finished run; the tables
below register the file formats, and the CLI builds its report options (`--json`, `--junit`, ...) from them.

Formats of `opforge check`: `terminal` (always), `json_report`, `junit`, `markdown`, `lastfailed` (always: the
failures `--last-failed` reruns). Of `opforge bench`: `bench_terminal` (always), `json_report`, `junit`, `csv_report`,
`plot`. Of `opforge fuzz`: `fuzz_report` (the terminal and its own JSON), `junit`, `markdown`. JUnit and Markdown render
a results.RunReport; bench and fuzz give theirs (BenchRun.run_report, FuzzReport.run_report). The other commands'
terminal output, one module per thing rendered: `list_terminal`, `build_terminal`, `doctor_terminal`,
`profile_terminal`, `scan_terminal`. `console` owns the rich Console; `base` says what a reporter and a file format are.
"""

from __future__ import annotations

from opforge.reporters.base import ReportFormat


def _require_plotting() -> None:
    from opforge.reporters.plot import require_plotting

    require_plotting()


MARKDOWN = ReportFormat(
    "--markdown",
    "Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).",
    "Markdown summary",
    "markdown:MarkdownReport",
)
CHECK_FORMATS = (
    ReportFormat("--json", "Write a JSON report here.", "JSON report", "json_report:JsonReport"),
    ReportFormat("--junit", "Write a JUnit XML report here.", "JUnit report", "junit:JunitReport"),
    MARKDOWN,
)
FUZZ_FORMATS = (
    ReportFormat(
        "--json",
        "Write the failures, the search's figures and its results (the `opforge check --json` form) here.",
        "JSON report",
        "fuzz_report:FuzzJsonReport",
    ),
    ReportFormat(
        "--junit",
        "Write a JUnit XML report here: a failed testcase per failure, named by its oracle and minimal example.",
        "JUnit report",
        "junit:JunitReport",
    ),
    MARKDOWN,
)
BENCH_FORMATS = (
    ReportFormat(
        "--json",
        "Write every result with its raw samples and the environment here.",
        "JSON",
        "json_report:BenchJsonReport",
    ),
    ReportFormat(
        "--junit",
        "Write a JUnit XML report here: a testcase per contender and case, a WRONG or regressed one failed.",
        "JUnit report",
        "junit:JunitReport",
    ),
    ReportFormat("--csv", "Write one CSV row per result here.", "CSV", "csv_report:BenchCsvReport"),
    ReportFormat(
        "--plot", "Plot GB/s against size into this PNG.", "plot", "plot:BenchPlotReport", preflight=_require_plotting
    ),
)
