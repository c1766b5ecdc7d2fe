"""`opforge new`: scaffolding an op."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import app, guarded
from opforge.core.errors import EXIT_OK
from opforge.reporters import console as out


@app.command()
def new(
    name: Annotated[str, typer.Argument(help="The op's name: a lowercase identifier, e.g. my_swish.")],
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Where to write it (default: ./NAME).", show_default=False, metavar="PATH"),
    ] = None,
    stage: Annotated[
        str,
        typer.Option(
            "--stage", help="python (a custom_op prototype), cpp (+ C++ kernels) or cuda (+ CUDA).", metavar="TEXT"
        ),
    ] = "python",
    namespace: Annotated[str, typer.Option("--namespace", help="The op's namespace.", metavar="TEXT")] = "myops",
) -> None:
    """Scaffold an op that passes `opforge check` as written: its spec, a Python prototype, and C++/CUDA kernels.

    Run it again with a later --stage to add the next implementation; the spec is updated if it is as written.

    Examples:
      opforge new my_swish && opforge check my_swish/my_swish.yaml
      opforge new my_swish --stage cpp
      opforge new my_swish --stage cuda --namespace mylib
    """

    def body() -> int:
        from opforge.tools.scaffold import scaffold

        result = scaffold(name, directory or Path(name), stage, namespace)
        for path in result.written:
            out.info(f"wrote {path}")
        for path in result.kept:
            out.info(f"kept {path} (yours: not overwritten)")
        out.info(f"next: opforge check {result.spec}")
        return EXIT_OK

    guarded(body)
