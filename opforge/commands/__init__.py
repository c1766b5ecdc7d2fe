"""The command line, a module per command, named after it (opforge.commands.app holds what they share). Commands are
thin: parse, call the library, render, map errors to exit codes.

Exit codes (defined in opforge.core.errors): 0 all passed (skip and xfail allowed), 1 a check failed, 2 bad usage or a
bad spec, 3 a build failed, 4 an internal error (a bug in opforge: rerun with --debug and report it), 130 interrupted
(Ctrl-C or SIGTERM; the reports written are marked incomplete), 5 nothing was checked (or timed): never a pass.
When several ops run, the highest of 3, 2 and 1 that applies.
"""

from __future__ import annotations

from opforge.commands.app import app

# Importing a command's module registers it with the app, in this order in `opforge --help`: the main job first.
# isort: off
from opforge.commands import check, fuzz, record, list, build, bench, profile, merge, new, doctor, scan
# isort: on

__all__ = [
    "app",
    "bench",
    "build",
    "check",
    "doctor",
    "fuzz",
    "list",
    "main",
    "merge",
    "new",
    "profile",
    "record",
    "scan",
]


def main() -> None:
    app()
