"""`opforge fuzz`'s output: the live line while it searches, each failure with its minimal example and a repro
command, and the --json form."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.text import Text

from opforge.cases import offset_of
from opforge.files import write_atomically
from opforge.fuzz.search import Failure, FuzzReport
from opforge.fuzz.verdict import Verdict
from opforge.reporters import console as out
from opforge.results import dumps_json
from opforge.spec.model import Regression


def example_json(example: Regression) -> dict[str, Any]:
    """An example as `--example` takes it and `regressions:` keeps it."""
    data: dict[str, Any] = {
        "dtype": example.dtype,
        "device": example.device,
        "layout": example.layout,
    }
    if example.sample is not None:
        data["sample"] = example.sample
    else:
        data["shapes"] = {name: list(shape) for name, shape in example.shapes}
    if example.values:
        data["values"] = dict(example.values)
    if example.fill:
        data["fill"] = example.fill
    data["seed"] = example.seed
    return data


def repro_command(spec_path: Path, example: Regression) -> str:
    return shlex.join(["opforge", "fuzz", str(spec_path), "--example", json.dumps(example_json(example))])


class Live:
    """The search's progress: on a terminal one status line redrawn (examples, failures, rejected, time left);
    without one a heartbeat line every few seconds."""

    def __init__(self) -> None:
        self._line = "starting the worker (and building the op)"
        self._status: Any = None

    def update(self, report: FuzzReport, seconds_left: float) -> None:
        failures = len({f.key for f in report.failures})
        self._line = (
            f"{report.examples} examples, {failures} failures so far, {report.rejected} rejected, "
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
        f"({', '.join(report.oracles)}), {report.rejected} outside the reference's domain"
    )
    console.print(Text(summary))
    if report.op_rejects:
        console.print(
            Text(
                f"note: the op refused {report.op_rejects} calls its reference accepted (a narrower domain; "
                f"first: {report.first_reject.splitlines()[0]})",
                style="dim",
            )
        )
    if report.known:
        console.print(
            Text(
                f"note: {report.known} examples failed as the spec's xfail entries declare "
                f"(first: {report.first_known.splitlines()[0]})",
                style="dim",
            )
        )
    if report.failures:
        console.print(Text(f"{len(report.failures)} distinct failure(s) found", style="bold red"))
    else:
        console.print(Text("no failure found", style="bold green"))


def _render_failure(report: FuzzReport, failure: Failure) -> None:
    console = out.console
    example = failure.example
    console.print(Text(f"FAIL {report.op} {failure.oracle}", style="bold red"))
    console.print(Text(f"  {failure.message}"))
    shapes = ", ".join(f"{name}={list(shape)}" for name, shape in example.shapes) or f"sample {example.sample}"
    console.print(Text(f"  minimal example: {example.dtype} on {example.device}, {shapes}, layout {example.layout}"))
    values = ", ".join(f"{name}={value!r}" for name, value in example.values)
    rule = example.fill or "as the spec samples them"
    console.print(Text(f"  values: {rule}{'; ' + values if values else ''}; seed {example.seed}"))
    console.print(Text(f"  repro: {repro_command(report.spec_path, example)}", style="dim"), soft_wrap=True)


def render_replay(verdict: Verdict, oracles: tuple[str, ...]) -> None:
    console = out.console
    if verdict.status == "fail":
        console.print(Text(f"FAIL {verdict.oracle}: {verdict.message}", style="bold red"))
    elif verdict.status == "pass":
        console.print(Text(f"pass ({', '.join(oracles)})", style="green"))
    elif verdict.status == "known":
        console.print(Text(f"known {verdict.oracle}: {verdict.message}", style="yellow"))
    else:
        what = "the reference refused it" if verdict.status == "discard" else "the op refused it"
        console.print(Text(f"{verdict.status}: {what}: {verdict.message}"))


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
        "rejected": report.rejected,
        "op_rejects": report.op_rejects,
        "known": report.known,
        "seconds": round(report.seconds, 3),
    }


def _failure_json(report: FuzzReport, failure: Failure) -> dict[str, Any]:
    example = failure.example
    return {
        "check": failure.oracle,
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


def write_fuzz_json(path: Path, report: FuzzReport) -> None:
    write_atomically(path, dumps_json(fuzz_json(report)))
