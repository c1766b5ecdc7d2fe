"""The terminal format of `opforge scan`: one table, a row per op, short enough for 80 columns; a flagged op's row
starts with `!` and its flagged cell says what is missing; after the table, what each flag means and its fix."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from opforge.reporters.console import console
from opforge.tools.scan import CEA, CIA, REGISTER_FAKE, TRIVIAL_FAKE, FlagKind, Scan, ScannedOp

FLAG_STYLE = "bold red"

# What each flag says, once, under the table: (the cell it marks, what it means, what to do).
EXPLAINED = {
    FlagKind.NO_FAKE: (
        "fake NONE",
        "no fake kernel (no register_fake, Meta or composite kernel): torch.compile, torch.export and FakeTensor "
        "cannot trace it",
        "Add torch.library.register_fake (in C++: a Meta kernel, or m.impl_abstract_pystub naming the module that "
        "registers one).",
    ),
    FlagKind.CUDA_WITHOUT_CPU: (
        "CPU NONE",
        "a CUDA kernel and no CPU or composite one: CPU tensors reach no kernel (where an Autograd kernel handles "
        "them: under torch.inference_mode)",
        "Add a CPU kernel, or document the op as CUDA-only.",
    ),
    FlagKind.UNDECLARED_MUTATION: (
        "writes NONE",
        "looks like it writes an argument (named in-place or out, an out argument, no return value) but its "
        "schema marks none written: read from the name and schema, not by running it (opcheck does)",
        "Mark the write, Tensor(a!) x, or rename the op.",
    ),
}


def _source(source: str | None) -> str:
    """A kernel's source, short: y (its own kernel), CIA/CEA (a composite kernel), fake, Meta, - (none)."""
    if source is None:
        return "-"
    return {
        CIA: "CIA",
        CEA: "CEA",
        REGISTER_FAKE: "fake",
        TRIVIAL_FAKE: "auto",
        "Meta": "Meta",
        "AutogradCPU": "CPU",
    }.get(source, "CUDA" if source == "AutogradCUDA" else "y")


def _flagged(text: str, flagged: bool) -> Text:
    return Text(text, style=FLAG_STYLE) if flagged else Text(text)


def _writes_cell(op: ScannedOp) -> Text:
    """The argument the schema marks written (or how many), and aliased ones as `view x`; NONE when flagged."""
    if op.flagged(FlagKind.UNDECLARED_MUTATION):
        return _flagged("NONE", True)
    if op.schema is None:
        return Text("no schema")

    def named(names: tuple[str, ...]) -> str:
        return names[0] if len(names) == 1 else f"{len(names)} args"

    parts = [named(op.writes)] if op.writes else []
    parts += [f"view {named(op.aliases)}"] if op.aliases else []
    return Text("; ".join(parts) or "-")


def _spec_cell(op: ScannedOp) -> str:
    if not op.specs:
        return "-"
    ran = [c for c in op.specs if c.results is not None]
    if not ran:
        return "not run"
    results = sum(c.results or 0 for c in ran)
    failed = sum(c.failed or 0 for c in ran)
    return f"{failed}/{results} fail" if failed else f"{results} ok"


def render_scan(scan: Scan) -> None:
    flagged = len(scan.flagged)
    title = f"opforge scan {scan.namespace}: {len(scan.ops)} ops, {flagged} flagged"
    table = Table(
        title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold"
    )
    table.add_column("", no_wrap=True, style=FLAG_STYLE)
    table.add_column("op", overflow="fold", ratio=1)
    for name in ("CPU", "CUDA", "fake", "grad", "vmap"):
        table.add_column(name, no_wrap=True)
    table.add_column("writes", overflow="fold", max_width=14)
    with_specs = scan.specs_dir is not None
    if with_specs:
        table.add_column("spec", no_wrap=True)
    for op in scan.ops:
        no_cpu = op.flagged(FlagKind.CUDA_WITHOUT_CPU)
        no_fake = op.flagged(FlagKind.NO_FAKE)
        cells: list[str | Text] = [
            "!" if op.flags else "",
            op.short_name,
            _flagged("NONE" if no_cpu else _source(op.cpu), no_cpu),
            _source(op.cuda),
            _flagged("NONE" if no_fake else _source(op.fake), no_fake),
            _source(op.autograd),
            _source(op.vmap),
            _writes_cell(op),
        ]
        if with_specs:
            cells.append(_spec_cell(op))
        table.add_row(*cells)
    console.print(table)
    console.print(
        Text(
            "y: its own kernel; CIA, CEA: its CompositeImplicitAutograd, CompositeExplicitAutograd kernel; fake: "
            "register_fake; Meta: a Meta kernel; auto: FakeTensor needs none (no return, or tagged out/inplace); "
            "grad CPU, CUDA: for that device only; writes: the argument (or how many) its schema marks written, "
            "Tensor(a!), and aliased (view)"
            + ("; spec: results of the specs' last `opforge check` here" if with_specs else ""),
            style="dim",
        )
    )
    for kind, (cell, meaning, fix) in EXPLAINED.items():
        count = scan.count(kind)
        if count:
            console.print(
                Text(f"! {cell} ({count} op{'s' if count != 1 else ''}): ", style=FLAG_STYLE)
                + Text(f"{meaning}. {fix}")
            )
            for line in _details(scan, kind):
                console.print(Text(f"  {line}"))
    if scan.unreadable_specs:
        console.print(Text(f"not read (not YAML): {', '.join(scan.unreadable_specs)}", style="yellow"))
    covered = sum(1 for op in scan.ops if op.specs)
    summary = [f"{kind.value} {scan.count(kind)}" for kind in FlagKind]
    spec_note = f"; {covered} named by a spec in {scan.specs_dir}" if with_specs else ""
    console.print(
        Text(
            f"{len(scan.ops)} ops, {flagged} flagged ({', '.join(summary)}){spec_note}; "
            f"scanned in {scan.scan_seconds:.2f} s (imports {scan.import_seconds:.2f} s)",
            style=FLAG_STYLE if flagged else "bold green",
        )
    )


def _details(scan: Scan, kind: FlagKind) -> list[str]:
    """The flag's own words per op where they add to the table: why each op looks mutating; which module a C++
    op names for its fake kernel (grouped: a library has dozens)."""
    messages = [(op.short_name, f.message) for op in scan.ops for f in op.flags if f.kind == kind]
    if kind == FlagKind.UNDECLARED_MUTATION:
        return [f"{name}: {message.partition('; ')[0]}" for name, message in messages]
    if kind == FlagKind.NO_FAKE:
        grouped: dict[str, int] = {}
        for _, message in messages:
            for note in message.split("; ")[1:]:
                grouped[note] = grouped.get(note, 0) + 1
        return [f"{count} of them: {note}" for note, count in grouped.items()]
    return []
