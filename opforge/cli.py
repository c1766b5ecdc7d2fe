"""The command line. Commands are thin: parse, call the library, render, map errors to exit codes.

Exit codes: 0 all passed (skip and xfail allowed), 1 a check failed, 2 bad usage or a bad spec, 3 a build failed,
4 an internal error (a bug in opforge: rerun with --debug and report it), 130 interrupted (Ctrl-C; the reports
written are marked incomplete).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, List, Optional

import typer

from opforge import report
from opforge.errors import BuildError, OpforgeError, UsageError
from opforge.spec import (KNOWN_CHECKS, KNOWN_DEVICES, KNOWN_DTYPES, OPCHECK_SUBTESTS, OpSpec, find_spec, list_specs,
                          load_spec)
from opforge.spec import BENCH_MODES

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUILD, EXIT_INTERNAL = 0, 1, 2, 3, 4
# 128 + SIGINT, as a shell reports a process stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

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
            raise
        report.error(f"internal error: {type(exc).__name__}: {exc}. Rerun with --debug and report the traceback.")
        code = EXIT_INTERNAL
    raise typer.Exit(code)


def _specs(targets: list[str], all_specs: bool) -> list[Path]:
    if all_specs:
        return list_specs()
    if not targets:
        raise UsageError("opforge check", "an op name, a spec path or --all", "nothing",
                         "Run `opforge list` to see the bundled ops.")
    return [find_spec(t) for t in targets]


def _validate(values: list[str], known: tuple[str, ...], option: str) -> tuple[str, ...]:
    for value in values:
        if value not in known:
            raise UsageError(option, f"one of {', '.join(known)}", repr(value), f"Fix the {option} value.")
    return tuple(values)


@app.command()
def check(
    targets: List[str] = typer.Argument(None, help="Op names (see `opforge list`) or paths to spec files."),
    all_specs: bool = typer.Option(False, "--all", help="Check every bundled spec."),
    dtype: List[str] = typer.Option([], "--dtype", help="Only these dtypes (repeatable)."),
    device: List[str] = typer.Option([], "--device", help="Only these devices (repeatable)."),
    check_: List[str] = typer.Option([], "--check", help="Only these checks (repeatable)."),
    keyword: Optional[str] = typer.Option(None, "-k", help="Only results whose id contains this substring."),
    last_failed: bool = typer.Option(False, "--last-failed", "--lf",
                                     help="Only what failed last time (all of it when nothing is recorded)."),
    seed: int = typer.Option(0, "--seed", help="Base seed; each case derives its own from it and its id."),
    fail_fast: bool = typer.Option(False, "--fail-fast", "-x", help="Stop at the first failure."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every result."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write a JSON report here."),
    junit_path: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown",
                                                 help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds one check on one case may take before "
                                            "it is killed (TIMEOUT); overrides the specs' `timeout:`. Default 300."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Check this many ops at once, each in its own process (one "
                             "GPU per process where there are several)."),
    no_isolation: bool = typer.Option(False, "--no-isolation", help="Run the checks in this process (for a "
                                      "debugger); a crash then ends the run and --timeout does not apply."),
    cuda_arch: Optional[str] = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
    large: bool = typer.Option(False, "--large",
                               help="Also run large_index (tensors past 2^31 elements: GBs of GPU memory)."),
) -> None:
    """Build an op's kernels and run every check its spec declares."""

    def body() -> int:
        from opforge.results import RunReport
        from opforge.runner import Filters

        _validate_run_options(timeout, jobs, no_isolation)
        dtypes = _validate(dtype, KNOWN_DTYPES, "--dtype")
        devices = _validate(device, KNOWN_DEVICES, "--device")
        checks = _validate(check_, KNOWN_CHECKS + tuple(f"opcheck:{t}" for t in OPCHECK_SUBTESTS), "--check")
        only_ids, paths = _last_failed_selection(last_failed, targets or [], all_specs)
        filters = Filters(dtypes=dtypes, devices=devices, checks=checks, keyword=keyword, seed=seed,
                          fail_fast=fail_fast, ids=only_ids, large=large)
        specs = [load_spec(p) for p in paths]
        run = RunReport(environment={}, seed=seed)
        code = EXIT_OK
        start = time.perf_counter()
        try:
            if no_isolation:
                _run_in_process(specs, filters, cuda_arch, run)
            else:
                _run_isolated(specs, filters, cuda_arch, timeout, jobs, run)
        except KeyboardInterrupt:
            run.incomplete = True
            code = EXIT_INTERRUPTED
        run.seconds = time.perf_counter() - start
        if not run.environment:
            from opforge.runner import environment

            run.environment = environment()
        report.render_run(run, verbose)
        _write_reports(run, json_path, junit_path, markdown_path)
        _record_failures(run)
        if code == EXIT_INTERRUPTED:
            report.error("interrupted: the results above and the reports written are incomplete")
            return code
        return EXIT_FAILED if run.failed else EXIT_OK

    _guarded(body)


