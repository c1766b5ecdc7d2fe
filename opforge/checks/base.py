"""What a check is: one object holding everything the rest of opforge needs to know about it (its results, when it
applies, which cases it runs, how it runs one, how a failure is rerun), and the case selections several checks share.

A check's `run` takes one case and returns one outcome per result it owns (opforge.core.outcomes): the engine turns
a missing or unknown result name into an ERROR result, so a typo cannot turn a failure into a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opforge.core.outcomes import Outcome
from opforge.spec.model import Input, OpSpec, layout_kind
from opforge.spec.reader import Reader

if TYPE_CHECKING:
    from opforge.building.op import Implementation, LoadedOp
    from opforge.cases.matrix import Case


@dataclass(frozen=True)
class CheckOption:
    """A command-line option a check owns. The CLI (`opforge check --<name>`) and the pytest plugin
    (`pytest --opforge-<name>`) make theirs from the catalog's. Without a metavar it is a flag (True when given);
    with one it takes a value, which `parse` turns into what the check reads (raising UsageError for a bad one)."""

    name: str
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None

    @property
    def flag(self) -> str:
        return f"--{self.name}"


@dataclass(frozen=True)
class SpecBeforeSections:
    """The spec as read before its check sections, for a section's reader that needs the rest of it: its inputs and
    its dtypes."""

    inputs: tuple[Input, ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class SpecSection:
    """A top-level spec key a check owns: `read` builds the section's model (a frozen dataclass the check defines)
    from its node, naming `file:line` on every error (opforge.spec.reader), and the loaded spec keeps it under the
    key (OpSpec.section). Its presence is a claim of the spec's: the check's `claim`, when it has one."""

    key: str
    read: Callable[[Reader, SpecBeforeSections], Any]


@dataclass(frozen=True)
class OptIns:
    """What a run asked for beyond the checks that run by default, by option name (`CheckOption.name`): e.g.
    `large: True` for `--large`, `sanitize: ("memcheck",)` for `--sanitize memcheck`. An option not given is absent."""

    values: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, **values: Any) -> OptIns:
        return cls(tuple((name, value) for name, value in values.items() if value not in (None, False, ())))

    @classmethod
    def parsed(cls, given: Mapping[CheckOption, Any]) -> OptIns:
        """The options as a front end was given them (the CLI's flags, pytest's --opforge-* options), each text value
        through its option's parser; a bad value raises the parser's error."""
        return cls.of(
            **{o.name: o.parse(v) if o.parse is not None and isinstance(v, str) else v for o, v in given.items()}
        )

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.values).get(name, default)


@dataclass(frozen=True)
class CheckContext:
    loaded: LoadedOp
    base_seed: int
    # The task's time limit in seconds when a parent process enforces one (isolated runs), for a check that must
    # end its own work first (a child process of its own); None in process.
    time_limit: float | None = None
    opt_ins: OptIns = OptIns()
    # What a check keeps between its tasks in this process for this op (see Check.shares_work), by its own keys.
    shared: dict[Hashable, Any] = field(default_factory=dict, compare=False)
    # Told each other case of the spec a task runs the op on (dtypes' sweep), so that a crash there is reported on
    # that case, where a spec's xfail can name it; an isolated worker tells its parent.
    on_sweep: Callable[[Case], None] = field(default=lambda case: None, compare=False)


Outcomes = dict[str, Outcome]
Selector = Callable[["LoadedOp", "Implementation", list["Case"]], list["Case"]]
Runner = Callable[[CheckContext, "Implementation", "Case"], Outcomes]


@dataclass(frozen=True)
class OptIn:
    """A check that runs only when the run asks for it, through one of its options. Not asked, it is either left out
    of the run unseen (the sanitizer tools), or, when `unless_asked` gives a reason for the op, one skip result per case
    saying why (large_index's memory; None from it: this op runs the check anyway, `large_index.enabled: true`)."""

    asked: Callable[[OptIns], bool]
    unless_asked: Callable[[LoadedOp], str | None] | None = None

    @property
    def shown_unasked(self) -> bool:
        return self.unless_asked is not None

    def skip_reason(self, loaded: LoadedOp, opt_ins: OptIns) -> str | None:
        """Why the check does not run for `loaded` in a run with `opt_ins` (None: it runs)."""
        if self.asked(opt_ins) or self.unless_asked is None:
            return None
        return self.unless_asked(loaded)


# Raises SpecError when the loaded op cannot honour what the spec claims for this check.
Validator = Callable[["LoadedOp"], None]


@dataclass(frozen=True)
class OneExample:
    """A check that can judge one example on its own (a call beyond the spec's matrix): `opforge fuzz` makes it one
    of its oracles, named by the one result it judges (opcheck:test_faketensor) or else the check's name. It judges
    an example where `opforge check` would run the check (the spec's `checks:`, the check's devices) and `unless`
    gives no reason against it."""

    # The results it judges (a check's run must give their outcomes); empty: all of the check's.
    results: tuple[str, ...] = ()
    # How it judges one example, when not the check's own `run` (opcheck: test_faketensor alone).
    run: Runner | None = None
    # Why it says nothing about `spec`'s op on `device` (determinism: a spec that claims results differ run to run);
    # None: it applies.
    unless: Callable[[OpSpec, str], str | None] = lambda spec, device: None
    # It judges only when asked by name (`opforge fuzz --check compile`): too slow for every search.
    asked_only: bool = False
    # Seconds it may add to one example's time limit (compile: a child's first example of a dtype compiles the op).
    extra_seconds: float = 0.0


@dataclass(frozen=True)
class Check:
    name: str
    # One line for `--help` and docs: the bug it catches.
    summary: str
    select: Selector
    run: Runner
    # The results it produces, when more than its own name (opcheck: one per sub-test).
    results: tuple[str, ...] = ()
    # Spec claims that must all hold for it to run when the spec lists no `checks:` (differentiable, ...).
    default_when: tuple[str, ...] = ()
    # The spec key its cases come from: the check runs only when the spec gives it (vmap, error_inputs, ...).
    claim: str | None = None
    # The devices its cases run on; empty: every device of the matrix.
    devices: tuple[str, ...] = ()
    # GPUs one of its cases needs at once (multi_gpu: 2); a run that gives a worker fewer says so.
    gpus: int = 0
    # How it runs only when asked (None: it runs whenever its spec and devices allow).
    opt_in: OptIn | None = None
    validate: Validator | None = None
    # What a rerun command of one of its failures adds (an opt-in flag).
    rerun_flags: tuple[str, ...] = ()
    # The command-line options it owns (what `opt_in` reads from the run's OptIns).
    options: tuple[CheckOption, ...] = ()
    # The spec section it owns (what its selection and run read from the spec), if any.
    section: SpecSection | None = None
    # It also visits dtypes the spec does not claim (the terminal folds those into one column).
    visits_unclaimed_dtypes: bool = False
    # Its cases with the same key (per implementation) reuse work kept in CheckContext.shared, so one worker runs
    # them all (compile: one compiled function per dtype and device); None: every case stands alone.
    shares_work: Callable[[Case], Hashable] | None = None
    # How it judges one example of `opforge fuzz` (an oracle), when it can.
    one_example: OneExample | None = None

    def result_names(self) -> tuple[str, ...]:
        return self.results or (self.name,)

    def judged_results(self) -> tuple[str, ...]:
        """The results it judges one example by (`one_example`); empty when it cannot."""
        if self.one_example is None:
            return ()
        return self.one_example.results or self.result_names()

    @property
    def oracle(self) -> str | None:
        """Its name as an oracle of `opforge fuzz`: the one result it judges, else its own name; None when it
        judges no example."""
        judged = self.judged_results()
        return None if not judged else judged[0] if len(judged) == 1 else self.name

    def runs_by_default(self, claims: dict[str, bool]) -> bool:
        return all(claims[c] for c in self.default_when) and (self.claim is None or claims[self.claim])

    def cases(self, loaded: LoadedOp, implementation: Implementation, matrix: list[Case]) -> list[Case]:
        """The cases it runs of `matrix`: its selection of those on its devices."""
        on_its_devices = [c for c in matrix if not self.devices or c.device in self.devices]
        return self.select(loaded, implementation, on_its_devices)


# ------------------------------------------------------------------------------------------ shared selections


def all_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    return cases


def aligned(cases: list[Case]) -> list[Case]:
    """The cases whose tensors start where their storage does: the `offset` cases (a misaligned data pointer) run
    where alignment can change the result (correctness, grad_lowp, devices); a check it cannot fail leaves them out
    rather than pay for them."""
    return [c for c in cases if layout_kind(c.layout) != "offset"]


def first_values(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """Registration and compilation do not depend on argument values: the first combination is enough."""
    return [c for c in cases if c.values_index == 0]


def representative_cases(loaded: LoadedOp, cases: list[Case]) -> dict[str, Case]:
    """Per device, the representative contiguous case (the spec's representative shapes, the first argument
    values, the first dtype): what a check that runs once per device uses."""
    wanted = loaded.spec.representative_shape_index()
    selected: dict[str, Case] = {}
    for case in cases:
        if case.layout == "contiguous" and case.values_index == 0 and case.shape_index == wanted:
            selected.setdefault(case.device, case)
    return selected
