"""The terminal format of `opforge build`: one row per op, its library and whether it was built or found cached."""

from __future__ import annotations

from rich.table import Table

from opforge.reporters.console import console


def render_builds(rows: list[tuple[str, str, str]]) -> None:
    table = Table(title="opforge build", title_justify="left")
    table.add_column("op", no_wrap=True)
    table.add_column("library", overflow="fold")
    table.add_column("status")
    for row in rows:
        table.add_row(*row)
    console.print(table)
