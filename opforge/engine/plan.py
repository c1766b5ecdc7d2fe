"""Planning a run: which (implementation, check, case) tasks an op runs under the user's filters, which it skips and
why, and the results that stand for an op that never got to run (its loading failed, crashed or hung)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from opforge.cases.matrix import Case, build_matrix
from opforge.checks.base import Check, CheckContext, OptIns
from opforge.checks.catalog import CATALOG
from opforge.core.errors import OpforgeError
from opforge.core.protocol import Job
from opforge.core.results import CaseResult, OpReport, Status, Verdict, case_result, result_id
from opforge.core.shard import Shard, owns
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    from opforge.building.op import Implementation, LoadedOp

DEFAULT_SEED = 0
# The implementation name of the spec's op itself (opforge.building.op.NATIVE, spelled here so planning stays
# torch-free in a parent process).
NATIVE = "native"
# The result that stands for an op's loading (import, build, schema check) when it failed, crashed or hung.
LOAD_CHECK = "load"
LOAD_CASE = "-"


@dataclass(frozen=True)
class Filters:
    """Which results a run selects (--dtype, --device, --check, -k, --last-failed, --shard); how they run is
    RunSettings'."""

    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    keyword: str | None = None
    # Only these full result ids (--last-failed). An op whose loading failed is listed by its load result's id and
    # then runs whole.
    ids: tuple[str, ...] = ()
    # --shard K/N: only the tasks whose key hashes to this shard (opforge.core.shard).
    shard: Shard | None = None

    def wants_check(self, name: str) -> bool:
        return (
            not self.checks
            or name in self.checks
            or (name in CATALOG.result_names and CATALOG.of_result(name).name in self.checks)
        )

    def wants_id(self, op: str, ident: str) -> bool:
        if self.keyword and self.keyword not in ident:
            return False
        return not self.ids or ident in self.ids or load_result_id(op) in self.ids

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Filters:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**fields)


@dataclass(frozen=True)
class RunSettings:
    """How the selected tasks run: the seed every case's values derive from, whether the first failure ends the run
    (-x), and the check-owned options the run was given (`--large`, `--sanitize TOOLS`: CheckOption)."""

    seed: int = DEFAULT_SEED
    fail_fast: bool = False
    opt_ins: OptIns = field(default_factory=OptIns)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSettings:
        values = data["opt_ins"]["values"]
        opt_ins = OptIns(tuple((name, tuple(v) if isinstance(v, list) else v) for name, v in values))
        return cls(data["seed"], data["fail_fast"], opt_ins)


@dataclass(frozen=True)
class CheckJob(Job):
    """An engine worker's job (opforge.engine.worker): one op (or one part of its tasks), its spec, from which task
    to go on, and the task's time limit."""

    kind: ClassVar[str] = "check-job"
    spec: str
    filters: Filters
    settings: RunSettings
    start: int
    time_limit: float
    cuda_arch: str | None = None
    # One of `parts` workers that share an op's tasks: it runs those whose part_of(group, parts) == part.
    part: int = 0
    parts: int = 1

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "filters": self.filters.to_json(), "settings": self.settings.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckJob:
        filters, settings = Filters.from_json(data["filters"]), RunSettings.from_json(data["settings"])
        return cls(**{**data, "filters": filters, "settings": settings})


def load_result_id(op: str) -> str:
    return result_id(op, NATIVE, LOAD_CHECK, LOAD_CASE)


def load_result(spec: OpSpec, status: Status, message: str, seconds: float = 0.0) -> CaseResult:
    """The result that stands for an op that never got to run its checks: its loading failed, crashed or hung."""
    return case_result(
        spec.name,
        NATIVE,
        LOAD_CHECK,
        LOAD_CASE,
        "-",
        "-",
        Verdict(status, message),
        seconds=seconds,
        repro=f"opforge check {shlex.quote(str(spec.path))} --no-isolation",
    )


def unloadable_spec_report(path: Path, exc: OpforgeError) -> OpReport:
    """An op whose spec does not load (bad YAML, an unknown key): one ERROR load result named after the file."""
    op = path.stem
    result = case_result(
        op,
        NATIVE,
        LOAD_CHECK,
        LOAD_CASE,
        "-",
        "-",
        Verdict(Status.ERROR, str(exc)),
        repro=f"opforge check {shlex.quote(str(path))}",
    )
    return OpReport(op=op, spec_path=str(path), results=[result], load_exit_code=exc.exit_code)


@dataclass(frozen=True)
class Task:
    implementation: Implementation
    check: Check
    case: Case
    # Tasks whose check reuses work between them in one process share a group (see work_groups); workers that
    # split an op's tasks split them by group.
    group: int = 0


def part_of(group: int, parts: int) -> int:
    """Which of `parts` workers sharing an op's tasks runs those of `group`."""
    return group % parts


def work_groups(tasks: list[Task]) -> list[Task]:
    """The tasks with their groups, numbered in task order: those whose check shares work between its cases (compile:
    one compiled function per implementation, dtype and device) by the check's key, every other task alone."""
    numbers: dict[object, int] = {}
    grouped = []
    for index, task in enumerate(tasks):
        shared = task.check.shares_work
        key = (task.check.name, task.implementation.name, shared(task.case)) if shared else index
        grouped.append(replace(task, group=numbers.setdefault(key, len(numbers))))
    return grouped


@dataclass
class Plan:
    tasks: list[Task] = field(default_factory=list)
    skipped: list[CaseResult] = field(default_factory=list)


