"""`opforge record`: run a program with its custom-op calls recorded, and write a spec per op."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import app, guarded
from opforge.reporters import console as out


@app.command(context_settings={"allow_interspersed_args": False})
def record(
    command: Annotated[
        list[str],
        typer.Argument(help="The command to run, after `--`: a Python program, `python -m pytest ...`."),
    ],
    namespaces: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            help="Record this namespace's ops only (repeatable; default: all but torch's).",
            metavar="TEXT",
        ),
    ] = None,
    directory: Annotated[
        Path, typer.Option("--out", help="Where to write the specs and calls files.", metavar="PATH")
    ] = Path("recorded"),
    max_calls: Annotated[
        int, typer.Option("--max-calls", min=1, help="Distinct calls kept per op.", metavar="INTEGER")
    ] = 5,
    max_elements: Annotated[
        int,
        typer.Option(
            "--max-elements",
            min=0,
            help="Values kept per floating tensor up to this many elements (integer tensors: 16x); beyond, a summary.",
            metavar="INTEGER",
        ),
    ] = 1 << 16,
) -> None:
    """Run COMMAND with the calls of custom ops recorded, then write a spec per op that `opforge check` runs as is.

    COMMAND runs unchanged (its output, its exit status, child processes recorded too); the specs are written after
    it exits, even when it failed or crashed.

    Examples:
      opforge record -- python train.py --steps 3
      opforge record --namespace mylib --out specs/recorded -- python -m pytest tests/test_model.py
      opforge check recorded/*.yaml
    """

    def body() -> int:
        from opforge.tools.record.run import record as run_recording

        result = run_recording(list(command), directory, tuple(namespaces or ()), max_calls, max_elements)
        if result.not_started:
            out.error(f"could not run the command: {result.not_started}")
        for warning in result.warnings:
            out.warning(warning)
        for spec in result.specs:
            out.err_console.print(f"opforge record: {spec.op}: {spec.calls} call(s) -> {spec.spec}")
        if not result.specs:
            out.err_console.print("opforge record: no custom-op call was recorded")
        else:
            out.err_console.print(f"opforge record: next: opforge check {result.out}/*.yaml")
        return result.exit_code

    guarded(body)
