"""Running specs' checks in this process (`opforge check --no-isolation`, a debugger, the tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

from opforge.building.op import LoadedOp
from opforge.core.errors import OpforgeError
from opforge.core.results import CaseResult, OpReport, RunReport, Status
from opforge.engine.events import Events, progress_names
from opforge.engine.plan import (
    Filters,
    Plan,
    RunSettings,
    build_info,
    check_context,
    load_result,
    plan_op,
    reported_results,
)
from opforge.engine.tasks import run_tasks, stops_run
from opforge.loading.checked import load_checked
from opforge.spec.model import OpSpec


def run_in_process(
    specs: list[OpSpec],
    filters: Filters,
    settings: RunSettings,
    cuda_arch: str | None,
    run: RunReport,
    events: Events | None = None,
) -> None:
    """Every spec's checks in this process, appending each op's report to `run` as soon as it starts (so that an
    interrupted run keeps what finished). An op that fails to load is an ERROR load result and the next op goes on."""
    from opforge.core.environment import environment

    events = events or Events()
    names = progress_names(specs)
    run.environment = run.environment or environment()
    for spec in specs:
        report = OpReport(op=spec.name, spec_path=str(spec.path))
        run.ops.append(report)
        start = time.perf_counter()
        try:
            loaded = load_checked(spec, cuda_arch, on_step=events.step)
        except OpforgeError as exc:
            report.load_exit_code = exc.exit_code
            report.results.append(load_result(spec, Status.ERROR, str(exc), time.perf_counter() - start))
            events.result(names[spec.path], report.results[-1])
            continue
        plan = plan_op(loaded, filters, settings)
        # The results the run will report (a task gives one per result name it keeps), as the isolated parent counts.
        total = len(plan.skipped) + sum(len(reported_results(filters, spec, t)) for t in plan.tasks)
        events.planned(names[spec.path], total)

        def on_result(result: CaseResult, name: str = names[spec.path]) -> None:
            events.result(name, result)

        run_op(loaded, filters, settings, plan, on_result=on_result, report=report)
        report.seconds = time.perf_counter() - start
        if stops_run(settings, report.results):
            return


def run_op(
    loaded: LoadedOp,
    filters: Filters,
    settings: RunSettings | None = None,
    plan: Plan | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    report: OpReport | None = None,
) -> OpReport:
    """One loaded op's tasks, skips first, into `report` (a new one when none is given); `on_result` receives
    each result as it comes."""
    settings = settings or RunSettings()
    plan = plan or plan_op(loaded, filters, settings)
    start = time.perf_counter()
    if report is None:
        report = OpReport(op=loaded.spec.name, spec_path=str(loaded.spec.path))
    report.build = build_info(loaded)

    def add(result: CaseResult) -> None:
        report.results.append(result)
        if on_result is not None:
            on_result(result)

    def add_results(index: int, results: list[CaseResult]) -> None:
        for result in results:
            add(result)

    for result in plan.skipped:
        add(result)
    run_tasks(check_context(loaded, settings), plan, filters, settings, on_results=add_results)
    report.seconds = time.perf_counter() - start
    return report
