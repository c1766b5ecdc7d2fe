"""The one module that owns the rich Consoles (stdout and stderr) and the plain messages every command prints.

Readable without a TTY (CI logs): no live redraws, a fixed width, and NO_COLOR honoured (rich reads it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text

# Width used when stdout is not a terminal, so CI logs do not wrap the tables at rich's default 80 columns.
LOG_WIDTH = 140
# Seconds between progress lines when there is no terminal to draw a bar or spinner on (a CI log): often enough that
# a log shows a minutes-long compile is alive, rarely enough that a 30-minute run prints at most ~180 of them.
HEARTBEAT_S = 10.0


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


class Heartbeat:
    """Without a terminal: a line every `interval` seconds while a step runs, `... <describe()> (<elapsed> s)`, from
    a thread of its own, so a single long call (a compile, a slow reference) shows too. On a terminal it prints
    nothing: the spinner or the bar shows progress there."""

    def __init__(self, describe: Callable[[], str], interval: float = HEARTBEAT_S):
        self._describe = describe
        self._interval = interval
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        if not console.is_terminal and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="opforge-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _beat(self) -> None:
        start = time.monotonic()
        while not self._stopped.wait(self._interval):
            console.print(Text(f"... {self._describe()} ({time.monotonic() - start:.0f} s)"))


@contextmanager
def spinner(message: str) -> Iterator[None]:
    if console.is_terminal:
        with console.status(message):
            yield
    else:
        console.print(message)
        with Heartbeat(lambda: f"still {message}"):
            yield
