"""The op of a loaded spec, built and loaded, with every claim of the spec it cannot honour refused by the check
that owns the claim: what the engine, the pytest plugin and `opforge profile` run checks on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from opforge.checks.catalog import CATALOG
from opforge.spec.model import OpSpec

if TYPE_CHECKING:
    from opforge.building.op import LoadedOp


def load_checked(spec: OpSpec, cuda_arch: str | None = None, on_step: Callable[[str], None] | None = None) -> LoadedOp:
    """The loaded op, after every check has refused a claim of the spec the op cannot honour (a SpecError): a
    claim is refused whether or not the check runs."""
    from opforge.building.op import load_op

    loaded = load_op(spec, cuda_arch, on_step)
    for check in CATALOG:
        if check.validate is not None:
            check.validate(loaded)
    return loaded
