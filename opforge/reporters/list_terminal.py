"""The terminal format of `opforge list`: the bundled specs, one row each."""

from __future__ import annotations

from rich.table import Table

from opforge.reporters.console import console


def render_spec_list(rows: list[tuple[str, str, str]]) -> None:
    table = Table(title="opforge specs", title_justify="left")
    # Names fold onto a second line at 80 columns rather than end in "…": a cut name cannot be typed back.
    for name in ("op", "spec"):
        table.add_column(name, overflow="fold")
    table.add_column("description")
    for row in rows:
        table.add_row(*row)
    console.print(table)
