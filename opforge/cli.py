"""The command line. Commands are thin: parse, call the library, render, map errors to exit codes.

Exit codes (defined in opforge.errors): 0 all passed (skip and xfail allowed), 1 a check failed, 2 bad usage or a bad
spec, 3 a build failed, 4 an internal error (a bug in opforge: rerun with --debug and report it), 130 interrupted
(Ctrl-C or SIGTERM; the reports written are marked incomplete), 5 nothing was checked (or timed): never a pass.
When several ops run, the highest of 3, 2 and 1 that applies.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from opforge.checks.base import CheckOption, OptIns
from opforge.checks.catalog import CATALOG
from opforge.errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_RAN,
    EXIT_OK,
    EXIT_USAGE,
    BuildError,
    OpforgeError,
    UsageError,
)
from opforge.reporters import BENCH_FORMATS, CHECK_FORMATS
from opforge.reporters import console as out
from opforge.reporters.base import NotWritten, Reporter, ReportFormat
from opforge.shard import parse_shard
from opforge.spec.load import find_spec, list_specs, load_spec
from opforge.spec.model import BENCH_LAYOUTS, BENCH_MODES, KNOWN_DEVICES, KNOWN_DTYPES, OpSpec

# What a value looks like, for the help's type column. typer 0.29 shows Python annotations there (`<bool>`,
# `<list[str]>`); a user wants nothing for a flag and a word for a value, as click used to show.
_VALUE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "file": "PATH"}


def _value_word(param: Any, ctx: Any) -> str | None:
    if param.metavar is not None:
        return str(param.metavar)
    label = str(param.display_type(ctx)).strip("<>")
    label = label.removeprefix("list[").removesuffix("]")
    if label == "bool":
        return None
    return _VALUE_WORDS.get(label, label.upper())


typer.core.TyperOption.display_type_rich = _value_word  # type: ignore[method-assign, assignment]
typer.core.TyperArgument.display_type_rich = _value_word  # type: ignore[method-assign, assignment]

app = typer.Typer(
    name="opforge",
    help="Prove a PyTorch custom operator right before you ship it.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}

# Options shared by several commands, declared once.
# The panels `--help` groups options into.
SELECTION, REPORTS, EXECUTION = "Selection", "Reports", "Execution"
Targets = Annotated[list[str] | None, typer.Argument(help="Op names (see `opforge list`) or paths to spec files.")]
Devices = Annotated[
    list[str],
    typer.Option(
        "--device", help=f"Only these devices (repeatable): {', '.join(KNOWN_DEVICES)}.", rich_help_panel=SELECTION
    ),
]
Dtypes = Annotated[
    list[str],
    typer.Option(
        "--dtype", help=f"Only these dtypes (repeatable): {', '.join(KNOWN_DTYPES)}.", rich_help_panel=SELECTION
    ),
]
ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="K/N",
        help="Only the K-th of N shares of the work (a stable split, for a CI matrix); join the shards' --json "
        "reports with `opforge merge-reports`.",
        rich_help_panel=SELECTION,
    ),
]
CudaArch = Annotated[
    str | None, typer.Option("--cuda-arch", help="CUDA archs to build for, e.g. 9.0.", rich_help_panel=EXECUTION)
]
Modes = Annotated[
    list[str], typer.Option("--mode", help="fwd, bwd or fwd+bwd (repeatable).", rich_help_panel=SELECTION)
]
Impls = Annotated[
    list[str],
    typer.Option(
        "--impl",
        help="Only these contenders: native, a spec implementation, eager, compile (repeatable).",
        rich_help_panel=SELECTION,
    ),
]
Sizes = Annotated[
    list[str],
    typer.Option(
        "--sizes",
        help="Elements per tensor input, e.g. 2**20,2**24 (replaces the spec's sizes and shapes).",
        rich_help_panel=SELECTION,
    ),
]


def _print_version(asked: bool) -> None:
    if asked:
        from opforge import __version__

        out.info(f"opforge {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print opforge's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    _state["debug"] = debug


def _guarded(command: Callable[[], int]) -> None:
    """Run a command body, turning opforge's errors into a one-line message and an exit code."""
    try:
        code = command()
    except OpforgeError as exc:
        if _state["debug"]:
            raise
        out.error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        out.error("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug in opforge: say so briefly, keep the traceback for --debug
        if _state["debug"]:
            worker_traceback = getattr(exc, "worker_traceback", "")
            if worker_traceback:
                out.error(f"the worker's traceback:\n{worker_traceback.rstrip()}")
            raise
        out.error(f"internal error: {type(exc).__name__}: {exc}. Rerun with --debug and report the traceback.")
        code = EXIT_INTERNAL
    raise typer.Exit(code)


def with_report_options(formats: tuple[ReportFormat, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one `--option PATH` per report format of `formats`; the command receives them as
    `reports={format: path or None}`."""

    def param_name(fmt: ReportFormat) -> str:
        return "report_" + fmt.option.lstrip("-").replace("-", "_")

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name != "reports"]
        options = [
            inspect.Parameter(
                param_name(fmt),
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[Path | None, typer.Option(fmt.option, help=fmt.help, rich_help_panel=REPORTS)],
            )
            for fmt in formats
        ]

        @functools.wraps(command)
        def with_reports(**kwargs: Any) -> None:
            reports = {fmt: kwargs.pop(param_name(fmt)) for fmt in formats}
            command(**kwargs, reports=reports)

        with_reports.__signature__ = signature.replace(parameters=params + options)  # type: ignore[attr-defined]
        with_reports.__annotations__ = {p.name: p.annotation for p in params + options}
        return with_reports

    return decorate


def with_check_options(options: tuple[CheckOption, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the options the checks own (`--large`, `--sanitize TOOLS`: CheckOption, from the catalog); the
    command receives them as `opt_ins` (GivenOptions, parsed into OptIns in its body). A check's flag lives in its
    module, not here."""

    def param_name(option: CheckOption) -> str:
        return "option_" + option.name.replace("-", "_")

    def annotation(option: CheckOption) -> Any:
        kind = typer.Option(option.flag, help=option.help, metavar=option.metavar, rich_help_panel=EXECUTION)
        return Annotated[bool, kind] if option.metavar is None else Annotated[str | None, kind]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name != "opt_ins"]
        added = [
            inspect.Parameter(
                param_name(o),
                inspect.Parameter.KEYWORD_ONLY,
                default=False if o.metavar is None else None,
                annotation=annotation(o),
            )
            for o in options
        ]

        @functools.wraps(command)
        def with_options(**kwargs: Any) -> None:
            given = {o: kwargs.pop(param_name(o)) for o in options}
            kwargs["opt_ins"] = GivenOptions(given)
            command(**kwargs)

        with_options.__signature__ = signature.replace(parameters=params + added)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params + added}
        return with_options

    return decorate


class GivenOptions:
    """The check options as given, parsed (a bad value is a UsageError) when the command's body runs, where errors
    become exit codes."""

    def __init__(self, given: dict[CheckOption, Any]):
        self.given = given

    def parse(self) -> OptIns:
        values = {
            o.name: (o.parse(v) if o.parse is not None and isinstance(v, str) else v) for o, v in self.given.items()
        }
        return OptIns.of(**values)


def _specs(targets: list[str], all_specs: bool) -> list[Path]:
    if all_specs:
        return list_specs()
    if not targets:
        raise UsageError(
            "opforge check", "an op name, a spec path or --all", "nothing", "Run `opforge list` to see the bundled ops."
        )
    return [find_spec(t) for t in targets]


def _validate(values: list[str], known: tuple[str, ...], option: str) -> tuple[str, ...]:
    for value in values:
        if value not in known:
            raise UsageError(option, f"one of {', '.join(known)}", repr(value), f"Fix the {option} value.")
    return tuple(values)


# ------------------------------------------------------------------------------------------------------- check


@app.command()
@with_report_options(CHECK_FORMATS)
@with_check_options(CATALOG.options)
def check(
    targets: Targets = None,
    all_specs: Annotated[
        bool, typer.Option("--all", help="Check every bundled spec.", rich_help_panel=SELECTION)
    ] = False,
    dtype: Dtypes = [],  # noqa: B006 (typer copies it)
    device: Devices = [],  # noqa: B006
    check_: Annotated[
        list[str],
        typer.Option(
            "--check",
            help=f"Only these checks (repeatable): {', '.join(CATALOG.names)}, or a sub-row such as "
            "opcheck:test_schema.",
            rich_help_panel=SELECTION,
        ),
    ] = [],  # noqa: B006
    keyword: Annotated[
        str | None, typer.Option("-k", help="Only results whose id contains this substring.", rich_help_panel=SELECTION)
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
            "--seed", help="Base seed; each case derives its own from it and its id.", rich_help_panel=EXECUTION
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
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            help="Check this many ops at once, each in its own process (each with its own share of the GPUs where "
            "there are several).",
            rich_help_panel=EXECUTION,
        ),
    ] = 1,
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
        from opforge.engine.plan import Filters
        from opforge.reporters.lastfailed import LastFailedReport
        from opforge.reporters.terminal import TerminalReport
        from opforge.results import RunReport

        _validate_run_options(timeout, jobs, no_isolation)
        filters = Filters(
            dtypes=_validate(dtype, KNOWN_DTYPES, "--dtype"),
            devices=_validate(device, KNOWN_DEVICES, "--device"),
            checks=_validate(check_, CATALOG.names + CATALOG.sub_rows, "--check"),
            keyword=keyword,
            seed=seed,
            fail_fast=fail_fast,
            opt_ins=opt_ins.parse(),
            shard=parse_shard(shard) if shard else None,
        )
        files = _file_reporters(reports)
        only_ids, paths = _selection(last_failed, targets or [], all_specs)
        filters = dataclasses.replace(filters, ids=only_ids)
        run = RunReport(environment={}, seed=seed, shard=filters.shard)
        specs = _load_specs(paths, run)
        run.notes += _unlisted_check_notes(specs, filters)
        terminal = TerminalReport(verbose)
        with _sigterm_interrupts():
            start = time.perf_counter()
            try:
                _run(specs, filters, cuda_arch, timeout, jobs, no_isolation, run, [terminal, *files.values()])
            except KeyboardInterrupt:
                run.incomplete = True
            finally:
                terminal.stop()  # an error leaving _run must not leave the heartbeat printing
            run.seconds = time.perf_counter() - start
            if not run.environment:
                from opforge.environment import host_environment

                run.environment = host_environment()
            terminal.finish(run)
            code = _exit_code(run)
            if not _finish_files(files, run):
                code = max(code, EXIT_USAGE)
            _record_failures(LastFailedReport(Path.cwd(), filters), run)
        if run.incomplete:
            out.error("interrupted: the results above and the reports written are incomplete")
            return EXIT_INTERRUPTED
        return code

    _guarded(body)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """A cancelled CI job gets SIGTERM: stop like Ctrl-C (workers killed, reports written, marked incomplete) rather
    than die with no reports and workers left running. Covers the run and the report writing, in either mode."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python installs signal handlers on the main thread only (a test runner's worker thread)
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _unlisted_check_notes(specs: list[OpSpec], filters: Any) -> list[str]:
    from opforge.engine.plan import unasked_checks, unlisted_checks

    unasked = unasked_checks(filters)
    return [
        f"--check {name}: expected a check some selected spec runs, got one none of them lists in `checks:` "
        f"({', '.join(s.name for s in specs)}). Add it to the spec's checks, or pick one it lists."
        for name in unlisted_checks(specs, filters)
        if name not in {c.name for c in unasked}
    ] + [
        f"--check {c.name}: expected a check this run asked for, got one that runs only when asked: add "
        f"{' '.join(c.rerun_flags)}."
        for c in unasked
    ]


def _validate_run_options(timeout: float | None, jobs: int, no_isolation: bool) -> None:
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError("--timeout", "a number of seconds > 0", repr(timeout), "Write e.g. --timeout 600.")
    if jobs < 1:
        raise UsageError("--jobs", "a number of processes >= 1", repr(jobs), "Write e.g. -j 2.")
    if no_isolation and (jobs > 1 or timeout is not None):
        option = "--jobs" if jobs > 1 else "--timeout"
        raise UsageError(
            option,
            "worker processes",
            "--no-isolation",
            f"Drop {option} or --no-isolation: only worker processes can run in parallel or be killed.",
        )


def _file_reporters(reports: dict[ReportFormat, Path | None]) -> dict[tuple[ReportFormat, Path], Reporter]:
    """A reporter per report asked for. A path that cannot be written, or a format that cannot be written here, is
    refused before the run, not after it (and before the other reports)."""
    from opforge.files import check_writable

    asked = {fmt: path for fmt, path in reports.items() if path is not None}
    for fmt, path in asked.items():
        if fmt.preflight is not None:
            fmt.preflight()
        try:
            check_writable(path)
        except OSError as exc:
            raise UsageError(
                fmt.option,
                "a path a report can be written to",
                f"{path} ({exc.strerror or exc})",
                f"Point {fmt.option} at a file in a directory you can write to.",
            ) from None
    return {(fmt, path): fmt.make(path) for fmt, path in asked.items()}


def _finish_files(files: dict[tuple[ReportFormat, Path], Reporter], run: Any) -> bool:
    """Write every report asked for; False if one could not be written (the others still are)."""
    written = True
    for (fmt, path), reporter in files.items():
        try:
            reporter.finish(run)
        except NotWritten as why:
            out.warning(f"{fmt.option} {path}: not written, {why}")
            continue
        except OSError as exc:
            out.error(f"{fmt.option}: expected to write {path}, got {exc}. Point {fmt.option} at a writable path.")
            written = False
            continue
        out.info(f"{fmt.title}: {path}")
    return written


def _selection(last_failed: bool, targets: list[str], all_specs: bool) -> tuple[tuple[str, ...], list[Path]]:
    """(result ids to keep, spec paths to run)."""
    if not last_failed:
        return (), _specs(targets, all_specs)
    from opforge.reporters.lastfailed import select

    chosen = _specs(targets, all_specs) if targets or all_specs else None
    selection = select(Path.cwd(), chosen)
    for note in selection.notes:
        out.info(note)
    if selection.paths is not None:
        return selection.ids, selection.paths
    return selection.ids, chosen if chosen is not None else _specs([], False)


def _load_specs(paths: list[Path], run: Any) -> list[OpSpec]:
    """The specs that load. With one spec its error is the run's (exit 2); with several, a spec that does not load
    is its op's ERROR load row in `run` and the others still run."""
    from opforge.engine.plan import unloadable_spec_report

    if len(paths) == 1:
        return [load_spec(paths[0])]
    specs = []
    for path in paths:
        try:
            specs.append(load_spec(path))
        except OpforgeError as exc:
            run.ops.append(unloadable_spec_report(path, exc))
    return specs


def _run(
    specs: list[OpSpec],
    filters: Any,
    cuda_arch: str | None,
    timeout: float | None,
    jobs: int,
    no_isolation: bool,
    run: Any,
    reporters: list[Reporter],
) -> None:
    from opforge.reporters.base import fan_out

    events = fan_out(reporters)
    for reporter in reporters:
        reporter.start()
    if no_isolation:
        from opforge.engine.inprocess import run_in_process

        run_in_process(specs, filters, cuda_arch, run, events)
    else:
        from opforge.engine.isolated import Isolation, run_isolated

        run_isolated(specs, filters, Isolation(jobs=jobs, timeout=timeout, cuda_arch=cuda_arch), run, events)


def _exit_code(run: Any) -> int:
    """1 when a check failed; an op that could not load (a bad spec: 2, a failed build: 3) raises it; 5 when no
    check gave a verdict at all."""
    if run.nothing_ran:
        return EXIT_NOTHING_RAN
    return max(
        [EXIT_FAILED if run.failed else EXIT_OK]
        + [op.load_exit_code for op in run.ops if op.load_exit_code is not None]
    )


def _record_failures(reporter: Reporter, run: Any) -> None:
    try:
        reporter.finish(run)
    except OSError as exc:  # a read-only checkout must not fail the run; --last-failed then reruns everything
        out.info(f"could not record the failures for --last-failed: {exc}")


# ------------------------------------------------------------------------------------------------ list, build


@app.command("list")
def list_() -> None:
    """List the bundled op specs."""

    def body() -> int:
        from opforge.reporters.terminal import render_spec_list

        rows = []
        for path in list_specs():
            spec = load_spec(path)
            rows.append((spec.op, str(path.name), spec.description.strip().splitlines()[0] if spec.description else ""))
        render_spec_list(rows)
        return EXIT_OK

    _guarded(body)


@app.command()
def build(
    targets: Annotated[
        list[str] | None,
        typer.Argument(help="Op names or spec paths; all bundled specs when none."),
    ] = None,
    cuda_arch: CudaArch = None,
    require_cuda: Annotated[
        bool,
        typer.Option("--require-cuda", help="Fail (exit 3) if CUDA sources cannot be built here: a compile-only gate."),
    ] = False,
) -> None:
    """Compile (or find in the cache) the C++/CUDA sources of op specs."""

    def body() -> int:
        from opforge.build import build, detect_toolchain
        from opforge.loading import spec_build_plan
        from opforge.reporters.terminal import render_builds

        rows = []
        for path in _specs(targets or [], all_specs=not targets):
            spec = load_spec(path)
            if not spec.sources:
                rows.append((spec.op, "-", "no sources (pure Python)"))
                continue
            plan = spec_build_plan(spec, detect_toolchain(cuda_arch))
            if require_cuda and plan.skipped_sources:
                raise BuildError(spec.name, plan.log, [f"CUDA sources left out: {plan.toolchain.skip_reason}"])
            with out.spinner(f"building {spec.name}"):
                result = build(plan, on_step=out.info)
            status = f"cached ({result.seconds:.2f} s)" if result.cached else f"built in {result.seconds:.1f} s"
            if result.plan.skipped_sources:
                status += (
                    f"; left out {', '.join(s.name for s in result.plan.skipped_sources)}: "
                    f"{result.plan.toolchain.skip_reason}"
                )
            rows.append((spec.op, str(result.plan.library), status))
        render_builds(rows)
        return EXIT_OK

    _guarded(body)


# ------------------------------------------------------------------------------------------------------- bench


@app.command()
@with_report_options(BENCH_FORMATS)
def bench(
    targets: Targets = None,
    all_specs: Annotated[
        bool, typer.Option("--all", help="Benchmark every bundled spec that has a bench: section.")
    ] = False,
    device: Devices = [],  # noqa: B006 (typer copies it)
    dtype: Dtypes = [],  # noqa: B006
    mode: Modes = [],  # noqa: B006
    impl: Impls = [],  # noqa: B006
    sizes: Sizes = [],  # noqa: B006
    layout: Annotated[
        list[str],
        typer.Option(
            "--layout",
            help="Memory formats to time (repeatable): contiguous, channels_last (default: the spec's bench.layouts).",
            rich_help_panel=SELECTION,
        ),
    ] = [],  # noqa: B006
    shard: ShardOption = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="A --json of an earlier run to gate against."),
    ] = None,
    max_regression: Annotated[
        float, typer.Option("--max-regression", help="Percent slower (beyond noise) that fails.")
    ] = 5.0,
    markdown_path: Annotated[
        Path | None,
        typer.Option("--markdown", help="Also write the gate's Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."),
    ] = None,
    budget: Annotated[float, typer.Option("--budget", help="Seconds of timing per contender and case, at most.")] = 2.0,
    warmup: Annotated[float, typer.Option("--warmup", help="Seconds of warm-up per contender and case.")] = 0.2,
    noise: Annotated[float, typer.Option("--noise", help="Stop timing once IQR/median is below this.")] = 0.02,
    min_reps: Annotated[
        int, typer.Option("--min-reps", help="Samples taken before the noise target may stop timing.")
    ] = 25,
    contender_limit: Annotated[
        float,
        typer.Option(
            "--contender-limit",
            help="Seconds a baseline (eager, compile) may take on one case (compiling and warm-up included) before "
            "it is cut off with a note; 0: no limit.",
        ),
    ] = 60.0,
    cuda_graph: Annotated[
        bool,
        typer.Option(
            "--cuda-graph",
            help="Time CUDA-graph replays whose calls go round cold copies of the inputs: for microsecond ops.",
        ),
    ] = False,
    refresh_peak: Annotated[bool, typer.Option("--refresh-peak", help="Measure the peak bandwidth again.")] = False,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: torch's).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the benchmark inputs.")] = 0,
    cuda_arch: CudaArch = None,
    *,
    reports: dict[ReportFormat, Path | None],
) -> None:
    """Time an op's implementations against its eager reference and torch.compile of it; gate regressions.

    Examples:
      opforge bench leaky_swish
      opforge bench rms_norm --device cuda --dtype bfloat16 --mode bwd --impl native --impl compile
      opforge bench --all --baseline main.json --max-regression 5 --markdown summary.md
    """

    def body() -> int:
        from opforge.bench.runner import BenchHooks, run_bench
        from opforge.bench.timing import TimingOptions
        from opforge.reporters import bench_terminal

        _check_bench_options(budget, warmup, noise, min_reps, max_regression, threads, contender_limit)
        filters = _bench_filters(device, dtype, mode, impl, sizes, seed)
        filters = dataclasses.replace(
            filters,
            layouts=_validate(layout, BENCH_LAYOUTS, "--layout"),
            shard=parse_shard(shard) if shard else None,
        )
        files = _file_reporters(reports)
        timing = TimingOptions(
            budget_s=budget,
            warmup_s=warmup,
            noise_target=noise,
            min_reps=min_reps,
            cuda_graph=cuda_graph,
            contender_limit_s=contender_limit or None,
        )
        old = None
        if baseline is not None:
            from opforge.bench.baseline import load_baseline

            old = load_baseline(baseline)
        specs = [load_spec(p) for p in _specs(targets or [], all_specs)]
        if all_specs:
            specs = [s for s in specs if s.bench is not None]
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        hooks = BenchHooks(step=out.spinner, info=out.info, progress=bench_terminal.bench_progress)
        run = run_bench(specs, filters, timing, refresh_peak, cuda_arch, hooks)
        bench_terminal.render_bench(run)
        comparison = None
        if old is not None:
            from opforge.bench.baseline import compare, markdown

            comparison = compare(run, old, max_regression, str(baseline))
            summary = markdown(comparison)
            bench_terminal.render_comparison(comparison, summary)
            if markdown_path:
                from opforge.files import write_atomically

                write_atomically(markdown_path, summary)
        written = _finish_files(files, run)
        bench_terminal.render_bench_totals(run, comparison)
        failed = run.failed or (comparison is not None and comparison.failed)
        code = EXIT_FAILED if failed else EXIT_NOTHING_RAN if run.nothing_timed else EXIT_OK
        return code if written else max(code, EXIT_USAGE)

    _guarded(body)


