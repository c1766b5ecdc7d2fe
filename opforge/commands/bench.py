"""`opforge bench`: timing an op's implementations against its baselines."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from opforge.commands.app import (
    SELECTION,
    Contenders,
    CudaArch,
    Devices,
    Dtypes,
    Modes,
    OpsOrSpecs,
    ShardOption,
    Sizes,
    app,
    file_reporters,
    finish_files,
    guarded,
    spec_paths,
    validated,
    with_report_options,
)
from opforge.core.errors import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, UsageError
from opforge.core.shard import parse_shard
from opforge.loading.spec import load_spec
from opforge.reporters import BENCH_FORMATS
from opforge.reporters.base import ReportFormat
from opforge.spec.model import BENCH_LAYOUTS, BENCH_MODES, KNOWN_DEVICES, KNOWN_DTYPES


@app.command()
@with_report_options(BENCH_FORMATS)
def bench(
    ops: OpsOrSpecs = None,
    all_specs: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Benchmark every bundled spec that has a bench: section; --device, --dtype, --mode and --layout then "
            "narrow each to what it claims, and leave out (with the reason) one that claims none of them.",
        ),
    ] = False,
    device: Devices = [],  # noqa: B006 (typer copies it)
    dtype: Dtypes = [],  # noqa: B006
    mode: Modes = [],  # noqa: B006
    contender: Contenders = [],  # noqa: B006
    sizes: Sizes = [],  # noqa: B006
    layout: Annotated[
        list[str],
        typer.Option(
            "--layout",
            help="Memory formats to time (repeatable): contiguous, channels_last (default: the spec's bench.layouts).",
            rich_help_panel=SELECTION,
            metavar="TEXT",
        ),
    ] = [],  # noqa: B006
    shard: ShardOption = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="A --json of an earlier run to gate against.", metavar="PATH"),
    ] = None,
    max_regression: Annotated[
        float, typer.Option("--max-regression", help="Percent slower (beyond noise) that fails.", metavar="FLOAT")
    ] = 5.0,
    fail_slower_than: Annotated[
        list[str],
        typer.Option(
            "--fail-slower-than",
            help="Fail each point where an implementation is slower than this baseline (eager, compile) beyond the "
            "noise and --max-slower (repeatable).",
            metavar="NAME",
        ),
    ] = [],  # noqa: B006
    max_slower: Annotated[
        float,
        typer.Option(
            "--max-slower",
            help="Percent slower than a baseline, beyond the noise, that is not yet listed as slower or failed "
            "(the spread between runs, which one run's noise does not show).",
            metavar="FLOAT",
        ),
    ] = 2.0,  # opforge.bench.trailing.DEFAULT_MAX_SLOWER_PCT, written out: importing it would import torch
    markdown_path: Annotated[
        Path | None,
        typer.Option(
            "--markdown",
            help="Also write the gate's Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).",
            metavar="PATH",
        ),
    ] = None,
    budget: Annotated[
        float, typer.Option("--budget", help="Seconds of timing per contender and case, at most.", metavar="FLOAT")
    ] = 2.0,
    warmup: Annotated[
        float, typer.Option("--warmup", help="Seconds of warm-up per contender and case.", metavar="FLOAT")
    ] = 0.2,
    noise: Annotated[
        float, typer.Option("--noise", help="Stop timing once IQR/median is below this.", metavar="FLOAT")
    ] = 0.02,
    min_reps: Annotated[
        int,
        typer.Option("--min-reps", help="Samples taken before the noise target may stop timing.", metavar="INTEGER"),
    ] = 25,
    contender_limit: Annotated[
        float,
        typer.Option(
            "--contender-limit",
            help="Seconds a baseline (eager, compile) may take on one case (compiling and warm-up included) before "
            "it is cut off with a note; 0: no limit.",
            metavar="FLOAT",
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
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads for torch (default: torch's).", metavar="INTEGER")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the benchmark inputs.", metavar="INTEGER")] = 0,
    cuda_arch: CudaArch = None,
    *,
    reports: dict[ReportFormat, Path | None],
) -> None:
    """Time an op's implementations against its eager reference and torch.compile of it; gate regressions and
    points slower than a baseline.

    Examples:
      opforge bench leaky_swish
      opforge bench rms_norm --device cuda --dtype bfloat16 --mode bwd --contender native --contender compile
      opforge bench --all --baseline main.json --max-regression 5 --markdown summary.md
      opforge bench leaky_swish --device cuda --fail-slower-than compile
    """

    def body() -> int:
        from opforge.bench.plan import COMPILE, EAGER
        from opforge.bench.runner import run_bench
        from opforge.bench.timing import TimingOptions
        from opforge.bench.trailing import fail_slower
        from opforge.reporters import bench_terminal

        _check_bench_options(budget, warmup, noise, min_reps, max_regression, max_slower, threads, contender_limit)
        gated_baselines = validated(fail_slower_than, (EAGER, COMPILE), "--fail-slower-than")
        filters = bench_filters(device, dtype, mode, contender, sizes, seed)
        filters = dataclasses.replace(
            filters,
            layouts=validated(layout, BENCH_LAYOUTS, "--layout"),
            shard=parse_shard(shard) if shard else None,
            every_spec=all_specs,
        )
        files = file_reporters(reports)
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
        specs = [load_spec(p) for p in spec_paths(ops or [], all_specs)]
        if all_specs:
            specs = [s for s in specs if s.bench is not None]
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        run = run_bench(specs, filters, timing, refresh_peak, cuda_arch, bench_terminal.BenchProgress())
        bench_terminal.render_bench(run)
        comparison = None
        if old is not None:
            from opforge.bench.baseline import compare, gate, markdown

            comparison = compare(run, old, max_regression, str(baseline))
            run = gate(run, comparison)
            summary = markdown(comparison)
            bench_terminal.render_comparison(comparison, summary)
            if markdown_path:
                from opforge.core.files import write_atomically

                write_atomically(markdown_path, summary)
        declared = {spec.name: spec.bench.slower for spec in specs if spec.bench is not None}
        run = fail_slower(run, gated_baselines, max_slower, declared)
        bench_terminal.render_trailing(run, gated_baselines)
        written = finish_files(files, run)
        bench_terminal.render_bench_totals(run, comparison)
        code = EXIT_FAILED if run.failed else EXIT_NOTHING_RAN if run.nothing_timed else EXIT_OK
        return code if written else max(code, EXIT_USAGE)

    guarded(body)


def bench_filters(
    device: list[str], dtype: list[str], mode: list[str], contender: list[str], sizes: list[str], seed: int
) -> Any:
    """The points and contenders `bench` and `profile` run, from their shared options."""
    from opforge.bench.plan import BenchFilters, parse_sizes

    return BenchFilters(
        devices=validated(device, KNOWN_DEVICES, "--device"),
        dtypes=validated(dtype, KNOWN_DTYPES, "--dtype"),
        modes=validated(mode, BENCH_MODES, "--mode"),
        contenders=tuple(contender),
        sizes=parse_sizes(sizes),
        seed=seed,
    )


def _check_bench_options(
    budget: float,
    warmup: float,
    noise: float,
    min_reps: int,
    max_regression: float,
    max_slower: float,
    threads: int | None,
    contender_limit: float,
) -> None:
    rules = [
        ("--budget", budget > 0, "seconds > 0", budget, "Pass e.g. --budget 2."),
        ("--warmup", warmup >= 0, "seconds >= 0", warmup, "Pass e.g. --warmup 0.2, or 0 for none."),
        ("--noise", 0 < noise < 1, "a fraction 0 < F < 1", noise, "Pass e.g. --noise 0.02 (2% IQR/median)."),
        ("--min-reps", min_reps >= 1, "an integer >= 1", min_reps, "Pass e.g. --min-reps 25."),
        ("--max-regression", max_regression >= 0, "a percentage >= 0", max_regression, "Pass e.g. --max-regression 5."),
        ("--max-slower", max_slower >= 0, "a percentage >= 0", max_slower, "Pass e.g. --max-slower 3."),
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
