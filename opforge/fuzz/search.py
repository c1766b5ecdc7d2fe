"""`opforge fuzz`: a hypothesis search over an op's calls beyond the spec's matrix (opforge.fuzz.space), each
example judged in the worker (opforge.fuzz.oracles), each distinct failure shrunk by hypothesis to a minimal example.

Hypothesis keeps its example database under `.opforge/fuzz/<op>`, so a rerun replays the failures it found first.
The search runs as passes of a few examples each, so that a time budget can end it between passes; a failure
already found (the same oracle and cause) counts as seen and does not stop later passes from finding others.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opforge.building.op import NATIVE
from opforge.checks.base import Check
from opforge.checks.catalog import CATALOG
from opforge.core.environment import host_environment
from opforge.core.errors import UsageError
from opforge.core.results import CaseResult, OpReport, RunReport, Status, Verdict, case_result
from opforge.engine.events import Events
from opforge.engine.plan import Filters
from opforge.engine.tasks import declared
from opforge.fuzz.options import FuzzOptions
from opforge.fuzz.process import FuzzWorker
from opforge.fuzz.save import repro_command
from opforge.fuzz.space import Space, examples
from opforge.fuzz.verdict import CRASHED, HUNG
from opforge.spec.model import OpSpec, Regression

# Examples per hypothesis pass: small, so a pass ends soon after the budget does (~0.1 s an example here), large
# enough that each pass still explores (hypothesis spends its first examples on the simplest ones).
PASS_EXAMPLES = 25
# Shrinking a failure found just before the budget ran out may go on this much longer; then the smallest example
# found so far is reported.
SHRINK_GRACE = 30.0
# One example's limit before it counts as a hang: the largest examples (2^20 elements through every oracle) take
# ~2 s here.
EXAMPLE_TIME_LIMIT = 30.0

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found]


# A search judged too few examples to mean anything, and exits 5 ("nothing was checked"), when it judged fewer than
# this many (or every example --max-examples allows, when that is fewer)...
MIN_JUDGED = 10
# ...or fewer than this share of the examples it drew: the rest discarded (outside the reference's domain, too costly
# to judge, beyond the dtype) or refused by the op. Seen: a samples function's OpenMP op poisoned every forked child,
# which hung, and all 6 examples of a 60 s search were discarded as too costly; the search said "no failure found".
MIN_JUDGED_SHARE = 0.1


@dataclass(frozen=True)
class Failure:
    """One distinct failure, at the smallest example hypothesis shrank it to."""

    oracle: str
    message: str
    example: Regression
    verdict: Verdict
    # When the search first met it: seconds from its start (the op loaded and built), which example it was (1 for
    # a failure the example database replayed first), and that example, before shrinking.
    found_after: float
    found_at: int
    first: Regression

    @property
    def key(self) -> str:
        return failure_key(self.verdict)


@dataclass
class Discards:
    """The examples discarded for one reason (verdict.OUTSIDE_DOMAIN, TOO_COSTLY, UNDECIDABLE), and the first's
    message."""

    count: int = 0
    first: str = ""


# The case id of an oracle's result when it found no failure: the search as a whole.
SEARCH_CASE = "search"


@dataclass
class FuzzReport:
    op: str
    spec_path: Path
    device: str
    oracles: tuple[str, ...]
    examples: int = 0
    judged: int = 0  # an oracle's verdict: passed, failed, or failed as the spec declares
    rejected: int = 0  # discarded, for any reason: see `discards`
    discards: dict[str, Discards] = field(default_factory=dict)
    op_rejects: int = 0  # the op refused a call the reference took (a narrower domain)
    first_reject: str = ""
    known: int = 0  # failures the spec's xfail entries declare
    first_known: str = ""
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    budget_ran_out: bool = False
    max_examples: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def judged_too_few(self) -> bool:
        """Whether the search judged too few examples to mean anything (MIN_JUDGED, MIN_JUDGED_SHARE): never a
        pass."""
        needed = min(MIN_JUDGED, self.max_examples or MIN_JUDGED)
        return self.judged < needed or self.judged < MIN_JUDGED_SHARE * self.examples

    def run_report(self) -> RunReport:
        """The search as results, what the JUnit, Markdown and JSON reports render as they do a check run's: each
        failure a failed result of its oracle on its minimal example; each oracle that found none a pass over the
        search (a skip when the search judged too few examples to mean anything)."""
        results = [_failure_result(self, f) for f in self.failures]
        failed = {f.oracle for f in self.failures}
        judged = f"{self.judged} of {self.examples} examples judged on {self.device} in {self.seconds:.0f} s"
        verdict = (
            Verdict(Status.SKIP, f"too few examples judged to mean anything: {judged}")
            if self.judged_too_few
            else Verdict(Status.PASS, detail=f"no failure found: {judged}")
        )
        for oracle in self.oracles:
            if oracle not in failed:
                results.append(case_result(self.op, NATIVE, oracle, SEARCH_CASE, "-", self.device, verdict))
        notes = [f"{self.known} examples failed as the spec's xfail entries declare"] if self.known else []
        op = OpReport(self.op, str(self.spec_path), results, seconds=self.seconds)
        return RunReport(host_environment(), [op], seconds=self.seconds, notes=notes)


def _failure_result(report: FuzzReport, failure: Failure) -> CaseResult:
    example = failure.example
    cause = f" ({failure.verdict.cause})" if failure.verdict.cause else ""
    return case_result(
        report.op,
        NATIVE,
        failure.oracle,
        example_id(example),
        example.dtype,
        example.device,
        replace(failure.verdict, message=f"{failure.message}{cause}"),
        seed=example.seed,
        repro=repro_command(report.spec_path, example),
    )


def example_id(example: Regression) -> str:
    """A minimal example as a case id: dtype, device, shapes (or sample), layout, then its fill and arguments."""
    shapes = ",".join(f"{name}={'x'.join(map(str, shape))}" for name, shape in example.shapes)
    parts = [example.dtype, example.device, shapes or f"sample{example.sample}", example.layout]
    parts += [f"fill={example.fill}"] if example.fill else []
    parts += [f"{name}={value}" for name, value in example.values]
    return "-".join(parts)


def failure_key(verdict: Verdict) -> str:
    """What makes two failures the same one: the oracle and the failure's cause (the kind of mismatch, and the
    special value it needs: a NaN dropped and an all -inf row mishandled are two), so that a first failure does not
    hide a second. A crash is one failure whatever signal ended it (one overrun segfaults at one size and raises
    SIGBUS at another), a hang one."""
    return f"{verdict.oracle}: {verdict.cause}" if verdict.cause else verdict.oracle


class FoundFailure(Exception):
    """Raised into hypothesis for a failing example; one subclass per failure key, so that hypothesis tells distinct
    failures apart (it groups them by exception type) and shrinks each."""

    def __init__(self, example: Regression, verdict: Verdict):
        super().__init__(f"{verdict.oracle}: {verdict.message}")
        self.example = example
        self.verdict = verdict


_FAILURE_TYPES: dict[str, type[FoundFailure]] = {}


def _failure_type(key: str) -> type[FoundFailure]:
    if key not in _FAILURE_TYPES:
        _FAILURE_TYPES[key] = type(f"Found_{len(_FAILURE_TYPES)}", (FoundFailure,), {})
    return _FAILURE_TYPES[key]


def fuzz(spec: OpSpec, options: FuzzOptions, events: Events | None = None) -> FuzzReport:
    """Search until the budget or --max-examples runs out; the budget starts once the op is loaded (and built).
    `events` hears how the search stands after each example (progress). Raises LoadFailed when the op does not
    load."""
    worker = FuzzWorker(spec.path, options.cuda_arch, EXAMPLE_TIME_LIMIT)
    start = time.monotonic()
    try:
        oracles = oracles_for(spec, options.device, options.oracles)
        report = FuzzReport(spec.name, spec.path, options.device, oracles, max_examples=options.max_examples)
        _Search(spec, options, worker, report, events or Events(), start).run()
    finally:
        worker.close()
    report.seconds = time.monotonic() - start
    return report


def replay(spec: OpSpec, example: Regression, options: FuzzOptions) -> tuple[Verdict, tuple[str, ...]]:
    """One example through the oracles (a failure's repro command)."""
    worker = FuzzWorker(spec.path, options.cuda_arch, EXAMPLE_TIME_LIMIT)
    try:
        oracles = oracles_for(spec, example.device, options.oracles)
        verdict = worker.run(example, oracles)
        return declared_crash(spec, example, verdict, worker.case_id), oracles
    finally:
        worker.close()


def declared_crash(spec: OpSpec, example: Regression, verdict: Verdict, case_id: str) -> Verdict:
    """An example whose process died or hung where the spec declares a crash (`crash: true`) is known, as `opforge
    check` reports its result XFAIL. `case_id` (for a `case:` glob): the one the worker made of the example
    (ExampleStart), a samples spec's with its sample's shapes. Before, the parent made it itself and had none for a
    samples spec, so entries with a `case:` glob never declared its crashes (fbgemm's pack_segments, which dies on
    a strided lengths in samples 0-2, fuzzed as a new crash)."""
    if verdict.status != Status.FAIL or verdict.oracle not in (CRASHED, HUNG):
        return verdict
    crash = replace(verdict, status=Status.CRASH)
    known = declared(spec, NATIVE, None, example.dtype, example.device, example.layout, case_id, crash)
    return known if known.status == Status.XFAIL else verdict


def oracles_for(spec: OpSpec, device: str, checks: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The oracles of a search of `spec` on `device`: the catalog's checks that can judge one example
    (Check.one_example), where `opforge check` would run them (the spec's `checks:`, the check's devices) and their
    own condition allows (determinism: not on a spec that claims `deterministic: false`), in the catalog's order.
    `checks` (`--check`) selects as `opforge check`'s does: a check's name or one of its results (`opcheck`, or
    `opcheck:test_faketensor`, select the fake oracle); without it, every one not asked for by name only (compile).
    Raises UsageError for a name that selects no oracle here, saying why."""
    for name in checks:
        _check_selects_an_oracle(spec, device, name)
    wanted = Filters(checks=checks)
    return tuple(
        oracle
        for oracle, check in CATALOG.oracles.items()
        if any(wanted.wants_check(r) for r in check.judged_results())
        and _not_judging(spec, device, check) is None
        and (checks or not (check.one_example and check.one_example.asked_only))
    )


def _not_judging(spec: OpSpec, device: str, check: Check) -> str | None:
    """Why `check` judges no example of `spec` on `device`; None: it judges them."""
    if check.name not in spec.checks:
        return f"the spec does not run {check.name} (its checks: {', '.join(spec.checks)})"
    if check.devices and device not in check.devices:
        return f"{check.name} runs on {', '.join(check.devices)}, not {device}"
    return check.one_example.unless(spec, device) if check.one_example else "it cannot judge one example"


def _check_selects_an_oracle(spec: OpSpec, device: str, name: str) -> None:
    """A --check name selects an oracle of this search, or is a usage error saying why not."""
    checks = {check.name: None for check in CATALOG.oracles.values()}
    results = [oracle for oracle in CATALOG.oracles if oracle not in checks]
    oracles = f"{', '.join(checks)}, or one of their results: {', '.join(results)}"
    if name not in CATALOG.names and name not in CATALOG.result_names:
        raise UsageError(
            "--check", f"a check that judges one example ({oracles})", repr(name), "Pick one of fuzz's oracles."
        )
    check = CATALOG.get(name) if name in CATALOG.names else CATALOG.of_result(name)
    if (name not in check.judged_results() and name != check.name) or check.oracle is None:
        raise UsageError(
            "--check",
            f"a check that judges one example ({oracles})",
            f"{name}, which `opforge check` runs on its matrix alone",
            "Run it with `opforge check`.",
        )
    why = _not_judging(spec, device, check)
    if why is not None:
        raise UsageError(f"--check {name}", f"an oracle that judges {spec.name} on {device}", why, "Drop it.")


class _Search:
    def __init__(
        self,
        spec: OpSpec,
        options: FuzzOptions,
        worker: FuzzWorker,
        report: FuzzReport,
        events: Events,
        start: float,
    ):
        self.spec, self.options, self.worker, self.report, self.events = spec, options, worker, report, events
        self.start = start
        self.deadline = start + options.budget
        self.first_seen: dict[str, tuple[float, int, Regression]] = {}
        self.found: dict[str, Failure] = {}
        # Each new failure of this pass at its last failing example: what is reported when the budget cuts
        # hypothesis's shrinking short (it then raises no minimal example); otherwise hypothesis's own minimal one
        # replaces it.
        self.latest: dict[str, Failure] = {}

    def run(self) -> None:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as fixed_seed
        from hypothesis.database import DirectoryBasedExampleDatabase

        space = self.worker.space
        strategy = examples(
            self.spec,
            Space(
                tuple(tuple((name, tuple(shape)) for name, shape in p) for p in space["pairings"]),
                tuple(space["special_inputs"]),
                space["sampled"],
            ),
            self.options.device,
            self.options.max_numel,
        )
        database = DirectoryBasedExampleDatabase(str(self.options.database / self.spec.name))
        index = 0
        while not self._out_of_examples() and time.monotonic() < self.deadline:
            if self.options.exit_first and self.found:
                break
            phases = [Phase.generate, Phase.target, Phase.shrink]
            test = settings(
                database=database,
                max_examples=PASS_EXAMPLES,
                deadline=None,
                phases=[Phase.explicit, Phase.reuse, *phases] if index == 0 else phases,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=not self.options.exit_first,  # -x: the one failure hypothesis reports
                verbosity=Verbosity.quiet,
                print_blob=False,
                derandomize=False,
            )(given(strategy)(self._probe_function()))
            if self.options.seed is not None:
                test = fixed_seed(self.options.seed + index)(test)
            self._collect(test)
            self.found.update(self.latest)
            self.latest.clear()
            self.report.failures = sorted(self.found.values(), key=lambda f: f.key)
            index += 1
        self.report.budget_ran_out = time.monotonic() >= self.deadline

    def _probe_function(self) -> Callable[[Regression], None]:
        """The test hypothesis runs (a plain function, whose source names its database entries)."""

        def probe(example: Regression) -> None:
            self._probe(example)

        return probe

    def _probe(self, example: Regression) -> None:
        from hypothesis import reject

        now = time.monotonic()
        shrinking = bool(self.latest)
        if now > self.deadline + SHRINK_GRACE or (not shrinking and (now > self.deadline or self._out_of_examples())):
            return  # out of time or examples: hypothesis's remaining calls of this pass run nothing
        verdict = self.worker.run(example, self.report.oracles)
        verdict = declared_crash(self.spec, example, verdict, self.worker.case_id)
        self._count(verdict)
        if verdict.status == Status.DISCARD:
            reject()
        key = failure_key(verdict)
        if verdict.status == Status.FAIL and key not in self.found:
            found_after, found_at, first = self.first_seen.setdefault(
                key, (now - self.start, self.report.examples, example)
            )
            self.latest[key] = Failure(verdict.oracle, verdict.message, example, verdict, found_after, found_at, first)
            raise _failure_type(key)(example, verdict)

    def _count(self, verdict: Verdict) -> None:
        report = self.report
        report.examples += 1
        if verdict.status in (Status.PASS, Status.FAIL, Status.XFAIL):
            report.judged += 1
        if verdict.status == Status.DISCARD:
            report.rejected += 1
            discards = report.discards.setdefault(verdict.cause, Discards())
            discards.count += 1
            discards.first = discards.first or verdict.message
        elif verdict.status == Status.REJECT:
            report.op_rejects += 1
            report.first_reject = report.first_reject or verdict.message
        elif verdict.status == Status.XFAIL:
            report.known += 1
            report.first_known = report.first_known or verdict.message
        self.events.progress(report, self.deadline - time.monotonic())

    def _collect(self, test: Callable[[], None]) -> None:
        """Run one pass. The minimal examples hypothesis raises (one failure, or a group of them) replace the pass's
        last ones; a flaky report (the budget cut a replay short) keeps those; anything else is opforge's error."""
        from hypothesis.errors import Flaky, Unsatisfiable

        try:
            test()
        except FoundFailure as failure:
            self._minimal([failure])
        except (Flaky, Unsatisfiable):
            pass  # Unsatisfiable: every example of the pass was outside the domain; the next pass draws others
        except BaseExceptionGroup as group:
            self._minimal(_found_in(group))

    def _minimal(self, failures: list[FoundFailure]) -> None:
        for failure in failures:
            key = failure_key(failure.verdict)
            found_after, found_at, first = self.first_seen[key]
            verdict = failure.verdict
            self.latest[key] = Failure(
                verdict.oracle, verdict.message, failure.example, verdict, found_after, found_at, first
            )

    def _out_of_examples(self) -> bool:
        limit = self.options.max_examples
        return limit is not None and self.report.examples >= limit


def _found_in(group: BaseExceptionGroup[Any]) -> list[FoundFailure]:
    """The failures of a group (nested too); any other exception in it is re-raised."""
    found: list[FoundFailure] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found += _found_in(exc)
        elif isinstance(exc, FoundFailure):
            found.append(exc)
        else:
            raise exc
    return found