def _bench_filters(
    device: list[str], dtype: list[str], mode: list[str], impl: list[str], sizes: list[str], seed: int
) -> Any:
    """The points and contenders `bench` and `profile` run, from their shared options."""
    from opforge.bench.runner import BenchFilters, parse_sizes

    return BenchFilters(
        devices=_validate(device, KNOWN_DEVICES, "--device"),
        dtypes=_validate(dtype, KNOWN_DTYPES, "--dtype"),
        modes=_validate(mode, BENCH_MODES, "--mode"),
        impls=tuple(impl),
        sizes=parse_sizes(sizes),
        seed=seed,
    )


def _check_bench_options(
    budget: float,
    warmup: float,
    noise: float,
    min_reps: int,
    max_regression: float,
    threads: int | None,
    contender_limit: float,
) -> None:
    rules = [
        ("--budget", budget > 0, "seconds > 0", budget, "Pass e.g. --budget 2."),
        ("--warmup", warmup >= 0, "seconds >= 0", warmup, "Pass e.g. --warmup 0.2, or 0 for none."),
        ("--noise", 0 < noise < 1, "a fraction 0 < F < 1", noise, "Pass e.g. --noise 0.02 (2% IQR/median)."),
        ("--min-reps", min_reps >= 1, "an integer >= 1", min_reps, "Pass e.g. --min-reps 25."),
        ("--max-regression", max_regression >= 0, "a percentage >= 0", max_regression, "Pass e.g. --max-regression 5."),
        (
            "--threads",
            threads is None or threads >= 1,
            "an integer >= 1",
            threads,
            "Pass e.g. --threads 2, or leave it out for torch's default.",
        ),
        (
            "--contender-limit",
            contender_limit >= 0 and contender_limit != float("inf"),
            "seconds >= 0",
            contender_limit,
            "Pass e.g. --contender-limit 120, or 0 for no limit.",
        ),
    ]
    for option, ok, expected, got, hint in rules:
        if not ok:
            raise UsageError(option, expected, repr(got), hint)


