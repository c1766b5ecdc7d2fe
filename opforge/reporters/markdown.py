"""The Markdown format of `opforge check` and `opforge fuzz`: a compact account of a run, for a CI job summary or
a pull-request comment (`--markdown "$GITHUB_STEP_SUMMARY"`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.core.results import RunReport, Status, failure_details
from opforge.reporters.base import Reporter, as_results

# Failures listed in full; a CI summary should stay readable, the JSON/JUnit reports hold the rest.
MAX_FAILURES = 30
# Lines of a failure's message kept (a crash's message carries a stderr tail).
MAX_MESSAGE_LINES = 12
_COLUMNS = (
    Status.PASS,
    Status.FAIL,
    Status.ERROR,
    Status.CRASH,
    Status.TIMEOUT,
    Status.XPASS,
    Status.XFAIL,
    Status.SKIP,
)


class MarkdownReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: Any) -> None:
        write_atomically(self.path, render_markdown(as_results(run)))


def render_markdown(run: RunReport) -> str:
    counts = run.counts()
    verdict = "FAILED" if run.failed else "NOTHING RAN" if run.nothing_ran else "OK"
    if run.incomplete:
        verdict += " (incomplete: interrupted)"
    torch = run.environment.get("torch", "?")
    totals = ", ".join(f"{counts[s.value]} {s.value}" for s in Status if counts[s.value]) or "nothing ran"
    lines = [
        f"## opforge: {verdict}",
        "",
        f"{totals} in {run.seconds:.1f} s (torch {torch}, seed {run.seed})",
        "",
        *(f"> note: {note}\n" for note in run.notes),
        "| op | " + " | ".join(s.value for s in _COLUMNS) + " | seconds |",
        "|---|" + "---:|" * (len(_COLUMNS) + 1),
    ]
    for op in run.ops:
        op_counts = op.counts()
        mark = "❌" if op.failed else "✅"
        lines.append(
            f"| {mark} {op.op} | " + " | ".join(_count(op_counts[s.value]) for s in _COLUMNS) + f" | {op.seconds:.1f} |"
        )
    failures = [r for r in run.results() if r.status.failed]
    if failures:
        lines += ["", "### Failures", ""]
    for r in failures[:MAX_FAILURES]:
        lines.append(f"**{r.status.value.upper()}** `{r.full_id}`")
        lines.append("")
        detail, repro = [], []
        for kind, text in failure_details(r):
            if kind == "message":
                detail += text.splitlines()[:MAX_MESSAGE_LINES]
            elif kind == "repro":
                repro = [f"repro: `{text}`"]
            else:
                detail.append(f"warning: {text}" if kind == "warning" else text)
        if detail:
            lines += ["```text", *(line.replace("```", "'''") for line in detail), "```"]
        lines += [*repro, ""]
    if len(failures) > MAX_FAILURES:
        lines.append(f"... and {len(failures) - MAX_FAILURES} more failures: see the JSON or JUnit report.")
    return "\n".join(lines).rstrip() + "\n"


def _count(n: int) -> str:
    return str(n) if n else "·"
