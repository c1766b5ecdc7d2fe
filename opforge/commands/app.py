"""What every command shares: the Typer app, its global options (--debug, --version), the option types declared once,
error-to-exit-code mapping, report options generated from the report formats and check options generated from the
catalog. Commands live in the modules beside this one, one per command, named after it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from opforge.checks.base import CheckOption, OptIns
from opforge.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, OpforgeError, UsageError
from opforge.loading.spec import find_spec, list_specs
from opforge.reporters import console as out
from opforge.reporters.base import NotWritten, Reporter, ReportFormat
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES

app = typer.Typer(
    name="opforge",
    help="Prove a PyTorch custom operator right before you ship it.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}

# Options shared by several commands, declared once.
# The panels `--help` groups options into.
SELECTION, REPORTS, EXECUTION = "Selection", "Reports", "Execution"
OpsOrSpecs = Annotated[list[str] | None, typer.Argument(help="Op names (see `opforge list`) or paths to spec files.")]
Devices = Annotated[
    list[str],
    typer.Option(
        "--device",
        help=f"Only these devices (repeatable): {', '.join(KNOWN_DEVICES)}.",
        rich_help_panel=SELECTION,
        metavar="TEXT",
    ),
]
Dtypes = Annotated[
    list[str],
    typer.Option(
        "--dtype",
        help=f"Only these dtypes (repeatable): {', '.join(KNOWN_DTYPES)}.",
        rich_help_panel=SELECTION,
        metavar="TEXT",
    ),
]
ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="K/N",
        help="Only the K-th of N shares of the work (a stable split, for a CI matrix); join the shards' --json "
        "reports with `opforge merge-reports`.",
        rich_help_panel=SELECTION,
    ),
]
CudaArch = Annotated[
    str | None,
    typer.Option("--cuda-arch", help="CUDA archs to build for, e.g. 9.0.", rich_help_panel=EXECUTION, metavar="TEXT"),
]
Modes = Annotated[
    list[str],
    typer.Option("--mode", help="fwd, bwd or fwd+bwd (repeatable).", rich_help_panel=SELECTION, metavar="TEXT"),
]
Contenders = Annotated[
    list[str],
    typer.Option(
        "--contender",
        help="Only these contenders: native, a spec implementation, eager, compile (repeatable).",
        rich_help_panel=SELECTION,
        metavar="TEXT",
    ),
]
Sizes = Annotated[
    list[str],
    typer.Option(
        "--sizes",
        help="Elements per tensor input, e.g. 2**20,2**24 (replaces the spec's sizes and shapes).",
        rich_help_panel=SELECTION,
        metavar="TEXT",
    ),
]


def _print_version(asked: bool) -> None:
    if asked:
        from opforge import __version__

        out.info(f"opforge {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print opforge's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    _state["debug"] = debug


def guarded(command: Callable[[], int]) -> None:
    """Run a command body, turning opforge's errors into a one-line message and an exit code."""
    try:
        code = command()
    except OpforgeError as exc:
        if _state["debug"]:
            raise
        out.error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        out.error("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug in opforge: say so briefly, keep the traceback for --debug
        if _state["debug"]:
            worker_traceback = getattr(exc, "worker_traceback", "")
            if worker_traceback:
                out.error(f"the worker's traceback:\n{worker_traceback.rstrip()}")
            raise
        out.error(f"internal error: {type(exc).__name__}: {exc}. Rerun with --debug and report the traceback.")
        code = EXIT_INTERNAL
    raise typer.Exit(code)


def _with_added_options(
    command: Callable[..., None],
    replaced: str,
    added: list[inspect.Parameter],
    collect: Callable[[dict[str, Any]], Any],
) -> Callable[..., None]:
    """`command` with keyword-only options `added` in place of its parameter `replaced`: each call takes the added
    options' values out and passes `collect(values by name)` as `replaced`. Typer reads the new signature."""
    signature = inspect.signature(command, eval_str=True)
    params = [p for p in signature.parameters.values() if p.name != replaced]
    names = [p.name for p in added]

    @functools.wraps(command)
    def with_options(**kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in names}
        command(**kwargs, **{replaced: collect(given)})

    with_options.__signature__ = signature.replace(parameters=params + added)  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in params + added}
    return with_options