def plan_op(loaded: LoadedOp, filters: Filters, settings: RunSettings) -> Plan:
    from opforge.core.environment import device_unavailable

    spec = loaded.spec
    dtypes = tuple(d for d in spec.dtypes if not filters.dtypes or d in filters.dtypes)
    devices = tuple(d for d in spec.devices if not filters.devices or d in filters.devices)
    available = tuple(d for d in devices if device_unavailable(d) is None)
    matrix = build_matrix(spec, dtypes, available)
    plan = Plan()
    for implementation in loaded.implementations:
        for name in checks_to_run(spec, settings.opt_ins):
            check = CATALOG.get(name)
            names = [n for n in check.result_names() if filters.wants_check(n)]
            if not names or _hidden_and_unasked(check, settings.opt_ins):
                continue
            opted_out = check.opt_in.skip_reason(loaded, settings.opt_ins) if check.opt_in else None
            if opted_out:
                # The cases it would run on every device the spec names, available here or not.
                wanted = check.cases(loaded, implementation, build_matrix(spec, dtypes, devices))
                plan.skipped += _kept(
                    filters,
                    spec,
                    (
                        skip_result(spec, implementation, name, case.id, case.dtype, case.device, opted_out)
                        for name in names
                        for case in wanted
                    ),
                )
                continue
            for case in check.cases(loaded, implementation, matrix):
                if (
                    any(_matches(filters, spec, implementation, n, case) for n in names)
                    and (not filters.dtypes or case.dtype in filters.dtypes)
                    and owns(filters.shard, result_id(spec.name, implementation.name, check.name, case.id))
                ):
                    plan.tasks.append(Task(implementation, check, case))
            for device in devices:
                reason = device_unavailable(device)
                if reason:
                    claimed = [d for d in dtypes if d in spec.dtypes_on(device)]
                    skips = (
                        skip_result(spec, implementation, name, f"{dtype}-{device}", dtype, device, reason)
                        for name in names
                        for dtype in claimed
                    )
                    plan.skipped += _kept(filters, spec, skips)
    plan.tasks = work_groups(plan.tasks)
    return plan


def _kept(filters: Filters, spec: OpSpec, skipped: Iterable[CaseResult]) -> list[CaseResult]:
    """The skip results the filters select and this shard owns."""
    return [r for r in skipped if filters.wants_id(spec.name, r.full_id) and owns(filters.shard, r.full_id)]


def _hidden_and_unasked(check: Check, opt_ins: OptIns) -> bool:
    """A hidden check (one that runs only when asked and is left out of the run unseen otherwise: the sanitizer
    tools) that the run did not ask for."""
    return check.opt_in is not None and not check.opt_in.shown_unasked and not check.opt_in.asked(opt_ins)


def _hidden_but_asked(check: Check, opt_ins: OptIns) -> bool:
    """A hidden check the run asked for."""
    return check.opt_in is not None and not check.opt_in.shown_unasked and check.opt_in.asked(opt_ins)


def checks_to_run(spec: OpSpec, opt_ins: OptIns) -> tuple[str, ...]:
    """The spec's checks, and the hidden checks the run asked for by name (`--sanitize memcheck` runs
    memcheck on an op whose `checks:` list predates it: the command line is the more recent wish)."""
    asked = tuple(c.name for c in CATALOG if _hidden_but_asked(c, opt_ins) and c.name not in spec.checks)
    return spec.checks + asked


def unlisted_checks(specs: list[OpSpec], filters: Filters, settings: RunSettings) -> list[str]:
    """The --check names no selected spec runs: a run filtered to them checks nothing, and should say why."""
    run = {name for spec in specs for name in checks_to_run(spec, settings.opt_ins)}
    return [
        name
        for name in filters.checks
        if (CATALOG.of_result(name).name if name in CATALOG.result_names else name) not in run
    ]


def unasked_checks(filters: Filters, settings: RunSettings) -> list[Check]:
    """The checks --check names that run only when asked for (memcheck: --sanitize memcheck) and were not: a run
    filtered to them checks nothing, and should say which flag asks."""
    named = [CATALOG.of_result(name) for name in filters.checks if name in CATALOG.result_names]
    return [c for c in named if _hidden_and_unasked(c, settings.opt_ins)]


def _matches(filters: Filters, spec: OpSpec, implementation: Implementation, name: str, case: Case) -> bool:
    return filters.wants_id(spec.name, result_id(spec.name, implementation.name, name, case.id))


def reported_results(filters: Filters, spec: OpSpec, task: Task) -> list[str]:
    """The results a task reports: its check's result names that the filters keep."""
    return [
        name
        for name in task.check.result_names()
        if filters.wants_check(name) and _matches(filters, spec, task.implementation, name, task.case)
    ]


def skip_result(
    spec: OpSpec, implementation: Implementation, name: str, case_id: str, dtype: str, device: str, reason: str
) -> CaseResult:
    """A result that does not run here, and why: a device that is missing (one per dtype: `float32-cuda`), or an
    opt-in check not asked for (one per case it would run)."""
    return case_result(spec.name, implementation.name, name, case_id, dtype, device, Verdict(Status.SKIP, reason))


def check_context(
    loaded: LoadedOp,
    settings: RunSettings,
    time_limit: float | None = None,
    on_sweep: Callable[[Case], None] | None = None,
) -> CheckContext:
    """What a check is handed for a run under `settings` (a worker also passes its task's time limit and where the
    cases a task sweeps go)."""
    context = CheckContext(loaded, settings.seed, time_limit, settings.opt_ins)
    return replace(context, on_sweep=on_sweep) if on_sweep else context


def build_info(loaded: LoadedOp) -> dict[str, Any] | None:
    """What a report records of an op's build."""
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
