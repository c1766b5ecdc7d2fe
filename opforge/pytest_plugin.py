"""opforge as a pytest plugin: `pytest --opforge specs/` collects one test item per op x check x case.

Ids read like opforge's results (`specs/leaky_swish.yaml::leaky_swish/native::correctness[float32-cpu-contiguous-x=7-
alpha=0.1]`), a failure shows opforge's account (worst mismatch, seed, repro command), and the rest is pytest's:
`-k`, `-x`, `--junitxml`, `-n auto` with pytest-xdist (each worker process loads each op once, when it collects it;
a worker that crashes is replaced by xdist and its item reported failed), `--timeout` with pytest-timeout.

Registered through the `pytest11` entry point, so it is active wherever opforge is installed, but it collects
nothing unless `--opforge` is given: a project's own test run is unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from opforge.checks.base import CheckContext, OptIns
from opforge.checks.catalog import CATALOG
from opforge.core.errors import OpforgeError
from opforge.core.results import CaseResult, Status, failure_text
from opforge.spec.model import SPEC_SUFFIXES

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr, TracebackStyle

    from opforge.building.op import LoadedOp
    from opforge.engine.plan import Filters, Task
    from opforge.run.session import RunOptions

# The loaded ops and the results of the tasks run so far, for this process.
_SESSION = pytest.StashKey["_Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opforge", "opforge: check PyTorch custom operators from YAML specs")
    group.addoption(
        "--opforge",
        action="store_true",
        default=False,
        help="Collect .yaml/.yml files as opforge specs: one test per op x check x case.",
    )
    group.addoption("--opforge-seed", type=int, default=0, help="opforge's base seed (as `opforge check --seed`).")
    group.addoption("--opforge-cuda-arch", default=None, help="CUDA archs to build for, e.g. 9.0.")
    # The options the checks own, as `opforge check` has them (`--large` here is `--opforge-large`).
    for option in CATALOG.options:
        if option.metavar is None:
            group.addoption(f"--opforge-{option.name}", action="store_true", default=False, help=option.help)
        else:
            group.addoption(f"--opforge-{option.name}", metavar=option.metavar, default=None, help=option.help)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "opforge: a test item collected from an opforge spec")
    from opforge.engine.plan import RunSettings
    from opforge.run.session import RunOptions

    # In this process: pytest is the runner (pytest-xdist its workers, pytest-timeout its time limit).
    settings = RunSettings(seed=config.getoption("opforge_seed"), opt_ins=_opt_ins(config))
    options = RunOptions(settings=settings, cuda_arch=config.getoption("opforge_cuda_arch"), isolation=False)
    config.stash[_SESSION] = _Session(options)


def _opt_ins(config: pytest.Config) -> OptIns:
    given = {option: config.getoption(f"--opforge-{option.name}") for option in CATALOG.options}
    try:
        return OptIns.parsed(given)
    except OpforgeError as exc:  # its message names the option as opforge check spells it (--sanitize)
        raise pytest.UsageError(f"an --opforge-* option: {exc}") from None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if parent.config.getoption("opforge") and file_path.suffix in SPEC_SUFFIXES:
        return SpecFile.from_parent(parent, path=file_path)
    return None


@dataclass
class _Session:
    """The run session's task-at-a-time side (opforge.run.session), with what this process loaded and ran so far."""

    options: RunOptions
    # Each loaded op with what its items run with (context.loaded is the op).
    contexts: dict[Path, CheckContext] = field(default_factory=dict)
    results: dict[tuple[Path, int], dict[str, CaseResult]] = field(default_factory=dict)

    @property
    def filters(self) -> Filters:
        return self.options.filters

    def load(self, path: Path) -> LoadedOp:
        from opforge.run import session

        if path not in self.contexts:
            self.contexts[path] = session.context(session.load(path, self.options), self.options)
        return self.contexts[path].loaded

    def result(self, path: Path, index: int, task: Task, name: str) -> CaseResult:
        """Runs a task once per process; its other results (opcheck's sub-tests) come from the cache."""
        from opforge.run import session

        key = (path, index)
        if key not in self.results:
            self.results[key] = {r.check: r for r in session.run_task(self.contexts[path], task, self.options)}
        return self.results[key][name]


class SpecFile(pytest.File):
    def collect(self) -> Iterator[pytest.Collector]:
        from opforge.engine.plan import reported_results
        from opforge.run import session as run_session

        session = self.config.stash[_SESSION]
        try:
            loaded = session.load(self.path)
        except OpforgeError as exc:
            raise self.CollectError(f"opforge: {exc}") from None
        spec = loaded.spec
        for warning in spec.warnings:
            self.warn(pytest.PytestWarning(f"opforge: {warning}"))
        plan = run_session.plan(loaded, session.options)
        # One collector per implementation, so that an item's node id is its opforge id after the file
        # (`good.yaml::good/native::correctness[...]`) and selects it: a `::` inside an item's name would not.
        by_implementation: dict[str, list[dict[str, Any]]] = {}
        for result in plan.skipped:
            by_implementation.setdefault(result.implementation, []).append(
                {"name": f"{result.check}[{result.case_id}]", "fixed": result}
            )
        for index, task in enumerate(plan.tasks):
            for name in reported_results(session.filters, spec, task):
                by_implementation.setdefault(task.implementation.name, []).append(
                    {"name": f"{name}[{task.case.id}]", "index": index, "task": task, "result_name": name}
                )
        for implementation, items in by_implementation.items():
            yield ImplementationCollector.from_parent(self, name=f"{spec.name}/{implementation}", items=items)


class ImplementationCollector(pytest.Collector):
    """The items of one implementation of a spec's op."""

    def __init__(self, *, items: list[dict[str, Any]], **kwargs: Any):
        super().__init__(**kwargs)
        self._items = items

    def collect(self) -> Iterator[pytest.Item]:
        for item in self._items:
            yield OpforgeItem.from_parent(self, **item)


class OpforgeCheckFailed(Exception):
    """An item's result failed; carries it for repr_failure."""

    def __init__(self, result: CaseResult):
        super().__init__(result.message.splitlines()[0] if result.message else result.status.value)
        self.result = result


class OpforgeItem(pytest.Item):
    def __init__(
        self,
        *,
        index: int = -1,
        task: Any = None,
        result_name: str = "",
        fixed: CaseResult | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.index, self.task, self.result_name, self.fixed = index, task, result_name, fixed
        self.add_marker("opforge")

    def runtest(self) -> None:
        result = self.fixed or self.config.stash[_SESSION].result(self.path, self.index, self.task, self.result_name)
        if result.status == Status.SKIP:
            pytest.skip(result.message)
        if result.status == Status.XFAIL:
            pytest.xfail(result.message)
        if result.status.failed:
            raise OpforgeCheckFailed(result)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: TracebackStyle | None = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, OpforgeCheckFailed):
            result = excinfo.value.result
            return f"{result.status.value.upper()}: {result.full_id}\n{failure_text(result)}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        parent = self.parent.name if self.parent is not None else ""
        return self.path, None, f"{parent}::{self.name}"
