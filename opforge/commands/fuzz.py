"""`opforge fuzz`: search past the spec's matrix for the inputs that break an op (opforge.fuzz)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opforge.checks.catalog import CATALOG
from opforge.commands.app import (
    EXECUTION,
    REPORTS,
    SELECTION,
    CudaArch,
    app,
    file_reporters,
    finish_files,
    guarded,
    spec_paths,
    with_report_options,
)
from opforge.core.errors import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, UsageError
from opforge.core.results import Status
from opforge.fuzz.options import DEFAULT_BUDGET, DEFAULT_MAX_NUMEL, FuzzOptions
from opforge.reporters import FUZZ_FORMATS
from opforge.reporters.base import ReportFormat
from opforge.spec.model import KNOWN_DEVICES, OpSpec

if TYPE_CHECKING:
    from opforge.fuzz.search import FuzzReport

# The checks that can judge one example (fuzz's oracles), as --help names them.
ORACLE_CHECKS = tuple(dict.fromkeys(check.name for check in CATALOG.oracles.values()))
# What `--check` named before the oracles were the catalog's checks (issue 41): still read, with a warning.
DEPRECATED_NAMES = {"fake": "opcheck:test_faketensor"}


@app.command()
@with_report_options(FUZZ_FORMATS)
def fuzz(
    op: Annotated[str, typer.Argument(help="An op name (see `opforge list`) or a spec file.")],
    budget: Annotated[
        float, typer.Option("--budget", metavar="SECONDS", help="Search this long.", rich_help_panel=EXECUTION)
    ] = DEFAULT_BUDGET,
    max_examples: Annotated[
        int | None,
        typer.Option("--max-examples", metavar="N", help="Stop after N examples.", rich_help_panel=EXECUTION),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="Seed the search: the same seed, the same examples (hypothesis then leaves its database alone).",
            rich_help_panel=EXECUTION,
            metavar="INTEGER",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="cpu or cuda (default: cpu when the spec runs there).",
            rich_help_panel=SELECTION,
            metavar="TEXT",
        ),
    ] = None,
    check_: Annotated[
        list[str],
        typer.Option(
            "--check",
            help="Only these checks as oracles (repeatable), as `opforge check --check` names them: "
            f"{', '.join(ORACLE_CHECKS)} (compile only when asked), or a result such as opcheck:test_faketensor.",
            rich_help_panel=SELECTION,
            metavar="TEXT",
        ),
    ] = [],  # noqa: B006
    max_numel: Annotated[
        int,
        typer.Option(
            "--max-numel", metavar="N", help="Elements of all inputs together, at most.", rich_help_panel=SELECTION
        ),
    ] = DEFAULT_MAX_NUMEL,
    save: Annotated[
        bool,
        typer.Option(
            "--save",
            help="Keep each failure's minimal example in the spec's `regressions:`, which `opforge check` runs.",
            rich_help_panel=REPORTS,
        ),
    ] = False,
    exit_first: Annotated[
        bool,
        typer.Option("-x", "--exitfirst", help="Stop at the first failure, once shrunk.", rich_help_panel=EXECUTION),
    ] = False,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            metavar="JSON",
            help="Run this one example (a failure's repro) instead of searching.",
            rich_help_panel=SELECTION,
        ),
    ] = None,
    cuda_arch: CudaArch = None,
    *,
    reports: dict[ReportFormat, Path | None],
) -> None:
    """Search for inputs that break an op, beyond its spec's matrix: shapes, layouts, storage offsets and values
    hypothesis draws and shrinks. Exit 1 when it found a failure, 0 when the budget ran out without one, 5 when it
    judged too few examples to mean anything (the rest discarded or refused).

    \b
    Examples:
      opforge fuzz leaky_swish
      opforge fuzz my_op.yaml --budget 300 --device cuda --json fuzz.json --save
      opforge fuzz my_op.yaml --junit fuzz.xml --markdown "$GITHUB_STEP_SUMMARY"
    """

    def body() -> int:
        from opforge.fuzz.search import fuzz as search
        from opforge.fuzz.search import oracles_for, replay
        from opforge.loading.regressions import read_example
        from opforge.loading.spec import load_spec
        from opforge.reporters.fuzz_report import Live, render_fuzz, render_replay

        [spec_path] = spec_paths([op], False)
        spec = load_spec(spec_path)
        chosen = _device(spec, device)
        checks = _checks(check_)
        oracles_for(spec, chosen, checks)  # a --check that selects no oracle here is a usage error before the search
        options = FuzzOptions(
            budget=_positive(budget, "--budget"),
            max_examples=max_examples,
            seed=seed,
            device=chosen,
            oracles=checks,
            max_numel=int(_positive(max_numel, "--max-numel")),
            cuda_arch=cuda_arch,
            exit_first=exit_first,
        )
        files = file_reporters(_search_reports(reports, example))
        if example is not None:
            kept = read_example(example, spec, chosen)
            verdict, oracles = replay(spec, kept, options)
            render_replay(verdict, oracles)
            return _replay_exit(verdict.status)
        live = Live()
        with live.shown():
            report = search(spec, options, live)
        render_fuzz(report)
        written = finish_files(files, report)
        if save and report.failures:
            _save(spec, report)
        code = EXIT_FAILED if report.failed else EXIT_NOTHING_RAN if report.judged_too_few else EXIT_OK
        return code if written else max(code, EXIT_USAGE)

    guarded(body)


def _search_reports(reports: dict[ReportFormat, Path | None], example: str | None) -> dict[ReportFormat, Path | None]:
    """The reports asked for, which only a search writes: --example replays one example and reports nothing."""
    asked = [fmt.option for fmt, path in reports.items() if path is not None]
    if example is not None and asked:
        raise UsageError(
            " ".join(asked), "a search to report", "--example (one example replayed)", "Drop --example or the reports."
        )
    return reports


def _replay_exit(status: Status) -> int:
    """A failure 1; a pass, or a failure the spec declares, 0; an example nothing judged (the reference or the op
    refused it, or it was discarded) 5: never a pass."""
    if status == Status.FAIL:
        return EXIT_FAILED
    return EXIT_OK if status in (Status.PASS, Status.XFAIL) else EXIT_NOTHING_RAN


def _save(spec: OpSpec, report: FuzzReport) -> None:
    from opforge.fuzz.save import example_json, save_regressions
    from opforge.reporters import console as out

    entries = [{**example_json(f.example), "found": f"{f.oracle}: {f.message}"[:300]} for f in report.failures]
    today = datetime.date.today().isoformat()
    added = save_regressions(spec.path, entries, f"found by opforge fuzz on {today}")
    out.info(f"saved {added} regression case(s) in {spec.path} (regressions:); `opforge check` runs them")


def _device(spec: OpSpec, device: str | None) -> str:
    from opforge.core.environment import device_unavailable

    if device is None:
        return "cpu" if "cpu" in spec.devices else spec.devices[0]
    if device not in KNOWN_DEVICES or device not in spec.devices:
        raise UsageError(
            "--device", f"one of the spec's devices ({', '.join(spec.devices)})", repr(device), "Pick one of them."
        )
    reason = device_unavailable(device)
    if reason:
        raise UsageError("--device", "a device this machine has", f"{device}: {reason}", "Fuzz on the CPU here.")
    return device


def _checks(names: list[str]) -> tuple[str, ...]:
    """The --check names, a deprecated one replaced by what to write now (with a warning that says so)."""
    from opforge.reporters import console as out

    for name in names:
        if name in DEPRECATED_NAMES:
            out.warning(f"--check {name} is deprecated: write --check {DEPRECATED_NAMES[name]} (or its check's name)")
    return tuple(DEPRECATED_NAMES.get(name, name) for name in names)


def _positive(value: float, option: str) -> float:
    if not value > 0:
        raise UsageError(option, "a number > 0", repr(value), f"Give e.g. {option} 60.")
    return value