@app.command("merge-reports")
@with_report_options(CHECK_FORMATS)
def merge_reports(
    paths: Annotated[
        list[Path], typer.Argument(help="The --json reports of `check` (or of `bench`) runs: every shard of a split.")
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
        from opforge.files import write_atomically
        from opforge.merge import BENCH, check_kinds_and_shards, merge_bench_reports, merge_check_reports, read_report
        from opforge.reporters.terminal import TerminalReport
        from opforge.results import dumps_json

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
        files = _file_reporters(reports)
        run = merge_check_reports(read)
        TerminalReport(verbose).finish(run)
        code = _exit_code(run)
        if not _finish_files(files, run):
            code = max(code, EXIT_USAGE)
        return code

    _guarded(body)


@app.command()
def profile(
    target: Annotated[str, typer.Argument(help="An op name (see `opforge list`) or a spec file.")],
    device: Devices = [],  # noqa: B006
    dtype: Dtypes = [],  # noqa: B006
    mode: Modes = [],  # noqa: B006
    impl: Impls = [],  # noqa: B006
    sizes: Sizes = [],  # noqa: B006
    calls: Annotated[int, typer.Option("--calls", help="Calls profiled per implementation.")] = 10,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Write a Chrome/Perfetto trace per implementation: FILE-NN-impl-....json."),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs.")] = 0,
) -> None:
    """Profile each implementation of an op: kernels per call, each kernel's time and share, host time, GB/s.

    The points are `opforge bench`'s (the spec's first bench size unless --sizes is given).

    Examples:
      opforge profile leaky_swish --dtype float32 --mode fwd
      opforge profile rms_norm --device cuda --impl native --impl compile --trace rms.json
    """

    def body() -> int:
        import json

        from opforge.files import write_atomically
        from opforge.profile import profile_op
        from opforge.reporters.profile_terminal import render_profile

        filters = _bench_filters(device, dtype, mode, impl, sizes, seed)
        [spec_path] = _specs([target], False)
        run = profile_op(load_spec(spec_path), filters, trace, calls, on_step=out.info)
        render_profile(run)
        if json_path is not None:
            write_atomically(json_path, json.dumps(run.to_json(), indent=2))
            out.info(f"JSON: {json_path}")
        if not run.results:
            out.error(f"opforge profile: expected something to profile, got nothing ({run.skipped_devices}).")
            return EXIT_NOTHING_RAN
        return EXIT_FAILED if any(r.error for r in run.results) else EXIT_OK

    _guarded(body)


