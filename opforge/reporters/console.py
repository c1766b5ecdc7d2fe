"""The one module that owns the rich Consoles (stdout and stderr) and the plain messages every command prints.

Readable without a TTY (CI logs): no live redraws, a fixed width, and NO_COLOR honoured (rich reads it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text

# Width used when stdout is not a terminal, so CI logs do not wrap the tables at rich's default 80 columns.
LOG_WIDTH = 140


def _make_console(stderr: bool = False) -> Console:
    interactive = Console(stderr=stderr).is_terminal
    width = None if interactive or os.environ.get("COLUMNS") else LOG_WIDTH
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)


console = _make_console()


err_console = _make_console(stderr=True)


def error(message: str) -> None:
    err_console.print(Text("error: ", style="bold red") + Text(message))


def info(message: str) -> None:
    console.print(message)


def warning(message: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(message))


@contextmanager
def spinner(message: str) -> Iterator[None]:
    if console.is_terminal:
        with console.status(message):
            yield
    else:
        console.print(message)
        yield