def _validate_run_options(timeout: float | None, jobs: int, no_isolation: bool) -> None:
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError("--timeout", "a number of seconds > 0", repr(timeout), "Write e.g. --timeout 600.")
    if jobs < 1:
        raise UsageError("--jobs", "a number of processes >= 1", repr(jobs), "Write e.g. -j 2.")
    if no_isolation and (jobs > 1 or timeout is not None):
        option = "--jobs" if jobs > 1 else "--timeout"
        raise UsageError(option, "worker processes", "--no-isolation",
                         f"Drop {option} or --no-isolation: only worker processes can run in parallel or be killed.")


def _last_failed_selection(last_failed: bool, targets: list[str], all_specs: bool) -> tuple[tuple[str, ...], list]:
    """(result ids to keep, spec paths to run). Without targets, --last-failed runs the specs that failed."""
    if not last_failed:
        return (), _specs(targets, all_specs)
    from opforge.lastfailed import recorded

    failed = recorded(Path.cwd())
    if not failed:
        report.info("--last-failed: no failures recorded, running everything selected")
        return (), _specs(targets, all_specs)
    if targets or all_specs:
        return tuple(failed), _specs(targets, all_specs)
    report.info(f"--last-failed: rerunning {len(failed)} failed results")
    return tuple(failed), [Path(p) for p in dict.fromkeys(failed.values())]


def _run_isolated(specs: list[OpSpec], filters, cuda_arch: str | None, timeout: float | None, jobs: int,
                  run) -> None:
    from opforge.isolation import Events, Isolation, run_isolated

    with report.run_progress() as bar:
        events = Events(step=report.info, planned=bar.planned, result=bar.result)
        run_isolated(specs, filters, Isolation(jobs=jobs, timeout=timeout, cuda_arch=cuda_arch), run, events)


def _run_in_process(specs: list[OpSpec], filters, cuda_arch: str | None, run) -> None:
    from opforge.loading import load_op
    from opforge.results import OpReport
    from opforge.runner import environment, plan_op, run_op

    run.environment = environment()
    for spec in specs:
        with report.spinner(f"loading {spec.name}"):
            loaded = load_op(spec, cuda_arch, on_step=report.info)
        plan = plan_op(loaded, filters)
        # Results land here as they come, so that an interrupted run keeps the op's finished rows.
        partial = OpReport(op=spec.name, spec_path=str(spec.path))
        run.ops.append(partial)
        with report.progress(spec.name, len(plan.rows) + len(plan.skipped)) as advance:
            def on_result(result):
                partial.results.append(result)
                advance(result)

            run.ops[-1] = run_op(loaded, filters, plan, on_result=on_result)
        if filters.fail_fast and run.ops[-1].failed:
            break


def _write_reports(run, json_path: Path | None, junit_path: Path | None, markdown_path: Path | None) -> None:
    from opforge.results import write_atomically, write_json, write_junit
    from opforge.summary import render_markdown

    if json_path:
        write_json(run, json_path)
        report.info(f"JSON report: {json_path}")
    if junit_path:
        write_junit(run, junit_path)
        report.info(f"JUnit report: {junit_path}")
    if markdown_path:
        write_atomically(markdown_path, render_markdown(run))
        report.info(f"Markdown summary: {markdown_path}")


def _record_failures(run) -> None:
    from opforge.lastfailed import record

    try:
        record(Path.cwd(), run)
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
    targets: List[str] = typer.Argument(None, help="Op names or spec paths; all bundled specs when none."),
    cuda_arch: Optional[str] = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
    require_cuda: bool = typer.Option(False, "--require-cuda",
                                      help="Fail (exit 3) if CUDA sources cannot be built here: a compile-only gate."),
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
                status += f"; left out {', '.join(s.name for s in result.plan.skipped_sources)}: " \
                          f"{result.plan.toolchain.skip_reason}"
            rows.append((spec.op, str(result.plan.library), status))
        report.render_builds(rows)
        return EXIT_OK

    _guarded(body)


