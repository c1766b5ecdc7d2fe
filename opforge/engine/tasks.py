"""Running tasks: one check on one case, its outcomes (or the exception it raised) turned into one result per result
name it owns, the spec's xfail entries applied, a rerun command for each failure. The one task loop every runner uses
(this process, a worker, the pytest plugin one task at a time), and the one outcome mapping (bench's verification
too)."""

from __future__ import annotations

import shlex
import time
import warnings
from collections.abc import Callable
from dataclasses import replace

from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, Outcomes
from opforge.checks.catalog import CATALOG
from opforge.core.outcomes import CheckFailure, CheckSkipped, PassDetail, PassNote, ReferenceFailure, short
from opforge.core.results import CaseResult, Status, Verdict, case_result, result_id
from opforge.engine.plan import Filters, Plan, RunSettings, Task, part_of, reported_results
from opforge.spec.model import OpSpec


def stops_run(settings: RunSettings, results: list[CaseResult]) -> bool:
    """-x: the first failed result ends the run (what every runner asks after each task)."""
    return settings.fail_fast and any(r.status.failed for r in results)


def run_tasks(
    context: CheckContext,
    plan: Plan,
    filters: Filters,
    settings: RunSettings,
    start: int = 0,
    part: tuple[int, int] = (0, 1),
    on_start: Callable[[int], None] = lambda index: None,
    on_results: Callable[[int, list[CaseResult]], None] = lambda index, results: None,
    after_task: Callable[[int], bool] = lambda index: True,
) -> bool:
    """Run the tasks from `start` on, those of `part` (K, N): whose part_of(group, N) is K. `after_task` returns
    False to stop (a worker whose device became unusable). Returns whether the tasks ran to the end, i.e. neither -x
    nor `after_task` stopped them."""
    own, parts = part
    for index in range(start, len(plan.tasks)):
        if part_of(plan.tasks[index].group, parts) != own:
            continue
        on_start(index)
        results = run_task(context, plan.tasks[index], filters)
        on_results(index, results)
        if stops_run(settings, results) or not after_task(index):
            return False
    return True


