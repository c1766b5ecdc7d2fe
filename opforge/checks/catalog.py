"""Every check opforge knows, in the order results are shown. The one list: the spec loader (which checks a spec may
name and which run by default), the engine (planning, running, rerun commands), the reporters and the CLI
(`--check`) all read it. Importing it does not import torch.

Adding a check: a module in opforge/checks/ that defines `CHECKS` (see opforge.checks.base.Check), and one line
below.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from opforge.checks import (
    compile,
    correctness,
    determinism,
    devices,
    dtypes,
    error_inputs,
    grad_lowp,
    gradcheck,
    grid_size,
    large_index,
    memory,
    multi_gpu,
    opcheck,
    sanitize,
    special_values,
    stream,
    vmap,
)
from opforge.checks.base import Check, CheckOption, SpecSection


class Catalog:
    """Checks by name, and the results they produce."""

    def __init__(self, checks: Iterable[Check]):
        self._checks = {c.name: c for c in checks}
        self._by_result = {name: c for c in self._checks.values() for name in c.result_names()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._checks)

    @property
    def result_names(self) -> tuple[str, ...]:
        """Every result a check can produce (a check's name, or its sub-results such as opcheck:test_schema)."""
        return tuple(self._by_result)

    @property
    def sub_results(self) -> tuple[str, ...]:
        """The result names that are not a check's own name: what `--check` and `xfail` accept besides the names."""
        return tuple(name for name in self._by_result if name not in self._checks)

    def __iter__(self) -> Iterator[Check]:
        return iter(self._checks.values())

    def __contains__(self, name: object) -> bool:
        return name in self._checks

    def get(self, name: str) -> Check:
        return self._checks[name]

    def of_result(self, name: str) -> Check:
        """The check that produces result `name`."""
        return self._by_result[name]

    @property
    def options(self) -> tuple[CheckOption, ...]:
        """Every command-line option a check owns, once each (the sanitizer tools share `--sanitize`)."""
        return tuple({option.name: option for check in self for option in check.options}.values())

    @property
    def sections(self) -> tuple[SpecSection, ...]:
        """Every spec section a check owns, once each."""
        return tuple({c.section.key: c.section for c in self if c.section is not None}.values())

    @property
    def oracles(self) -> dict[str, Check]:
        """`opforge fuzz`'s oracles by name (Check.oracle): every check that can judge one example."""
        return {c.oracle: c for c in self if c.oracle is not None}

    def default_checks(self, claims: Mapping[str, bool]) -> tuple[str, ...]:
        """The checks a spec runs when it lists none: those whose claims its spec makes."""
        return tuple(c.name for c in self if c.runs_by_default(dict(claims)))


CATALOG = Catalog(
    (
        *correctness.CHECKS,
        *devices.CHECKS,
        *determinism.CHECKS,
        *special_values.CHECKS,
        *opcheck.CHECKS,
        *gradcheck.CHECKS,
        *grad_lowp.CHECKS,
        *compile.CHECKS,
        *dtypes.CHECKS,
        *error_inputs.CHECKS,
        *vmap.CHECKS,
        *memory.CHECKS,
        *stream.CHECKS,
        *grid_size.CHECKS,
        *large_index.CHECKS,
        *multi_gpu.CHECKS,
        *sanitize.CHECKS,
    )
)
