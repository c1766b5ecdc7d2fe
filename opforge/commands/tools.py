"""`opforge new`, `opforge doctor` and `opforge scan`: scaffolding an op, what this machine can build, check and
bench, and what the ops registered in a namespace have and lack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import app, guarded
from opforge.errors import EXIT_FAILED, EXIT_OK
from opforge.reporters import console as out


@app.command()
def new(
    name: Annotated[str, typer.Argument(help="The op's name: a lowercase identifier, e.g. my_swish.")],
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where to write it (default: ./NAME).", show_default=False)
    ] = None,
    stage: Annotated[
        str, typer.Option("--stage", help="python (a custom_op prototype), cpp (+ C++ kernels) or cuda (+ CUDA).")
    ] = "python",
    namespace: Annotated[str, typer.Option("--namespace", help="The op's namespace.")] = "myops",
) -> None:
    """Scaffold an op that passes `opforge check` as written: its spec, a Python prototype, and C++/CUDA kernels.

    Run it again with a later --stage to add the next implementation; the spec is updated if it is as written.

    Examples:
      opforge new my_swish && opforge check my_swish/my_swish.yaml
      opforge new my_swish --stage cpp
      opforge new my_swish --stage cuda --namespace mylib
    """

    def body() -> int:
        from opforge.scaffold import scaffold

        result = scaffold(name, directory or Path(name), stage, namespace)
        for path in result.written:
            out.info(f"wrote {path}")
        for path in result.kept:
            out.info(f"kept {path} (yours: not overwritten)")
        out.info(f"next: opforge check {result.spec}")
        return EXIT_OK

    guarded(body)


@app.command()
def doctor(
    build_probes: Annotated[
        bool,
        typer.Option(
            "--build",
            help="Also compile: an OpenMP program, and a tiny extension whose error message formats a number "
            "(about 20 s the first time, then cached).",
        ),
    ] = False,
) -> None:
    """Check this machine for what building, checking and benchmarking custom ops needs; each finding with its fix.

    Exits 1 when something needed to build or run the bundled ops is missing.

    Examples:
      opforge doctor
      opforge doctor --build
    """

    def body() -> int:
        from opforge.doctor import diagnose
        from opforge.reporters.doctor_terminal import render_diagnosis

        diagnosis = diagnose(build_probes)
        render_diagnosis(diagnosis)
        return EXIT_FAILED if diagnosis.failed else EXIT_OK

    guarded(body)


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

        from opforge.files import write_atomically
        from opforge.reporters.lastfailed import last_runs
        from opforge.reporters.scan_terminal import render_scan
        from opforge.scan import scan as scan_namespace

        result = scan_namespace(namespace, imports, specs_dir, last_runs(Path.cwd()) if specs_dir else None)
        render_scan(result)
        if json_path is not None:
            write_atomically(json_path, json.dumps(result.to_json(), indent=1) + "\n")
            out.info(f"JSON: {json_path}")
        return EXIT_FAILED if result.flagged else EXIT_OK

    guarded(body)
