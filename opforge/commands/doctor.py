"""`opforge doctor`: what this machine can build, check and bench."""

from __future__ import annotations

from typing import Annotated

import typer

from opforge.commands.app import app, guarded
from opforge.core.errors import EXIT_FAILED, EXIT_OK


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
        from opforge.reporters.doctor_terminal import render_diagnosis
        from opforge.tools.doctor import diagnose

        diagnosis = diagnose(build_probes)
        render_diagnosis(diagnosis)
        return EXIT_FAILED if diagnosis.failed else EXIT_OK

    guarded(body)
