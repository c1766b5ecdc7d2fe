"""`opforge check`: build an op's kernels and run its checks (the run itself is opforge.run.session's)."""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer

from opforge.checks.catalog import CATALOG
from opforge.commands.app import (
    EXECUTION,
    REPORTS,
    SELECTION,
    CudaArch,
    Devices,
    Dtypes,
    GivenOptions,
    OpsOrSpecs,
    ShardOption,
    app,
    file_reporters,
    finish_files,
    guarded,
    spec_paths,
    validated,
    with_check_options,
    with_report_options,
)
from opforge.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from opforge.core.shard import parse_shard
from opforge.reporters import CHECK_FORMATS
from opforge.reporters import console as out
from opforge.reporters.base import Reporter, ReportFormat
from opforge.run import session
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES


@app.command()
@with_report_options(CHECK_FORMATS)
@with_check_options(CATALOG.options)
def check(
    ops: OpsOrSpecs = None,
    all_specs: Annotated[
        bool, typer.Option("--all", help="Check every bundled spec.", rich_help_panel=SELECTION)
    ] = False,
    dtype: Dtypes = [],  # noqa: B006 (typer copies it)
    device: Devices = [],  # noqa: B006
    check_: Annotated[
        list[str],
        typer.Option(
            "--check",
            help=f"Only these checks (repeatable): {', '.join(CATALOG.names)}, or a result name such as "
            "opcheck:test_schema.",
            rich_help_panel=SELECTION,
            metavar="TEXT",
        ),
    ] = [],  # noqa: B006
    keyword: Annotated[
        str | None,
        typer.Option(
            "-k", help="Only results whose id contains this substring.", rich_help_panel=SELECTION, metavar="TEXT"
        ),
    ] = None,
    shard: ShardOption = None,
    last_failed: Annotated[
        bool,
        typer.Option(
            "--last-failed",
            "--lf",
            help="Only what failed last time (all of it when nothing is recorded).",
            rich_help_panel=SELECTION,
        ),
    ] = False,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help="Base seed; each case derives its own from it and its id.",
            rich_help_panel=EXECUTION,
            metavar="INTEGER",
        ),
    ] = 0,
    fail_fast: Annotated[
        bool, typer.Option("--fail-fast", "-x", help="Stop at the first failure.", rich_help_panel=EXECUTION)
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="List every result.", rich_help_panel=REPORTS)
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds one check on one case may take before it is killed (TIMEOUT); overrides the specs' "
            "`timeout:`. Default 300.",
            rich_help_panel=EXECUTION,
            metavar="FLOAT",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            help="Worker processes at once, each with its own share of the GPUs where there are several: ops run "
            "side by side, and the last op's checks are shared between the free workers. Default: one per core, "
            f"at most {session.AUTO_JOBS_LIMIT}, every one seeing every GPU.",
            show_default=False,
            rich_help_panel=EXECUTION,
            metavar="INTEGER",
        ),
    ] = None,
    no_isolation: Annotated[
        bool,
        typer.Option(
            "--no-isolation",
            help="Run the checks in this process (for a debugger); a crash then ends the run and --timeout does not "
            "apply.",
            rich_help_panel=EXECUTION,
        ),
    ] = False,
    cuda_arch: CudaArch = None,
    *,
    reports: dict[ReportFormat, Path | None],
    opt_ins: GivenOptions,
) -> None:
    """Build an op's kernels and run every check its spec declares.

    Examples:
      opforge check leaky_swish
      opforge check my_op.yaml --dtype float32 --check correctness -k 33x65 -v
      opforge check --all --json report.json --junit report.xml --markdown summary.md
    """

    def body() -> int:
        from opforge.engine.plan import Filters, RunSettings
        from opforge.reporters.lastfailed import LastFailedReport
        from opforge.reporters.terminal import TerminalReport

        _validate_run_options(timeout, jobs, no_isolation)
        filters = Filters(
            dtypes=validated(dtype, KNOWN_DTYPES, "--dtype"),
            devices=validated(device, KNOWN_DEVICES, "--device"),
            checks=validated(check_, CATALOG.names + CATALOG.sub_results, "--check"),
            keyword=keyword,
            shard=parse_shard(shard) if shard else None,
        )
        settings = RunSettings(seed, fail_fast, opt_ins.parse())
        files = file_reporters(reports)
        only_ids, paths = _selection(last_failed, ops or [], all_specs)
        filters = dataclasses.replace(filters, ids=only_ids)
        workers = 1 if no_isolation else jobs or session.auto_jobs()
        options = session.RunOptions(filters, settings, cuda_arch, not no_isolation, workers, timeout, jobs is not None)
        terminal = TerminalReport(verbose)
        with _sigterm_interrupts():
            try:
                run, code = session.run(paths, options, [terminal, *files.values()])
            finally:
                terminal.stop()  # an error leaving the run must not leave the heartbeat printing
            terminal.finish(run)
            if not finish_files(files, run):
                code = max(code, EXIT_USAGE)
            _record_failures(LastFailedReport(Path.cwd(), filters, fail_fast), run)
        if run.incomplete:
            out.error("interrupted: the results above and the reports written are incomplete")
            return EXIT_INTERRUPTED
        return code

    guarded(body)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """A cancelled CI job gets SIGTERM: stop like Ctrl-C (workers killed, reports written, marked incomplete) rather
    than die with no reports and workers left running. Covers the run and the report writing, in either mode."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python installs signal handlers on the main thread only (a test runner's worker thread)
        return

    def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _validate_run_options(timeout: float | None, jobs: int | None, no_isolation: bool) -> None:
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError("--timeout", "a number of seconds > 0", repr(timeout), "Write e.g. --timeout 600.")
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs", "a number of processes >= 1", repr(jobs), "Write e.g. -j 2.")
    parallel = jobs is not None and jobs > 1
    if no_isolation and (parallel or timeout is not None):
        option = "--jobs" if parallel else "--timeout"
        raise UsageError(
            option,
            "worker processes",
            "--no-isolation",
            f"Drop {option} or --no-isolation: only worker processes can run in parallel or be killed.",
        )


def _selection(last_failed: bool, ops: list[str], all_specs: bool) -> tuple[tuple[str, ...], list[Path]]:
    """(result ids to keep, spec paths to run)."""
    if not last_failed:
        return (), spec_paths(ops, all_specs)
    from opforge.run.last_failed import select

    chosen = spec_paths(ops, all_specs) if ops or all_specs else None
    selection = select(Path.cwd(), chosen)
    for note in selection.notes:
        out.info(note)
    if selection.paths is not None:
        return selection.ids, selection.paths
    return selection.ids, chosen if chosen is not None else spec_paths([], False)


def _record_failures(reporter: Reporter, run: Any) -> None:
    try:
        reporter.finish(run)
    except OSError as exc:  # a read-only checkout must not fail the run; --last-failed then reruns everything
        out.info(f"could not record the failures for --last-failed: {exc}")