def with_report_options(formats: tuple[ReportFormat, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one `--option PATH` per report format of `formats`; the command receives them as
    `reports={format: path or None}`."""

    def param_name(fmt: ReportFormat) -> str:
        return "report_" + fmt.option.lstrip("-").replace("-", "_")

    added = [
        inspect.Parameter(
            param_name(fmt),
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                Path | None, typer.Option(fmt.option, help=fmt.help, rich_help_panel=REPORTS, metavar="PATH")
            ],
        )
        for fmt in formats
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        return _with_added_options(command, "reports", added, lambda given: {f: given[param_name(f)] for f in formats})

    return decorate


def with_check_options(options: tuple[CheckOption, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the options the checks own (`--large`, `--sanitize TOOLS`: CheckOption, from the catalog); the
    command receives them as `opt_ins` (GivenOptions, parsed into OptIns in its body). A check's flag lives in its
    module, not here."""

    def param_name(option: CheckOption) -> str:
        return "option_" + option.name.replace("-", "_")

    def annotation(option: CheckOption) -> Any:
        kind = typer.Option(option.flag, help=option.help, metavar=option.metavar, rich_help_panel=EXECUTION)
        return Annotated[bool, kind] if option.metavar is None else Annotated[str | None, kind]

    added = [
        inspect.Parameter(
            param_name(o),
            inspect.Parameter.KEYWORD_ONLY,
            default=False if o.metavar is None else None,
            annotation=annotation(o),
        )
        for o in options
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        return _with_added_options(
            command, "opt_ins", added, lambda given: GivenOptions({o: given[param_name(o)] for o in options})
        )

    return decorate


class GivenOptions:
    """The check options as given, parsed (a bad value is a UsageError) when the command's body runs, where errors
    become exit codes."""

    def __init__(self, given: dict[CheckOption, Any]):
        self.given = given

    def parse(self) -> OptIns:
        return OptIns.parsed(self.given)


def spec_paths(ops: list[str], all_specs: bool) -> list[Path]:
    if all_specs:
        return list_specs()
    if not ops:
        raise UsageError(
            "opforge check", "an op name, a spec path or --all", "nothing", "Run `opforge list` to see the bundled ops."
        )
    return [find_spec(t) for t in ops]


def validated(values: list[str], known: tuple[str, ...], option: str) -> tuple[str, ...]:
    for value in values:
        if value not in known:
            raise UsageError(option, f"one of {', '.join(known)}", repr(value), f"Fix the {option} value.")
    return tuple(values)


def file_reporters(reports: dict[ReportFormat, Path | None]) -> dict[tuple[ReportFormat, Path], Reporter]:
    """A reporter per report asked for. A path that cannot be written, or a format that cannot be written here, is
    refused before the run, not after it (and before the other reports)."""
    from opforge.core.files import check_writable

    asked = {fmt: path for fmt, path in reports.items() if path is not None}
    for fmt, path in asked.items():
        if fmt.preflight is not None:
            fmt.preflight()
        try:
            check_writable(path)
        except OSError as exc:
            raise UsageError(
                fmt.option,
                "a path a report can be written to",
                f"{path} ({exc.strerror or exc})",
                f"Point {fmt.option} at a file in a directory you can write to.",
            ) from None
    return {(fmt, path): fmt.make(path) for fmt, path in asked.items()}


def finish_files(files: dict[tuple[ReportFormat, Path], Reporter], run: Any) -> bool:
    """Write every report asked for; False if one could not be written (the others still are)."""
    written = True
    for (fmt, path), reporter in files.items():
        try:
            reporter.finish(run)
        except NotWritten as why:
            out.warning(f"{fmt.option} {path}: not written, {why}")
            continue
        except OSError as exc:
            out.error(f"{fmt.option}: expected to write {path}, got {exc}. Point {fmt.option} at a writable path.")
            written = False
            continue
        out.info(f"{fmt.title}: {path}")
    return written
