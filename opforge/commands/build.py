"""`opforge build`: compiling (or finding cached) kernels."""

from __future__ import annotations

from typing import Annotated

import typer

from opforge.commands.app import CudaArch, app, guarded, spec_paths
from opforge.core.errors import EXIT_OK, BuildError
from opforge.loading.spec import load_spec
from opforge.reporters import console as out


@app.command()
def build(
    ops: Annotated[
        list[str] | None,
        typer.Argument(help="Op names or spec paths; all bundled specs when none."),
    ] = None,
    cuda_arch: CudaArch = None,
    require_cuda: Annotated[
        bool,
        typer.Option("--require-cuda", help="Fail (exit 3) if CUDA sources cannot be built here: a compile-only gate."),
    ] = False,
) -> None:
    """Compile (or find in the cache) the C++/CUDA sources of op specs."""

    def body() -> int:
        from opforge.building.extension import build, detect_toolchain
        from opforge.building.op import spec_build_plan
        from opforge.reporters.build_terminal import render_builds

        rows = []
        for path in spec_paths(ops or [], all_specs=not ops):
            spec = load_spec(path)
            if not spec.sources:
                rows.append((spec.op, "-", "no sources (pure Python)"))
                continue
            plan = spec_build_plan(spec, detect_toolchain(cuda_arch))
            if require_cuda and plan.skipped_sources:
                raise BuildError(spec.name, plan.log, [f"CUDA sources left out: {plan.toolchain.skip_reason}"])
            with out.spinner(f"building {spec.name}"):
                result = build(plan, on_step=out.info)
            status = f"cached ({result.seconds:.2f} s)" if result.cached else f"built in {result.seconds:.1f} s"
            if result.plan.skipped_sources:
                status += (
                    f"; left out {', '.join(s.name for s in result.plan.skipped_sources)}: "
                    f"{result.plan.toolchain.skip_reason}"
                )
            rows.append((spec.op, str(result.plan.library), status))
        render_builds(rows)
        return EXIT_OK

    guarded(body)
