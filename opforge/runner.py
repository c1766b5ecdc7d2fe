"""Running a spec's checks: plan the (implementation, check, case) rows, run them, collect CaseResults."""

from __future__ import annotations

import platform
import shlex
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from opforge.cases import Case, build_matrix
from opforge.checks import Check, CheckContext, registry
from opforge.checks.calls import short
from opforge.compare import CheckFailure, CheckSkipped, PassNote, ReferenceFailure
from opforge.errors import OpforgeError
from opforge.loading import NATIVE, LoadedOp, Target
from opforge.results import CaseResult, OpReport, RunReport, Status, result_id
from opforge.spec import OpSpec

DEFAULT_SEED = 0


@dataclass(frozen=True)
class Filters:
    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    keyword: str | None = None
    seed: int = DEFAULT_SEED
    fail_fast: bool = False
    # Run the checks that cost GBs of memory (large_index) even where the spec does not enable them.
    large: bool = False
    # Only these full result ids (--last-failed). An op whose loading failed is listed by its load row's id and
    # then runs whole.
    ids: tuple[str, ...] = ()

    def wants_check(self, row: str) -> bool:
        return not self.checks or row in self.checks or row.split(":", 1)[0] in self.checks

    def wants_id(self, op: str, ident: str) -> bool:
        if self.keyword and self.keyword not in ident:
            return False
        return not self.ids or ident in self.ids or load_row_id(op) in self.ids

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Filters:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


# The row that stands for an op's loading (import, build, schema check) when the process doing it crashed or hung.
LOAD_CHECK = "load"
LOAD_CASE = "-"


def load_row_id(op: str) -> str:
    return result_id(op, NATIVE, LOAD_CHECK, LOAD_CASE)


@dataclass(frozen=True)
class PlannedRow:
    target: Target
    check: Check
    case: Case


@dataclass
class Plan:
    rows: list[PlannedRow] = field(default_factory=list)
    skipped: list[CaseResult] = field(default_factory=list)


ProgressCallback = Callable[[CaseResult], None]


@dataclass
class Events:
    """What a run reports while ops run, in a worker process or in this one; the CLI wires these to opforge.report."""

    step: Callable[[str], None] = lambda message: None
    planned: Callable[[str, int], None] = lambda op, total: None
    result: Callable[[str, CaseResult], None] = lambda op, result: None


def stops_run(filters: Filters, results: list[CaseResult]) -> bool:
    """-x: the first failed result ends the run (what every runner asks after each row)."""
    return filters.fail_fast and any(r.status.failed for r in results)


def load_row(spec: OpSpec, status: Status, message: str, seconds: float = 0.0) -> CaseResult:
    """The row that stands for an op that never got to run its checks: its loading failed, crashed or hung."""
    return CaseResult(
        op=spec.name,
        target=NATIVE,
        check=LOAD_CHECK,
        case_id=LOAD_CASE,
        dtype="-",
        device="-",
        status=status,
        seconds=seconds,
        message=message,
        repro=f"opforge check {shlex.quote(str(spec.path))} --no-isolation",
    )


def run_in_process(
    specs: list[OpSpec], filters: Filters, cuda_arch: str | None, run: RunReport, events: Events | None = None
) -> None:
    """Every spec's checks in this process, appending each op's report to `run` as soon as it starts (so that an
    interrupted run keeps what finished). An op that fails to load is an ERROR load row and the next op goes on."""
    from opforge.loading import load_op

    events = events or Events()
    run.environment = run.environment or environment()
    for spec in specs:
        report = OpReport(op=spec.name, spec_path=str(spec.path))
        run.ops.append(report)
        start = time.perf_counter()
        try:
            loaded = load_op(spec, cuda_arch, on_step=events.step)
        except OpforgeError as exc:
            report.load_exit_code = exc.exit_code
            report.results.append(load_row(spec, Status.ERROR, str(exc), time.perf_counter() - start))
            events.result(spec.name, report.results[-1])
            continue
        report.build = build_info(loaded)
        plan = plan_op(loaded, filters)
        events.planned(spec.name, len(plan.rows) + len(plan.skipped))

        def on_result(result: CaseResult) -> None:
            report.results.append(result)
            events.result(spec.name, result)

        run_op(loaded, filters, plan, on_result=on_result)
        report.seconds = time.perf_counter() - start
        if stops_run(filters, report.results):
            return