def run_task(ctx: CheckContext, task: Task, filters: Filters) -> list[CaseResult]:
    spec = ctx.loaded.spec
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            verdicts = check_verdicts(task.check, lambda: task.check.run(ctx, task.implementation, task.case))
        except Exception as exc:  # a bug in a check or an exotic op must cost one task, not the run
            verdicts = {
                name: Verdict(Status.ERROR, f"the check itself raised {short(exc)}")
                for name in task.check.result_names()
            }
    seen = tuple(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    seconds = (time.perf_counter() - start) / max(1, len(task.check.result_names()))
    results = []
    for name in reported_results(filters, spec, task):
        verdict = apply_xfail(spec, task.implementation.name, name, task.case, verdicts[name])
        results.append(
            case_result(
                spec.name,
                task.implementation.name,
                name,
                task.case.id,
                task.case.dtype,
                task.case.device,
                verdict,
                seconds=seconds,
                seed=task.case.seed(ctx.base_seed),
                repro=repro_command(spec, task.implementation.name, name, task.case.id, ctx.base_seed)
                if verdict.status.failed
                else None,
                warnings=seen,
            )
        )
    return results


def check_verdicts(check: Check, run: Callable[[], Outcomes]) -> dict[str, Verdict]:
    """A verdict for each result name of `check` from what `run` (the check on one case) returned or raised: the outcome
    exceptions as their statuses, every other exception passed on."""
    names = check.result_names()
    try:
        outcomes = run()
    except CheckFailure as failure:
        return {name: Verdict(Status.FAIL, failure.message, failure.mismatch) for name in names}
    except ReferenceFailure as exc:
        return {name: Verdict(Status.ERROR, str(exc)) for name in names}
    except CheckSkipped as exc:
        return {name: Verdict(Status.SKIP, str(exc)) for name in names}
    return outcome_verdicts(check, outcomes)


def outcome_verdicts(check: Check, outcomes: object) -> dict[str, Verdict]:
    """Each declared result name's outcome as a verdict. A name the check gave no outcome for, and one given something
    that is no outcome, is an ERROR (a bug in the check): never a silent pass."""
    names = check.result_names()
    if not isinstance(outcomes, dict):
        bug = f"the check {check.name} returned {type(outcomes).__name__}, expected a dict of outcomes by result name"
        return {name: Verdict(Status.ERROR, f"{bug}: a bug in the check") for name in names}
    unknown = [key for key in outcomes if key not in names]
    undeclared = f" (it returned result names it does not declare: {', '.join(map(str, unknown))})" if unknown else ""
    verdicts = {}
    for name in names:
        if name not in outcomes:
            verdicts[name] = Verdict(
                Status.ERROR,
                f"the check {check.name} returned no outcome for result {name}{undeclared}: a bug in the check",
            )
        else:
            verdicts[name] = _outcome_verdict(check, name, outcomes[name])
    return verdicts


def _outcome_verdict(check: Check, name: str, outcome: object) -> Verdict:
    if outcome is None:
        return Verdict(Status.PASS)
    if isinstance(outcome, PassNote):
        return Verdict(Status.PASS, outcome.message)
    if isinstance(outcome, PassDetail):
        return Verdict(Status.PASS, detail=outcome.detail)
    if isinstance(outcome, CheckFailure):
        return Verdict(Status.FAIL, outcome.message, outcome.mismatch)
    return Verdict(
        Status.ERROR,
        f"the check {check.name} returned {type(outcome).__name__} for result {name}, expected None, a PassNote or "
        "PassDetail, or a CheckFailure: a bug in the check",
    )


def apply_xfail(spec: OpSpec, implementation: str, check: str, case: Case, verdict: Verdict) -> Verdict:
    return declared(spec, implementation, check, case.dtype, case.device, case.layout, case.id, verdict)


def declared(
    spec: OpSpec,
    implementation: str,
    check: str | None,
    dtype: str,
    device: str,
    layout: str,
    case_id: str,
    verdict: Verdict,
) -> Verdict:
    """A result's verdict under the spec's xfail entries: a declared failure is XFAIL (a crash entry declares only a
    CRASH or TIMEOUT result, any other entry only a FAIL or ERROR), and a strict entry whose result passed is XPASS.
    The one xfail matcher: `opforge check`'s results, bench's verification and fuzz's examples (`check` None: an
    entry naming any check, for fuzz's crash, which is no one check's)."""
    where = (implementation, check, dtype, device, layout, case_id)
    if verdict.status == Status.PASS:
        stale = spec.xfail_for(*where) or spec.xfail_for(*where, crashed=True)
        if stale is not None and stale.strict:
            return replace(
                verdict,
                status=Status.XPASS,
                message=f"declared xfail ({stale.reason}) but passed: remove the xfail entry from the spec",
            )
        return verdict
    crashed = verdict.status in (Status.CRASH, Status.TIMEOUT)
    if not crashed and verdict.status not in (Status.FAIL, Status.ERROR):
        return verdict
    xfail = spec.xfail_for(*where, crashed=crashed)
    if xfail is None:
        return verdict
    return replace(verdict, status=Status.XFAIL, message=f"expected failure ({xfail.reason}): {verdict.message}")


def repro_command(spec: OpSpec, implementation: str, name: str, case_id: str, seed: int) -> str:
    """The command that reruns exactly one result (with the flags its check is opted into by)."""
    ident = result_id(spec.name, implementation, name, case_id)
    check = CATALOG.of_result(name)
    flags = "".join(f" {flag}" for flag in check.rerun_flags)
    return (
        f"opforge check {shlex.quote(str(spec.path))} --check {check.name} -k {shlex.quote(ident)} --seed {seed}{flags}"
    )