@app.command()
def new(
    name: Annotated[str, typer.Argument(help="The op's name: a lowercase identifier, e.g. my_swish.")],
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where to write it (default: ./NAME).", show_default=False)
    ] = None,
    stage: Annotated[
        str, typer.Option("--stage", help="python (a custom_op prototype), cpp (+ C++ kernels) or cuda (+ CUDA).")
    ] = "python",
    namespace: Annotated[str, typer.Option("--namespace", help="The op's namespace.")] = "myops",
) -> None:
    """Scaffold an op that passes `opforge check` as written: its spec, a Python prototype, and C++/CUDA kernels.

    Run it again with a later --stage to add the next implementation; the spec is updated if it is as written.

    Examples:
      opforge new my_swish && opforge check my_swish/my_swish.yaml
      opforge new my_swish --stage cpp
      opforge new my_swish --stage cuda --namespace mylib
    """

    def body() -> int:
        from opforge.scaffold import scaffold

        result = scaffold(name, directory or Path(name), stage, namespace)
        for path in result.written:
            out.info(f"wrote {path}")
        for path in result.kept:
            out.info(f"kept {path} (yours: not overwritten)")
        out.info(f"next: opforge check {result.spec}")
        return EXIT_OK

    _guarded(body)


@app.command()
def doctor(
    build_probes: Annotated[
        bool,
        typer.Option(
            "--build",
            help="Also compile: an OpenMP program, and a tiny extension whose error message formats a number "
            "(about 20 s the first time, then cached).",
        ),
    ] = False,
) -> None:
    """Check this machine for what building, checking and benchmarking custom ops needs; each finding with its fix.

    Exits 1 when something needed to build or run the bundled ops is missing.

    Examples:
      opforge doctor
      opforge doctor --build
    """

    def body() -> int:
        from opforge.doctor import diagnose
        from opforge.reporters.doctor_terminal import render_diagnosis

        diagnosis = diagnose(build_probes)
        render_diagnosis(diagnosis)
        return EXIT_FAILED if diagnosis.failed else EXIT_OK

    _guarded(body)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