def device_unavailable(device: str) -> str | None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        if not torch.version.cuda:
            return f"CUDA is not available: torch {torch.__version__} is a CPU-only build"
        return "CUDA is not available: no GPU is visible"
    return None


def plan_op(loaded: LoadedOp, filters: Filters) -> Plan:
    spec = loaded.spec
    dtypes = tuple(d for d in spec.dtypes if not filters.dtypes or d in filters.dtypes)
    devices = tuple(d for d in spec.devices if not filters.devices or d in filters.devices)
    available = tuple(d for d in devices if device_unavailable(d) is None)
    matrix = build_matrix(spec, dtypes, available)
    checks = registry()
    plan = Plan()
    for target in loaded.targets:
        for name in spec.checks:
            check = checks[name]
            rows = [r for r in check.row_names() if filters.wants_check(r)]
            if not rows:
                continue
            opted_out = check.opted_out(loaded, filters.large) if check.opted_out else None
            if opted_out:
                # The cases it would run on every device the spec names, available here or not.
                wanted = check.select(loaded, target, build_matrix(spec, dtypes, devices))
                plan.skipped += [
                    r
                    for r in (_skip_case(spec, target, row, case, opted_out) for row in rows for case in wanted)
                    if filters.wants_id(spec.name, r.full_id)
                ]
                continue
            for case in check.select(loaded, target, matrix):
                if any(_matches(filters, spec, target, r, case) for r in rows) and (
                    not filters.dtypes or case.dtype in filters.dtypes
                ):
                    plan.rows.append(PlannedRow(target, check, case))
            for device in devices:
                reason = device_unavailable(device)
                if reason:
                    skips = (_skip(spec, target, row, dtype, device, reason) for row in rows for dtype in dtypes)
                    plan.skipped += [r for r in skips if filters.wants_id(spec.name, r.full_id)]
    return plan


def _matches(filters: Filters, spec: OpSpec, target: Target, row: str, case: Case) -> bool:
    return filters.wants_id(spec.name, full_id(spec, target.name, row, case.id))


def reported_rows(filters: Filters, spec: OpSpec, row: PlannedRow) -> list[str]:
    """The result rows a planned row reports: its check's rows that the filters keep."""
    return [
        name
        for name in row.check.row_names()
        if filters.wants_check(name) and _matches(filters, spec, row.target, name, row.case)
    ]


def full_id(spec: OpSpec, target: str, check: str, case_id: str) -> str:
    return result_id(spec.name, target, check, case_id)


def _skip(spec, target, row, dtype, device, reason) -> CaseResult:
    return CaseResult(
        op=spec.name,
        target=target.name,
        check=row,
        case_id=f"{dtype}-{device}",
        dtype=dtype,
        device=device,
        status=Status.SKIP,
        message=reason,
    )


def _skip_case(spec, target, row, case: Case, reason) -> CaseResult:
    return CaseResult(
        op=spec.name,
        target=target.name,
        check=row,
        case_id=case.id,
        dtype=case.dtype,
        device=case.device,
        status=Status.SKIP,
        message=reason,
    )


def run_op(
    loaded: LoadedOp, filters: Filters, plan: Plan | None = None, on_result: ProgressCallback | None = None
) -> OpReport:
    plan = plan or plan_op(loaded, filters)
    start = time.perf_counter()
    report = OpReport(op=loaded.spec.name, spec_path=str(loaded.spec.path), build=build_info(loaded))

    def add(result: CaseResult) -> None:
        report.results.append(result)
        if on_result:
            on_result(result)

    def add_row(index: int, results: list[CaseResult]) -> None:
        for result in results:
            add(result)

    for result in plan.skipped:
        add(result)
    run_rows(CheckContext(loaded, filters.seed), plan, filters, on_results=add_row)
    report.seconds = time.perf_counter() - start
    return report


