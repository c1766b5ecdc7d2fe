"""Writing report files: atomically (a reader never sees half a report), with the mode a plain open() would give,
and proved writable before a run whose report would otherwise be lost at its end."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp creates the file 0600 whatever the umask: a report is for others (a CI upload, a team) to read,
        # so it gets the mode a plain open() would have given it.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    # The only way to read it is to set it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: Path) -> None:
    """Create `path`'s directory and prove a file can be written there, before a run whose report would otherwise
    be lost at its end. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory", str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    os.unlink(tmp)
