"""`opforge list`: the bundled specs."""

from __future__ import annotations

from opforge.commands.app import app, guarded
from opforge.core.errors import EXIT_OK
from opforge.loading.spec import list_specs, load_spec


@app.command("list")
def list_() -> None:
    """List the bundled op specs."""

    def body() -> int:
        from opforge.reporters.list_terminal import render_spec_list

        rows = []
        for path in list_specs():
            spec = load_spec(path)
            rows.append((spec.op, str(path.name), spec.description.strip().splitlines()[0] if spec.description else ""))
        render_spec_list(rows)
        return EXIT_OK

    guarded(body)
