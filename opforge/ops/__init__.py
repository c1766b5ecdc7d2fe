"""The bundled operators. Importing a module builds (first time only) and loads its kernels."""

from __future__ import annotations

from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def native_sources(stem: str) -> tuple[Path, ...]:
    """The C++ source of an op and its CUDA source when there is one (built only where CUDA can be compiled)."""
    candidates = (CSRC / f"{stem}.cpp", CSRC / "cuda" / f"{stem}.cu")
    return tuple(p for p in candidates if p.exists())


def load_native(
    stem: str,
    *,
    include_dirs: tuple[str | Path, ...] = (),
    libraries: tuple[str | Path, ...] = (),
    extra_cflags: tuple[str, ...] = (),
) -> None:
    """Build and load an op's kernels; the options as in opforge.building.extension.plan_build (an op wrapping an
    external library names it in `libraries`). A spec that lists the same sources must give the same options, or it
    builds a second library that registers the op again."""
    from opforge.building.extension import build_sources

    build_sources(native_sources(stem), include_dirs=include_dirs, libraries=libraries, extra_cflags=extra_cflags)