def run_rows(
    context: CheckContext,
    plan: Plan,
    filters: Filters,
    start: int = 0,
    on_start: Callable[[int], None] = lambda index: None,
    on_results: Callable[[int, list[CaseResult]], None] = lambda index, results: None,
    after_row: Callable[[int], bool] = lambda index: True,
) -> bool:
    """Run the planned rows from `start` on: the one loop of every runner (this process, a worker, pytest does one
    row at a time). `after_row` returns False to stop (a worker whose device became unusable). Returns whether
    the rows ran to the end, i.e. neither -x nor `after_row` stopped them."""
    for index in range(start, len(plan.rows)):
        on_start(index)
        results = run_row(context, plan.rows[index], filters)
        on_results(index, results)
        if stops_run(filters, results) or not after_row(index):
            return False
    return True


def run_row(ctx: CheckContext, row: PlannedRow, filters: Filters) -> list[CaseResult]:
    spec = ctx.loaded.spec
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes, errors, skipped = _run_check(ctx, row)
    seen = tuple(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    seconds = (time.perf_counter() - start) / max(1, len(row.check.row_names()))
    results = []
    for name in reported_rows(filters, spec, row):
        if name in skipped:
            status, message, mismatch = Status.SKIP, skipped[name], None
        elif name in errors:
            status, message, mismatch = Status.ERROR, errors[name], None
        else:
            failure = outcomes.get(name)
            if failure is None or isinstance(failure, PassNote):
                status, message, mismatch = Status.PASS, failure.message if failure else "", None
            else:
                status, message, mismatch = Status.FAIL, failure.message, failure.mismatch
        status, message = _apply_xfail(spec, row.target.name, name, row.case, status, message)
        results.append(
            CaseResult(
                op=spec.name,
                target=row.target.name,
                check=name,
                case_id=row.case.id,
                dtype=row.case.dtype,
                device=row.case.device,
                status=status,
                seconds=seconds,
                message=message,
                mismatch=mismatch,
                seed=row.case.seed(ctx.base_seed),
                repro=repro_command(spec, row.target.name, name, row.case.id, ctx.base_seed) if status.failed else None,
                warnings=seen,
            )
        )
    return results


def _run_check(ctx: CheckContext, row: PlannedRow) -> tuple[dict, dict[str, str], dict[str, str]]:
    """(outcomes by row name, error messages by row name, skip reasons by row name)."""
    names = row.check.row_names()
    try:
        return row.check.run(ctx, row.target, row.case), {}, {}
    except CheckFailure as failure:
        return {name: failure for name in names}, {}, {}
    except ReferenceFailure as exc:
        return {}, {name: str(exc) for name in names}, {}
    except CheckSkipped as exc:
        return {}, {}, {name: str(exc) for name in names}
    except Exception as exc:  # a bug in a check or an exotic op must cost one row, not the run
        return {}, {name: f"the check itself raised {short(exc)}" for name in names}, {}


def _apply_xfail(spec: OpSpec, target: str, check: str, case: Case, status: Status, message: str) -> tuple[Status, str]:
    xfail = spec.xfail_for(target, check, case.dtype, case.device)
    if xfail is None:
        return status, message
    if status in (Status.FAIL, Status.ERROR):
        return Status.XFAIL, f"expected failure ({xfail.reason}): {message}"
    if status == Status.PASS and xfail.strict:
        return Status.XPASS, f"declared xfail ({xfail.reason}) but passed: remove the xfail entry from the spec"
    return status, message


def repro_command(spec: OpSpec, target: str, check: str, case_id: str, seed: int) -> str:
    ident = full_id(spec, target, check, case_id)
    # large_index is opt-in: its rerun must opt in too.
    return (
        f"opforge check {shlex.quote(str(spec.path))} --check {check.split(':', 1)[0]} "
        f"-k {shlex.quote(ident)} --seed {seed}" + (" --large" if check == "large_index" else "")
    )


def build_info(loaded: LoadedOp) -> dict | None:
    if loaded.build is None:
        return None
    plan = loaded.build.plan
    return {
        "library": str(plan.library),
        "cached": loaded.build.cached,
        "seconds": round(loaded.build.seconds, 3),
        "sources": [str(s) for s in plan.sources],
        "skipped_sources": [str(s) for s in plan.skipped_sources],
        "cuda_skipped_because": plan.toolchain.skip_reason if plan.skipped_sources else None,
    }


def environment() -> dict:
    import torch

    env = {
        "opforge": __import__("opforge").__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env
