"""`opforge scan`: what the ops registered in a namespace have and lack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import app, guarded
from opforge.core.errors import EXIT_FAILED, EXIT_OK
from opforge.reporters import console as out


@app.command()
def scan(
    namespace: Annotated[str, typer.Argument(help="The operators' namespace, e.g. fbgemm for torch.ops.fbgemm.")],
    imports: Annotated[
        list[str],
        typer.Option(
            "--import",
            metavar="MODULE",
            help="Import this module first: the one that registers the namespace's ops (repeatable).",
        ),
    ] = [],  # noqa: B006 (typer copies it)
    specs_dir: Annotated[
        Path | None,
        typer.Option(
            "--specs",
            metavar="DIR",
            help="Show which ops a spec under DIR names (searched recursively) and its last run's results.",
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", help="Also write the scan as JSON.")
    ] = None,
) -> None:
    """List every op of a namespace: its kernels by dispatch key, fake kernel, autograd formula, vmap rule, what its
    schema writes; flag ops without a fake kernel, with a CUDA kernel but no CPU one, or that look mutating while
    their schema says they write nothing.

    Read from the dispatcher without running a kernel (docs/scan.md). Exits 1 when an op is flagged.

    Examples:
      opforge scan fbgemm --import fbgemm_gpu
      opforge scan mylib --import mylib.ops --specs specs/ --json scan.json
    """

    def body() -> int:
        import json

        from opforge.core.files import write_atomically
        from opforge.reporters.lastfailed import last_runs
        from opforge.reporters.scan_terminal import render_scan
        from opforge.tools.scan import scan as scan_namespace

        result = scan_namespace(namespace, imports, specs_dir, last_runs(Path.cwd()) if specs_dir else None)
        render_scan(result)
        if json_path is not None:
            write_atomically(json_path, json.dumps(result.to_json(), indent=1) + "\n")
            out.info(f"JSON: {json_path}")
        return EXIT_FAILED if result.flagged else EXIT_OK

    guarded(body)
