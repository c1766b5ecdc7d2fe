"""One run session for every front end: the CLI's `opforge check` runs a whole selection through `run`, the pytest
plugin (one test item per task) loads, plans and runs tasks through `load`, `plan`, `context` and `run_task`. Both
take the same RunOptions, so a run asks the same things of opforge wherever it starts, opt-in checks included.

Nothing here imports torch at module level: an isolated run's parent stays torch-free (tests/test_structure.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opforge.core.errors import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, OpforgeError
from opforge.core.results import CaseResult, RunReport
from opforge.engine.plan import Filters, RunSettings, Task, check_context, plan_op, unasked_checks, unlisted_checks
from opforge.loading.checked import load_checked
from opforge.loading.spec import load_spec
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    from opforge.building.op import LoadedOp
    from opforge.checks.base import CheckContext
    from opforge.engine.plan import Plan
    from opforge.reporters.base import Reporter


# `opforge check`'s default worker count is one per core up to this many: each worker imports torch and loads the
# op (~3 s, ~0.5 GB, a CUDA context per GPU it uses), so on a large machine more workers than an op has checks
# worth splitting cost more than they save. Measured on 2 cores only (leaky_swish warm: 33.1 s with one worker,
# 22.5 s with two, docs/measurements/performance-history.md).
AUTO_JOBS_LIMIT = 4


def auto_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, AUTO_JOBS_LIMIT))


@dataclass(frozen=True)
class RunOptions:
    """How a run goes: which results (filters), how they run (the seed, -x, the check-owned options), what to build
    for, and where the checks run (worker processes, each task under a time limit, `jobs` ops at once; or this
    process)."""

    filters: Filters = field(default_factory=Filters)
    settings: RunSettings = field(default_factory=RunSettings)
    cuda_arch: str | None = None
    isolation: bool = True
    jobs: int = 1
    timeout: float | None = None
    # Whether each of the `jobs` workers gets its own share of the GPUs (an explicit -j) or all of them.
    split_gpus: bool = True


def run(paths: list[Path], options: RunOptions, reporters: list[Reporter]) -> tuple[RunReport, int]:
    """Every selected spec's checks, streamed to `reporters` (started here; finishing them is the caller's). An
    interrupt ends the run early with the report marked incomplete. Returns the report and its exit code."""
    from opforge.reporters.base import fan_out

    report = RunReport(environment={}, seed=options.settings.seed, shard=options.filters.shard)
    specs = load_specs(paths, report)
    report.notes += unlisted_check_notes(specs, options.filters, options.settings)
    events = fan_out(reporters)
    events.start()
    start = time.perf_counter()
    try:
        if options.isolation:
            from opforge.engine.isolated import Isolation, run_isolated

            isolation = Isolation(options.jobs, options.timeout, options.cuda_arch, options.split_gpus)
            run_isolated(specs, options.filters, options.settings, isolation, report, events)
        else:
            from opforge.engine.inprocess import run_in_process

            run_in_process(specs, options.filters, options.settings, options.cuda_arch, report, events)
    except KeyboardInterrupt:
        report.incomplete = True
    finally:
        report.seconds = time.perf_counter() - start
    if not report.environment:
        from opforge.core.environment import host_environment

        report.environment = host_environment()
    return report, exit_code(report)


def load_specs(paths: list[Path], report: RunReport) -> list[OpSpec]:
    """The specs that load. With one spec its error is the run's (exit 2); with several, a spec that does not load
    is its op's ERROR load result in `report` and the others still run."""
    from opforge.engine.plan import unloadable_spec_report

    if len(paths) == 1:
        specs = [load_spec(paths[0])]
    else:
        specs = []
        for path in paths:
            try:
                specs.append(load_spec(path))
            except OpforgeError as exc:
                report.ops.append(unloadable_spec_report(path, exc))
    report.notes += [warning for spec in specs for warning in spec.warnings]
    return specs


def exit_code(report: RunReport) -> int:
    """1 when a check failed; an op that could not load (a bad spec: 2, a failed build: 3) raises it; 5 when no
    check gave a verdict at all."""
    if report.nothing_ran:
        return EXIT_NOTHING_RAN
    return max(
        [EXIT_FAILED if report.failed else EXIT_OK]
        + [op.load_exit_code for op in report.ops if op.load_exit_code is not None]
    )


def unlisted_check_notes(specs: list[OpSpec], filters: Filters, settings: RunSettings) -> list[str]:
    """Why a `--check` selects nothing: no selected spec lists it, or it runs only when its option is given."""
    unasked = unasked_checks(filters, settings)
    return [
        f"--check {name}: expected a check some selected spec runs, got one none of them lists in `checks:` "
        f"({', '.join(s.name for s in specs)}). Add it to the spec's checks, or pick one it lists."
        for name in unlisted_checks(specs, filters, settings)
        if name not in {c.name for c in unasked}
    ] + [
        f"--check {c.name}: expected a check this run asked for, got one that runs only when asked: add "
        f"{' '.join(c.rerun_flags)}."
        for c in unasked
    ]


# -------------------------------------------------------------------- a task at a time (the pytest plugin's items)


def load(path: Path, options: RunOptions) -> LoadedOp:
    """One spec, loaded and built, its claims validated by every check."""
    return load_checked(load_spec(path), options.cuda_arch)


def plan(loaded: LoadedOp, options: RunOptions) -> Plan:
    return plan_op(loaded, options.filters, options.settings)


def context(loaded: LoadedOp, options: RunOptions) -> CheckContext:
    """What the tasks of one op run with. Tasks that share work (compile's one function per dtype and device) find
    it here, so a caller keeps one context per op for all its tasks, as the engine's workers do."""
    return check_context(loaded, options.settings)


def run_task(context: CheckContext, task: Task, options: RunOptions) -> list[CaseResult]:
    """One task in this process: a result per result it reports."""
    from opforge.engine.tasks import run_task as run_one

    return run_one(context, task, options.filters)
