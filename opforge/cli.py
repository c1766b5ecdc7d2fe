"""The command line. Commands are thin: parse, call the library, render, map errors to exit codes.

Exit codes (defined in opforge.errors): 0 all passed (skip and xfail allowed), 1 a check failed, 2 bad usage or a bad
spec, 3 a build failed, 4 an internal error (a bug in opforge: rerun with --debug and report it), 130 interrupted
(Ctrl-C or SIGTERM; the reports written are marked incomplete). When several ops run, the highest code that applies.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from opforge import report
from opforge.errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    BuildError,
    OpforgeError,
    UsageError,
)
from opforge.spec import (
    BENCH_MODES,
    KNOWN_CHECKS,
    KNOWN_DEVICES,
    KNOWN_DTYPES,
    OPCHECK_SUBTESTS,
    OpSpec,
    find_spec,
    list_specs,
    load_spec,
)

app = typer.Typer(
    name="opforge",
    help="Prove a PyTorch custom operator right before you ship it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks.")) -> None:
    _state["debug"] = debug


def _guarded(command: Callable[[], int]) -> None:
    """Run a command body, turning opforge's errors into a one-line message and an exit code."""
    try:
        code = command()
    except OpforgeError as exc:
        if _state["debug"]:
            raise
        report.error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        report.error("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug in opforge: say so briefly, keep the traceback for --debug
        if _state["debug"]:
            worker_traceback = getattr(exc, "worker_traceback", "")
            if worker_traceback:
                report.error(f"the worker's traceback:\n{worker_traceback.rstrip()}")
            raise
        report.error(f"internal error: {type(exc).__name__}: {exc}. Rerun with --debug and report the traceback.")
        code = EXIT_INTERNAL
    raise typer.Exit(code)


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


@app.command()
def check(
    targets: list[str] = typer.Argument(None, help="Op names (see `opforge list`) or paths to spec files."),
    all_specs: bool = typer.Option(False, "--all", help="Check every bundled spec."),
    dtype: list[str] = typer.Option([], "--dtype", help="Only these dtypes (repeatable)."),
    device: list[str] = typer.Option([], "--device", help="Only these devices (repeatable)."),
    check_: list[str] = typer.Option([], "--check", help="Only these checks (repeatable)."),
    keyword: str | None = typer.Option(None, "-k", help="Only results whose id contains this substring."),
    last_failed: bool = typer.Option(
        False, "--last-failed", "--lf", help="Only what failed last time (all of it when nothing is recorded)."
    ),
    seed: int = typer.Option(0, "--seed", help="Base seed; each case derives its own from it and its id."),
    fail_fast: bool = typer.Option(False, "--fail-fast", "-x", help="Stop at the first failure."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every result."),
    json_path: Path | None = typer.Option(None, "--json", help="Write a JSON report here."),
    junit_path: Path | None = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    markdown_path: Path | None = typer.Option(
        None, "--markdown", help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."
    ),
    timeout: float | None = typer.Option(
        None,
        "--timeout",
        help="Seconds one check on one case may take before "
        "it is killed (TIMEOUT); overrides the specs' `timeout:`. Default 300.",
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        "-j",
        help="Check this many ops at once, each in its own process (each "
        "with its own share of the GPUs where there are several).",
    ),
    no_isolation: bool = typer.Option(
        False,
        "--no-isolation",
        help="Run the checks in this process (for a debugger); a crash then ends the run and --timeout does not apply.",
    ),
    cuda_arch: str | None = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
    large: bool = typer.Option(
        False, "--large", help="Also run large_index (tensors past 2^31 elements: GBs of GPU memory)."
    ),
) -> None:
    """Build an op's kernels and run every check its spec declares."""

    def body() -> int:
        from opforge.results import RunReport
        from opforge.runner import Filters

        _validate_run_options(timeout, jobs, no_isolation)
        dtypes = _validate(dtype, KNOWN_DTYPES, "--dtype")
        devices = _validate(device, KNOWN_DEVICES, "--device")
        checks = _validate(check_, KNOWN_CHECKS + tuple(f"opcheck:{t}" for t in OPCHECK_SUBTESTS), "--check")
        outputs = {"--json": json_path, "--junit": junit_path, "--markdown": markdown_path}
        _check_outputs(outputs)
        only_ids, paths = _selection(last_failed, targets or [], all_specs)
        filters = Filters(
            dtypes=dtypes,
            devices=devices,
            checks=checks,
            keyword=keyword,
            seed=seed,
            fail_fast=fail_fast,
            ids=only_ids,
            large=large,
        )
        specs = [load_spec(p) for p in paths]
        run = RunReport(environment={}, seed=seed)
        with _sigterm_interrupts():
            start = time.perf_counter()
            try:
                _run(specs, filters, cuda_arch, timeout, jobs, no_isolation, run)
            except KeyboardInterrupt:
                run.incomplete = True
            run.seconds = time.perf_counter() - start
            if not run.environment:
                from opforge.runner import environment

                run.environment = environment()
            report.render_run(run, verbose)
            _report_load_errors(run)
            code = _exit_code(run)
            if not _write_reports(run, outputs):
                code = max(code, EXIT_USAGE)
            _record_failures(run, filters)
        if run.incomplete:
            report.error("interrupted: the results above and the reports written are incomplete")
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


def _check_outputs(outputs: dict[str, Path | None]) -> None:
    """Refuse a report path that cannot be written before the run, not after it (and before the other reports)."""
    from opforge.results import check_writable

    for option, path in outputs.items():
        if path is None:
            continue
        try:
            check_writable(path)
        except OSError as exc:
            raise UsageError(
                option,
                "a path a report can be written to",
                f"{path} ({exc.strerror or exc})",
                f"Point {option} at a file in a directory you can write to.",
            ) from None


def _selection(last_failed: bool, targets: list[str], all_specs: bool) -> tuple[tuple[str, ...], list[Path]]:
    """(result ids to keep, spec paths to run)."""
    if not last_failed:
        return (), _specs(targets, all_specs)
    from opforge.lastfailed import select

    chosen = _specs(targets, all_specs) if targets or all_specs else None
    selection = select(Path.cwd(), chosen)
    for note in selection.notes:
        report.info(note)
    if selection.paths is not None:
        return selection.ids, selection.paths
    return selection.ids, chosen if chosen is not None else _specs([], False)


def _run(
    specs: list[OpSpec], filters, cuda_arch: str | None, timeout: float | None, jobs: int, no_isolation: bool, run
) -> None:
    from opforge.runner import Events

    with report.run_progress() as bar:
        events = Events(step=report.info, planned=bar.planned, result=bar.result)
        if no_isolation:
            from opforge.runner import run_in_process

            run_in_process(specs, filters, cuda_arch, run, events)
        else:
            from opforge.isolation import Isolation, run_isolated

            run_isolated(specs, filters, Isolation(jobs=jobs, timeout=timeout, cuda_arch=cuda_arch), run, events)


def _exit_code(run) -> int:
    """1 when a check failed; an op that could not load (a bad spec: 2, a failed build: 3) raises it."""
    return max(
        [EXIT_FAILED if run.failed else EXIT_OK]
        + [op.load_exit_code for op in run.ops if op.load_exit_code is not None]
    )


def _report_load_errors(run) -> None:
    """Each op that could not load gets its error as a line of its own, as a single op's error would be shown."""
    for op in run.ops:
        if op.load_exit_code is not None:
            report.error(op.results[-1].message)


def _write_reports(run, outputs: dict[str, Path | None]) -> bool:
    """Write every report asked for; False if one could not be written (the others still are)."""
    from opforge.results import write_atomically, write_json, write_junit
    from opforge.summary import render_markdown

    writers = {
        "--json": lambda path: write_json(run, path),
        "--junit": lambda path: write_junit(run, path),
        "--markdown": lambda path: write_atomically(path, render_markdown(run)),
    }
    written = True
    for option, path in outputs.items():
        if path is None:
            continue
        try:
            writers[option](path)
        except OSError as exc:
            report.error(f"{option}: expected to write {path}, got {exc}. Point {option} at a writable path.")
            written = False
            continue
        report.info(f"{_REPORT_NAMES[option]}: {path}")
    return written


_REPORT_NAMES = {"--json": "JSON report", "--junit": "JUnit report", "--markdown": "Markdown summary"}


def _record_failures(run, filters) -> None:
    from opforge.lastfailed import record

    try:
        record(Path.cwd(), run, filters)
    except OSError as exc:  # a read-only checkout must not fail the run; --last-failed then reruns everything
        report.info(f"could not record the failures for --last-failed: {exc}")


@app.command("list")
def list_() -> None:
    """List the bundled op specs."""

    def body() -> int:
        rows = []
        for path in list_specs():
            spec = load_spec(path)
            rows.append((spec.op, str(path.name), spec.description.strip().splitlines()[0] if spec.description else ""))
        report.render_spec_list(rows)
        return EXIT_OK

    _guarded(body)


@app.command()
def build(
    targets: list[str] = typer.Argument(None, help="Op names or spec paths; all bundled specs when none."),
    cuda_arch: str | None = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
    require_cuda: bool = typer.Option(
        False, "--require-cuda", help="Fail (exit 3) if CUDA sources cannot be built here: a compile-only gate."
    ),
) -> None:
    """Compile (or find in the cache) the C++/CUDA sources of op specs."""

    def body() -> int:
        from opforge.build import build, detect_toolchain, plan_build

        rows = []
        for path in _specs(targets or [], all_specs=not targets):
            spec = load_spec(path)
            if not spec.sources:
                rows.append((spec.op, "-", "no sources (pure Python)"))
                continue
            plan = plan_build(spec.sources, detect_toolchain(cuda_arch))
            if require_cuda and plan.skipped_sources:
                raise BuildError(spec.name, plan.log, [f"CUDA sources left out: {plan.toolchain.skip_reason}"])
            with report.spinner(f"building {spec.name}"):
                result = build(plan, on_step=report.info)
            status = f"cached ({result.seconds:.2f} s)" if result.cached else f"built in {result.seconds:.1f} s"
            if result.plan.skipped_sources:
                status += (
                    f"; left out {', '.join(s.name for s in result.plan.skipped_sources)}: "
                    f"{result.plan.toolchain.skip_reason}"
                )
            rows.append((spec.op, str(result.plan.library), status))
        report.render_builds(rows)
        return EXIT_OK

    _guarded(body)


@app.command()
def bench(
    targets: list[str] = typer.Argument(None, help="Op names (see `opforge list`) or paths to spec files."),
    all_specs: bool = typer.Option(False, "--all", help="Benchmark every bundled spec that has a bench: section."),
    device: list[str] = typer.Option([], "--device", help="Only these devices (repeatable)."),
    dtype: list[str] = typer.Option([], "--dtype", help="Only these dtypes (repeatable)."),
    mode: list[str] = typer.Option([], "--mode", help="fwd, bwd or fwd+bwd (repeatable)."),
    impl: list[str] = typer.Option(
        [], "--impl", help="Only these contenders: native, a spec implementation, eager, compile (repeatable)."
    ),
    sizes: list[str] = typer.Option(
        [], "--sizes", help="Elements per tensor input, e.g. 2**20,2**24 (replaces the spec's sizes and shapes)."
    ),
    json_path: Path | None = typer.Option(
        None, "--json", help="Write every result with its raw samples and the environment here."
    ),
    csv_path: Path | None = typer.Option(None, "--csv", help="Write one CSV row per result here."),
    plot_path: Path | None = typer.Option(None, "--plot", help="Plot GB/s against size into this PNG."),
    baseline: Path | None = typer.Option(None, "--baseline", help="A --json of an earlier run to gate against."),
    max_regression: float = typer.Option(5.0, "--max-regression", help="Percent slower (beyond noise) that fails."),
    markdown_path: Path | None = typer.Option(
        None, "--markdown", help="Also write the gate's Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."
    ),
    budget: float = typer.Option(2.0, "--budget", help="Seconds of timing per contender and case, at most."),
    warmup: float = typer.Option(0.2, "--warmup", help="Seconds of warm-up per contender and case."),
    noise: float = typer.Option(0.02, "--noise", help="Stop timing once IQR/median is below this."),
    min_reps: int = typer.Option(25, "--min-reps", help="Samples taken before the noise target may stop timing."),
    cuda_graph: bool = typer.Option(
        False,
        "--cuda-graph",
        help="Time CUDA-graph replays whose calls go round cold copies of the inputs: for microsecond ops.",
    ),
    refresh_peak: bool = typer.Option(False, "--refresh-peak", help="Measure the peak bandwidth again."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the benchmark inputs."),
    cuda_arch: str | None = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
) -> None:
    """Time an op's implementations against its eager reference and torch.compile of it; gate regressions."""

    def body() -> int:
        from opforge.bench.runner import BenchFilters, BenchHooks, parse_sizes, run_bench
        from opforge.bench.timing import TimingOptions

        _check_bench_options(budget, warmup, noise, min_reps, max_regression, threads)
        filters = BenchFilters(
            devices=_validate(device, KNOWN_DEVICES, "--device"),
            dtypes=_validate(dtype, KNOWN_DTYPES, "--dtype"),
            modes=_validate(mode, BENCH_MODES, "--mode"),
            impls=tuple(impl),
            sizes=parse_sizes(sizes),
            seed=seed,
        )
        if plot_path:
            from opforge.bench.export import require_plotting

            require_plotting()
        timing = TimingOptions(
            budget_s=budget, warmup_s=warmup, noise_target=noise, min_reps=min_reps, cuda_graph=cuda_graph
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
        hooks = BenchHooks(step=report.spinner, info=report.info, progress=report.bench_progress)
        run = run_bench(specs, filters, timing, refresh_peak, cuda_arch, hooks)
        report.render_bench(run)
        comparison = None
        if old is not None:
            from opforge.bench.baseline import compare, markdown

            comparison = compare(run, old, max_regression, str(baseline))
            summary = markdown(comparison)
            report.render_comparison(comparison, summary)
            if markdown_path:
                from opforge.results import write_atomically

                write_atomically(markdown_path, summary)
        _write_bench_outputs(run, json_path, csv_path, plot_path)
        report.render_bench_totals(run, comparison)
        return EXIT_FAILED if run.failed or (comparison is not None and comparison.failed) else EXIT_OK

    _guarded(body)


def _check_bench_options(
    budget: float, warmup: float, noise: float, min_reps: int, max_regression: float, threads: int | None
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
    ]
    for option, ok, expected, got, hint in rules:
        if not ok:
            raise UsageError(option, expected, repr(got), hint)


def _write_bench_outputs(run, json_path: Path | None, csv_path: Path | None, plot_path: Path | None) -> None:
    from opforge.bench import export

    if json_path:
        export.write_json(run, json_path)
        report.info(f"JSON: {json_path}")
    if csv_path:
        export.write_csv(run, csv_path)
        report.info(f"CSV: {csv_path}")
    if plot_path:
        if export.write_plot(run, plot_path):
            report.info(f"plot: {plot_path}")
        else:
            report.warning(f"--plot {plot_path}: not written, no case has a GB/s figure to plot")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