@app.command()
def bench(
    targets: List[str] = typer.Argument(None, help="Op names (see `opforge list`) or paths to spec files."),
    all_specs: bool = typer.Option(False, "--all", help="Benchmark every bundled spec that has a bench: section."),
    device: List[str] = typer.Option([], "--device", help="Only these devices (repeatable)."),
    dtype: List[str] = typer.Option([], "--dtype", help="Only these dtypes (repeatable)."),
    mode: List[str] = typer.Option([], "--mode", help="fwd, bwd or fwd+bwd (repeatable)."),
    impl: List[str] = typer.Option([], "--impl", help="Only these contenders: native, a spec implementation, eager, "
                                                      "compile (repeatable)."),
    sizes: List[str] = typer.Option([], "--sizes", help="Elements per tensor input, e.g. 2**20,2**24 (replaces the "
                                                        "spec's sizes and shapes)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every result with its raw samples and the "
                                                                  "environment here."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV row per result here."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Plot GB/s against size into this PNG."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A --json of an earlier run to gate against."),
    max_regression: float = typer.Option(5.0, "--max-regression", help="Percent slower (beyond noise) that fails."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Also write the gate's Markdown summary "
                                                                          "here (e.g. $GITHUB_STEP_SUMMARY)."),
    budget: float = typer.Option(2.0, "--budget", help="Seconds of timing per contender and case, at most."),
    warmup: float = typer.Option(0.2, "--warmup", help="Seconds of warm-up per contender and case."),
    noise: float = typer.Option(0.02, "--noise", help="Stop timing once IQR/median is below this."),
    min_reps: int = typer.Option(25, "--min-reps", help="Samples taken before the noise target may stop timing."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Time CUDA-graph replays (no L2 flush): for "
                                                                "microsecond ops."),
    refresh_peak: bool = typer.Option(False, "--refresh-peak", help="Measure the peak bandwidth again."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the benchmark inputs."),
    cuda_arch: Optional[str] = typer.Option(None, "--cuda-arch", help="CUDA archs to build for, e.g. 9.0."),
) -> None:
    """Time an op's implementations against its eager reference and torch.compile of it; gate regressions."""

    def body() -> int:
        from opforge.bench.runner import BenchFilters, BenchHooks, parse_sizes, run_bench
        from opforge.bench.timing import TimingOptions

        _check_bench_options(budget, warmup, noise, min_reps, max_regression, threads)
        filters = BenchFilters(
            devices=_validate(device, KNOWN_DEVICES, "--device"), dtypes=_validate(dtype, KNOWN_DTYPES, "--dtype"),
            modes=_validate(mode, BENCH_MODES, "--mode"), impls=tuple(impl), sizes=parse_sizes(sizes), seed=seed,
        )
        if plot_path:
            from opforge.bench.export import require_plotting

            require_plotting()
        timing = TimingOptions(budget_s=budget, warmup_s=warmup, noise_target=noise, min_reps=min_reps,
                               cuda_graph=cuda_graph)
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


def _check_bench_options(budget: float, warmup: float, noise: float, min_reps: int, max_regression: float,
                         threads: int | None) -> None:
    rules = [
        ("--budget", budget > 0, "seconds > 0", budget, "Pass e.g. --budget 2."),
        ("--warmup", warmup >= 0, "seconds >= 0", warmup, "Pass e.g. --warmup 0.2, or 0 for none."),
        ("--noise", 0 < noise < 1, "a fraction 0 < F < 1", noise, "Pass e.g. --noise 0.02 (2% IQR/median)."),
        ("--min-reps", min_reps >= 1, "an integer >= 1", min_reps, "Pass e.g. --min-reps 25."),
        ("--max-regression", max_regression >= 0, "a percentage >= 0", max_regression,
         "Pass e.g. --max-regression 5."),
        ("--threads", threads is None or threads >= 1, "an integer >= 1", threads, "Pass e.g. --threads 2, or leave "
                                                                                   "it out for torch's default."),
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
