"""What many test files share: paths, the ops' (dtype, atol, rtol) table, running a spec in this process or in
workers, and describing results in a failure message. A module of its own (conftest.py keeps only fixtures and the
process set-up that must come before torch is imported), since pytest advises against importing from conftest."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch

from opforge.building.op import load_op
from opforge.core.results import OpReport, Status
from opforge.engine.inprocess import run_op
from opforge.engine.plan import Filters, RunSettings
from opforge.loading.spec import load_spec

# Absolute: every test runs in its own temporary directory (below).
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

# (dtype, atol, rtol) of the ops' direct tests: torch.testing.assert_close's defaults, which the specs use too, but a
# tighter float64.
DTYPES = [
    (torch.float32, 1e-5, 1.3e-6),
    (torch.float64, 1e-12, 1e-12),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
]
DTYPE_IDS = [str(d[0]).removeprefix("torch.") for d in DTYPES]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# Options that need worker processes: a `check` given one keeps them.
_WORKER_OPTIONS = ("-j", "--jobs", "--timeout", "--no-isolation")


def in_process(args: tuple[str, ...]) -> list[str]:
    """`opforge check` arguments run in the test's own process: worker isolation has its tests
    (tests/test_isolation.py), and a worker start (importing torch, loading the op) costs ~1.5 s a run here."""
    if args and args[0] == "check" and not any(a in _WORKER_OPTIONS for a in args):
        return [*args, "--no-isolation"]
    return list(args)


def run_spec(path: Path, **selection) -> OpReport:
    """An op's checks in this process; `selection` holds Filters' fields and RunSettings' (seed, opt_ins)."""
    filters, settings = _split(selection)
    return run_op(load_op(load_spec(path)), filters, settings)


def _split(selection: dict) -> tuple[Filters, RunSettings]:
    settings = {k: selection.pop(k) for k in ("seed", "fail_fast", "opt_ins") if k in selection}
    return Filters(**selection), RunSettings(**settings)


def run_spec_isolated(path: Path, **selection) -> OpReport:
    """run_spec in worker processes, for ops that break the process they run in: a CUDA fault such as a misaligned
    address is sticky (every later CUDA call of the process fails), and two copies of one TORCH_LIBRARY namespace
    cannot be loaded into one process. The workers start afresh after a fault, as `opforge check` does."""
    from opforge.core.results import RunReport
    from opforge.engine.isolated import Isolation, run_isolated

    run = RunReport(environment={})
    run_isolated([load_spec(path)], *_split(selection), Isolation(), run)
    (report,) = run.ops
    return report


def failures_by_check(report: OpReport, implementation: str = "native") -> dict[str, list]:
    """The FAIL results of one implementation by check: an ERROR (the reference or the inputs broke) flags nothing."""
    failed = defaultdict(list)
    for r in report.results:
        if r.implementation == implementation and r.status == Status.FAIL:
            failed[r.check].append(r)
    return dict(failed)


def describe(results) -> str:
    """Failure text for assertion messages: every failing result with its worst mismatch."""
    from opforge.core.results import failure_text

    return "\n\n".join(f"{r.full_id}: {r.status.value}\n{failure_text(r)}" for r in results)


def spec_variant(tmp_path: Path, fixture: str, extra_yaml: str) -> Path:
    """A copy of a fixture spec with extra YAML appended, next to a copy of the fixtures' module."""
    return variant_of(tmp_path, FIXTURES, "broken_ops.py", fixture, extra=extra_yaml)


def variant_of(
    tmp_path: Path, folder: Path, module: str, fixture: str, replace: dict[str, str] | None = None, extra: str = ""
) -> Path:
    """A copy of `folder`'s spec `fixture` (each `replace` key, which must be there, replaced; `extra` YAML
    appended) beside a copy of the module it loads."""
    import shutil

    shutil.copy(folder / module, tmp_path / module)
    text = (folder / f"{fixture}.yaml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{fixture}.yaml"
    path.write_text(text + extra)
    return path
