"""The bundled operators. Importing a module builds (first time only) and loads its kernels."""

from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def native_sources(stem: str) -> tuple[Path, ...]:
    """The C++ source of an op and its CUDA source when there is one (built only where CUDA can be compiled)."""
    candidates = (CSRC / f"{stem}.cpp", CSRC / "cuda" / f"{stem}.cu")
    return tuple(p for p in candidates if p.exists())


def load_native(stem: str) -> None:
    from opforge.build import build_sources

    build_sources(native_sources(stem))
