"""The terminal format of `opforge doctor`: one line per finding, its fix under it."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from opforge.reporters.console import console
from opforge.tools.doctor import Diagnosis, Level

STYLES = {Level.OK: "green", Level.INFO: "cyan", Level.WARN: "yellow", Level.FAIL: "bold red"}


def render_diagnosis(diagnosis: Diagnosis) -> None:
    table = Table(title="opforge doctor", title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("level", no_wrap=True)
    table.add_column("topic", no_wrap=True, style="bold")
    table.add_column("found", overflow="fold", ratio=1)
    for finding in diagnosis.findings:
        found = Text(finding.found)
        if finding.fix and finding.level != Level.OK:
            found.append(f"\nfix: {finding.fix}", style=STYLES[finding.level])
        table.add_row(Text(finding.level.value.upper(), style=STYLES[finding.level]), finding.topic, found)
    console.print(table)
    failed = [f.topic for f in diagnosis.findings if f.level == Level.FAIL]
    if failed:
        console.print(Text(f"FAIL: {', '.join(failed)}: the bundled ops cannot be built or run here", style="bold red"))
    else:
        console.print(Text("OK: this machine can build and run the bundled ops", style="bold green"))
