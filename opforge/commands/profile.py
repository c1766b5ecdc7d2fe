"""`opforge profile`: where one call's time goes, per implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opforge.commands.app import (
    Contenders,
    Devices,
    Dtypes,
    Modes,
    Sizes,
    app,
    guarded,
    spec_paths,
)
from opforge.commands.bench import bench_filters
from opforge.core.errors import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK
from opforge.loading.spec import load_spec
from opforge.reporters import console as out


@app.command()
def profile(
    op: Annotated[str, typer.Argument(help="An op name (see `opforge list`) or a spec file.")],
    device: Devices = [],  # noqa: B006
    dtype: Dtypes = [],  # noqa: B006
    mode: Modes = [],  # noqa: B006
    contender: Contenders = [],  # noqa: B006
    sizes: Sizes = [],  # noqa: B006
    calls: Annotated[int, typer.Option("--calls", help="Calls profiled per implementation.", metavar="INTEGER")] = 10,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace", help="Write a Chrome/Perfetto trace per implementation: FILE-NN-impl-....json.", metavar="PATH"
        ),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.", metavar="PATH")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs.", metavar="INTEGER")] = 0,
) -> None:
    """Profile each implementation of an op: kernels per call, each kernel's time and share, host time, GB/s.

    The points are `opforge bench`'s (the spec's first bench size unless --sizes is given). An op that writes its
    arguments gets them back before each call, as in `opforge bench`; that copy is left out of the figures and
    labelled in the trace.

    Examples:
      opforge profile leaky_swish --dtype float32 --mode fwd
      opforge profile rms_norm --device cuda --contender native --contender compile --trace rms.json
    """

    def body() -> int:
        import json

        from opforge.core.files import write_atomically
        from opforge.reporters.profile_terminal import render_profile
        from opforge.tools.profile import profile_op

        filters = bench_filters(device, dtype, mode, contender, sizes, seed)
        [spec_path] = spec_paths([op], False)
        run = profile_op(load_spec(spec_path), filters, trace, calls, on_step=out.info)
        render_profile(run)
        if json_path is not None:
            write_atomically(json_path, json.dumps(run.to_json(), indent=2))
            out.info(f"JSON: {json_path}")
        if not run.results:
            out.error(f"opforge profile: expected something to profile, got nothing ({run.skipped_devices}).")
            return EXIT_NOTHING_RAN
        return EXIT_FAILED if any(r.error for r in run.results) else EXIT_OK

    guarded(body)
