"""`opforge merge-reports`: one report from the --json reports of a run's shards or of several machines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import app, file_reporters, finish_files, guarded, with_report_options
from opforge.core.errors import EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, UsageError
from opforge.reporters import CHECK_FORMATS
from opforge.reporters import console as out
from opforge.reporters.base import ReportFormat
from opforge.run.session import exit_code


@app.command("merge-reports")
@with_report_options(CHECK_FORMATS)
def merge_reports(
    paths: Annotated[
        list[Path],
        typer.Argument(help="The --json reports of `check` (or of `bench`) runs: every shard of a split."),
    ],
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every result.")] = False,
    *,
    reports: dict[ReportFormat, Path | None],
) -> None:
    """Join the --json reports of a run's shards (`--shard K/N` jobs) or of several machines into one report.

    Check reports are shown as `opforge check` shows a run, and exit as it would. Bench reports are joined into
    one bench JSON (a baseline for `opforge bench --baseline`). Every shard of a split must be there.

    Examples:
      opforge merge-reports shard-*/report.json --junit merged.xml --markdown "$GITHUB_STEP_SUMMARY"
      opforge merge-reports cpu.json gpu.json --json all.json
      opforge merge-reports bench-*.json --json bench-baseline.json
    """

    def body() -> int:
        from opforge.core.files import write_atomically
        from opforge.core.results import dumps_json
        from opforge.reporters.terminal import TerminalReport
        from opforge.tools.merge import (
            BENCH,
            check_kinds_and_shards,
            merge_bench_reports,
            merge_check_reports,
            read_report,
        )

        read = [read_report(path) for path in paths]
        if check_kinds_and_shards(read) == BENCH:
            asked = {fmt.option: path for fmt, path in reports.items() if path is not None}
            if set(asked) - {"--json"} or not asked:
                raise UsageError(
                    "merge-reports",
                    "--json for bench reports",
                    ", ".join(asked) or "no report option",
                    "Pass --json PATH: bench reports merge into one bench JSON.",
                )
            merged = merge_bench_reports(read)
            write_atomically(asked["--json"], dumps_json(merged, indent=1))
            out.info(f"merged {len(merged['results'])} bench results of {len(read)} reports: {asked['--json']}")
            return EXIT_OK if merged["results"] else EXIT_NOTHING_RAN
        files = file_reporters(reports)
        run = merge_check_reports(read)
        TerminalReport(verbose).finish(run)
        code = exit_code(run)
        if not finish_files(files, run):
            code = max(code, EXIT_USAGE)
        return code

    guarded(body)
