"""`opforge fuzz`'s output: the live line while it searches, each failure with its minimal example and a repro
command, and the --json form."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.text import Text

from opforge.cases.matrix import offset_of
from opforge.core.files import write_atomically
from opforge.core.results import Status, Verdict, dumps_json
from opforge.engine.events import Events
from opforge.fuzz.save import repro_command
from opforge.fuzz.search import MIN_JUDGED, Failure, FuzzReport
from opforge.fuzz.verdict import OUTSIDE_DOMAIN, TOO_COSTLY, UNDECIDABLE
from opforge.reporters import console as out
from opforge.reporters.base import Reporter
from opforge.spec.model import Regression


class Live(Events):
    """The search's progress, subscribed to the run's events: on a terminal one status line redrawn (examples,
    failures, rejected, time left); without one a heartbeat line every few seconds."""

    def __init__(self) -> None:
        self._line = "starting the worker (and building the op)"
        self._status: Any = None

    def progress(self, report: FuzzReport, seconds_left: float) -> None:
        self._line = (
            f"{report.examples} examples, {report.judged} judged, {len(report.failures)} failures so far, "
            f"{max(0.0, seconds_left):.0f} s left"
        )
        if self._status is not None:
            self._status.update(self._line)

    @contextmanager
    def shown(self) -> Iterator[Live]:
        if out.console.is_terminal:
            with out.console.status(self._line) as status:
                self._status = status
                yield self
        else:
            with out.Heartbeat(lambda: self._line):
                yield self


def render_fuzz(report: FuzzReport) -> None:
    console = out.console
    for failure in report.failures:
        _render_failure(report, failure)
    summary = (
        f"{report.op}: {report.examples} examples on {report.device} in {report.seconds:.0f} s "
        f"({', '.join(report.oracles)}), {report.judged} judged"
    )
    console.print(Text(summary))
    for cause, discards in report.discards.items():
        console.print(Text(f"note: {discards.count} discarded, {cause} (first: {_first_line(discards.first)})"))
    if report.op_rejects:
        console.print(
            Text(
                f"note: the op refused {report.op_rejects} calls its reference accepted (a narrower domain; "
                f"first: {_first_line(report.first_reject)})",
                style="dim",
            )
        )
    if report.known:
        console.print(
            Text(
                f"note: {report.known} examples failed as the spec's xfail entries declare "
                f"(first: {_first_line(report.first_known)})",
                style="dim",
            )
        )
    if report.failures:
        console.print(Text(f"{len(report.failures)} distinct failure(s) found", style="bold red"))
    elif report.judged_too_few:
        console.print(Text(_too_few(report), style="bold red"))
    else:
        console.print(Text("no failure found", style="bold green"))


def _too_few(report: FuzzReport) -> str:
    """Why a search that judged too few examples means nothing, with the commonest reason the rest were not judged
    and what to do about it."""
    reasons = [(d.count, cause, d.first) for cause, d in report.discards.items()]
    if report.op_rejects:
        reasons.append((report.op_rejects, "refused by the op", report.first_reject))
    if reasons:
        count, cause, first = max(reasons)
        why = f"{count} {cause} (first: {_first_line(first)})"
    else:
        cause, why = "", "the search ended first"
    return (
        f"nothing meaningful was checked: expected at least {MIN_JUDGED} judged examples and a tenth of those "
        f"drawn, got {report.judged} of {report.examples}; {why}. {_TOO_FEW_HINTS.get(cause, _MORE_BUDGET)}"
    )


_MORE_BUDGET = "Give the search more time (--budget) or more examples (--max-examples)."
# What to do when most examples were not judged, by the reason.
_TOO_FEW_HINTS = {
    OUTSIDE_DOMAIN: "Make the spec's inputs valid calls of the reference (low/high, a generator, samples).",
    TOO_COSTLY: (
        "Lower --max-numel; if every call is slow, check that the op and its samples or generators do not hang "
        "in a forked process."
    ),
    UNDECIDABLE: "Fuzz in a wider dtype (the spec's dtypes), or narrow the inputs' range (low/high).",
    "refused by the op": "Make the spec's inputs calls the op accepts, or its reference refuse what the op does.",
}


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _render_failure(report: FuzzReport, failure: Failure) -> None:
    console = out.console
    example = failure.example
    cause = f": {failure.verdict.cause}" if failure.verdict.cause else ""
    console.print(Text(f"FAIL {report.op} {failure.oracle}{cause}", style="bold red"))
    console.print(Text(f"  {failure.message}"))
    console.print(Text(f"  minimal example: {_described(example)}"))
    if failure.first != example:
        console.print(Text(f"  shrunk from example {failure.found_at}: {_described(failure.first)}", style="dim"))
    values = ", ".join(f"{name}={value!r}" for name, value in example.values)
    rule = example.fill or "as the spec samples them"
    console.print(Text(f"  values: {rule}{'; ' + values if values else ''}; seed {example.seed}"))
    console.print(Text(f"  repro: {repro_command(report.spec_path, example)}", style="dim"), soft_wrap=True)


def _described(example: Regression) -> str:
    shapes = ", ".join(f"{name}={list(shape)}" for name, shape in example.shapes) or f"sample {example.sample}"
    fill = f", fill {example.fill}" if example.fill else ""
    return f"{example.dtype} on {example.device}, {shapes}, layout {example.layout}{fill}"


def render_replay(verdict: Verdict, oracles: tuple[str, ...]) -> None:
    console = out.console
    if verdict.status == Status.FAIL:
        cause = f" ({verdict.cause})" if verdict.cause else ""
        console.print(Text(f"FAIL {verdict.oracle}{cause}: {verdict.message}", style="bold red"))
    elif verdict.status == Status.PASS:
        console.print(Text(f"pass ({', '.join(oracles)})", style="green"))
    elif verdict.status == Status.XFAIL:
        console.print(Text(f"known {verdict.oracle}: {verdict.message}", style="yellow"))
    else:
        what = verdict.cause if verdict.status == Status.DISCARD else "the op refused it"
        console.print(Text(f"{verdict.status.value}: {what}: {verdict.message}; nothing judged"))


def fuzz_json(report: FuzzReport) -> dict[str, Any]:
    return {
        "tool": "opforge",
        "kind": "fuzz",
        "op": report.op,
        "spec": str(report.spec_path),
        "device": report.device,
        "oracles": list(report.oracles),
        "failures": [_failure_json(report, f) for f in report.failures],
        "examples": report.examples,
        "judged": report.judged,
        "judged_too_few": report.judged_too_few,
        "rejected": report.rejected,
        "discards": {cause: {"count": d.count, "first": d.first} for cause, d in report.discards.items()},
        "op_rejects": report.op_rejects,
        "known": report.known,
        "seconds": round(report.seconds, 3),
    }


def _failure_json(report: FuzzReport, failure: Failure) -> dict[str, Any]:
    example = failure.example
    return {
        "check": failure.oracle,
        "cause": failure.verdict.cause,
        "message": failure.message,
        "shapes": {name: list(shape) for name, shape in example.shapes},
        "sample": example.sample,
        "dtype": example.dtype,
        "device": example.device,
        "layout": example.layout,
        "offset": offset_of(example.layout),
        "values": example.fill or "spec",
        "arguments": dict(example.values),
        "seed": example.seed,
        "mismatch": asdict(failure.verdict.mismatch) if failure.verdict.mismatch else None,
        "repro": repro_command(report.spec_path, example),
    }


class FuzzJsonReport(Reporter):
    """`opforge fuzz --json`: its results in the form of `opforge check --json` (what `merge-reports` reads), with
    the search's own account (each failure's example, the counts of what was judged and discarded) beside them."""

    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: FuzzReport) -> None:
        write_atomically(self.path, dumps_json({**run.run_report().to_json(), **fuzz_json(run)}))
