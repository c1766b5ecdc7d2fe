"""memcheck, racecheck, initcheck, synccheck (CUDA, opt-in with `opforge check --sanitize TOOLS`): the op's CUDA
cases run in a child process under NVIDIA's compute-sanitizer, each report a FAIL.

Reads and writes past a buffer's end that happen to land in memory the process owns give right results: only
memcheck sees them, and only with PyTorch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: each tensor its
own exact-size allocation; inside a cached 2 MiB segment an overrun is invisible). A shared-memory reduction
missing a __syncthreads() is usually right by luck: racecheck reports the hazard. An output a kernel leaves partly
unwritten: initcheck reports the read of it (opforge copies every output to the host, a consumer's read). synccheck:
barriers in divergent code.

One child per tool runs a representative set of the op's CUDA cases (every claimed floating dtype and shape,
contiguous and at an offset, first argument values; the gradients too for a differentiable op). It speaks the
protocol of every child (opforge.core.protocol): its SanitizeJob on stdin, and a CaseStarted event before each case
saying how much output the tool had written by then, so each report is blamed on its case. Its events go to a
channel file of their own, which compute-sanitizer's output (on the child's stdout and stderr) cannot reach; the
tool's output, with a marker line put back before each case's reports, is the log a user reads. The op's sources
are built with -lineinfo in the child, so a report names the source line. Cost: a child start (import, CUDA context
under the tool) of tens of seconds per tool, the cases themselves in milliseconds (racecheck: seconds).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from opforge.building.op import Implementation, LoadedOp
from opforge.cases.matrix import Case
from opforge.checks.base import Check, CheckContext, CheckOption, OptIn, OptIns, Outcomes, Runner
from opforge.core.child import entry_point, with_this_opforge
from opforge.core.errors import UsageError
from opforge.core.outcomes import CheckFailure, CheckSkipped, ReferenceFailure
from opforge.core.protocol import CaseRaised, CaseStarted, Message, SanitizeJob, decode_stream
from opforge.spec.model import FLOATING_DTYPES, layout_kind

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# Each tool's own flags. memcheck: an error destroys only the faulting kernel, not the context, so later cases still
# run and report; racecheck: warnings (warp-level hazards) are reported too.
TOOL_FLAGS = {
    "memcheck": ("--destroy-on-device-error", "kernel"),
    "racecheck": ("--racecheck-detect-level", "warn"),
    "initcheck": (),
    "synccheck": (),
}
# Reports printed in full per run: a kernel with no bounds check reports every out-of-bounds thread.
PRINT_LIMIT = 20
# Distinct reports shown in a failure message, and the cases named for each.
SHOWN_REPORTS = 3
SHOWN_CASES = 3
# The child's limit when no task limit applies: it imports torch, starts CUDA under the tool and runs some dozens of
# cases; racecheck slows kernels by 10-100x.
CHILD_TIMEOUT_S = 600
# Of the task's own limit, what the parent keeps for itself (see large_index.TASK_MARGIN_S).
TASK_MARGIN_S = 10
# The line put back into the tool's output where each case started (CaseStarted), so that the reports that follow
# are blamed on it; and where the op raised on a case (CaseRaised).
CASE_MARKER = "OPFORGE-SANITIZE-CASE "
RAISED_MARKER = "OPFORGE-SANITIZE-ERROR "
# A report's first line, after the tool's `========= ` prefix.
_REPORT = re.compile(
    r"^========= (?P<what>(Invalid |Uninitialized |Error: |Warning: |Program hit |Barrier |Host API |"
    r"Race |Potential |Memory access )\S.*)$"
)
_LOCATION = re.compile(r"^=========\s+at (?P<where>.+)$")
_HAS_LINE = re.compile(r"\bin \S+:\d+")


@dataclass(frozen=True)
class Report:
    """One compute-sanitizer report: its first line, where (`kernel+0x80 in file.cu:52`), and the case it was in."""

    what: str
    where: str
    case_id: str


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit opforge builds with."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    from opforge.building.extension import find_cuda_home

    home = find_cuda_home()
    candidate = home / "bin" / "compute-sanitizer" if home else None
    return str(candidate) if candidate and candidate.exists() else None


def sanitized_cases(loaded: LoadedOp, implementation: Implementation, cases: list[Case]) -> list[Case]:
    """One result per tool: the first CUDA case stands for the whole set the child runs (sanitize_case_set)."""
    base = next((c for c in cases if c.values_index == 0 and c.layout == "contiguous"), None)
    if base is None or implementation.overload is None:  # a plain Python function launches only PyTorch's own kernels
        return []
    return [replace(base, shapes=(), shape_index=-1, label="all-cases")]


def sanitize_case_set(loaded: LoadedOp) -> list[Case]:
    """The cases the child runs: every claimed floating dtype and shape, contiguous and at an offset (an aligned
    and a misaligned pointer), first argument values, on CUDA."""
    from opforge.cases.matrix import build_matrix

    claimed = loaded.spec.dtypes_on("cuda")
    dtypes = tuple(d for d in claimed if d in FLOATING_DTYPES) or claimed
    matrix = build_matrix(loaded.spec, dtypes, ("cuda",))
    return [c for c in matrix if c.values_index == 0 and layout_kind(c.layout) in ("contiguous", "offset")]


def _run_tool(tool: str) -> Runner:
    def run(ctx: CheckContext, implementation: Implementation, case: Case) -> Outcomes:
        return {tool: sanitize(ctx, implementation, tool)}

    return run


def sanitize(ctx: CheckContext, implementation: Implementation, tool: str) -> CheckFailure | None:
    executable = sanitizer_path()
    if executable is None:
        raise CheckSkipped(
            "compute-sanitizer not found (on PATH, or in the CUDA toolkit's bin/): install the CUDA toolkit's "
            "compute-sanitizer, or put it on PATH"
        )
    loaded = ctx.loaded
    cases = sanitize_case_set(loaded)
    build = loaded.build.plan.toolchain.cuda_archs if loaded.build else ()
    job = SanitizeJob(
        spec=str(loaded.spec.path),
        implementation=implementation.name,
        seed=ctx.base_seed,
        cases=tuple(_case_json(c) for c in cases),
        cuda_arch=";".join(build) or None,
    )
    output, messages, returncode = run_child(executable, tool, job, child_time_limit(ctx.time_limit))
    log = _keep_log(loaded.spec.name, implementation.name, tool, output)
    reports = parse_reports(output)
    if reports:
        return CheckFailure(describe_reports(tool, reports, len(cases), log))
    if not any(isinstance(m, CaseStarted) for m in messages) or returncode not in (0, None):
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise ReferenceFailure(
            f"the {tool} child process ended (exit code {returncode}) without running the cases:\n{tail}"
        )
    return None


def child_time_limit(task_limit: float | None) -> float:
    if task_limit is None:
        return CHILD_TIMEOUT_S
    return min(CHILD_TIMEOUT_S, max(task_limit - TASK_MARGIN_S, task_limit / 2))


def child_command(executable: str, tool: str, channel: Path) -> list[str]:
    """compute-sanitizer running the child, whose one argument is its channel file (its events: see run_child)."""
    return [
        executable,
        "--tool",
        tool,
        *TOOL_FLAGS[tool],
        "--print-limit",
        str(PRINT_LIMIT),
        "--show-backtrace",
        "no",
        *entry_point("opforge.engine.sanitize_child"),
        str(channel),
    ]


def child_env() -> dict[str, str]:
    """The caching allocator off (every tensor its own exact-size allocation, so an overrun leaves it), the op's
    sources built with line info (a report names the line), and this opforge importable."""
    env = with_this_opforge(os.environ)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    env["OPFORGE_EXTRA_CUDA_CFLAGS"] = " ".join(filter(None, (env.get("OPFORGE_EXTRA_CUDA_CFLAGS"), "-lineinfo")))
    return env


def run_child(executable: str, tool: str, job: SanitizeJob, timeout_s: float) -> tuple[str, list[Message], int | None]:
    """The tool's and the child's combined output (the cases' markers put back: marked_output), the child's
    events and its exit code (None: killed at the time limit). The job goes on the child's stdin; its events to a
    channel file, its and the tool's output to another file, whose size the child reads before each case."""
    with tempfile.TemporaryDirectory(prefix="opforge-sanitize-") as tmp:
        channel = Path(tmp) / "channel"
        channel.touch()
        with open(Path(tmp) / "output", "w+b") as output:
            try:
                done = subprocess.run(
                    child_command(executable, tool, channel),
                    input=job.to_line().encode(),
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    timeout=timeout_s,
                    env=child_env(),
                    check=False,
                )
                returncode: int | None = done.returncode
            except subprocess.TimeoutExpired:
                returncode = None
            output.seek(0)
            text = output.read()
        messages, cut = decode_stream(channel.read_bytes())
    marked = marked_output(text, messages)
    if cut.strip():
        marked += f"\n(the child died in the middle of a message to opforge: {cut.strip()[:200]})"
    if returncode is None:
        marked += f"\n(killed after {timeout_s:g} s)"
    return marked, messages, returncode


def marked_output(output: bytes, messages: list[Message]) -> str:
    """The tool's output with a line put back where each case started (CASE_MARKER and its id) and where the op
    raised on one (RAISED_MARKER), at the offsets the child read: what parse_reports blames reports by, and the log."""
    marks = sorted((m.offset, i, _mark(m)) for i, m in enumerate(messages) if isinstance(m, (CaseStarted, CaseRaised)))
    marked, done = bytearray(), 0
    for offset, _, line in marks:
        at = max(done, min(offset, len(output)))
        marked += output[done:at]
        if marked and not marked.endswith(b"\n"):
            marked += b"\n"  # a line the tool had not ended yet: the marker goes on a line of its own
        marked += line.encode() + b"\n"
        done = at
    marked += output[done:]
    return marked.decode("utf-8", "replace")


def _mark(message: CaseStarted | CaseRaised) -> str:
    if isinstance(message, CaseStarted):
        return CASE_MARKER + message.case_id
    return f"{RAISED_MARKER}{message.case_id} raised {message.message}"


def parse_reports(output: str) -> list[Report]:
    """The tool's reports in the child's output, each blamed on the case whose marker came last before it."""
    reports: list[Report] = []
    case_id = "before the first case (loading the op)"
    pending: tuple[str, str] | None = None
    for line in output.splitlines():
        if line.startswith(CASE_MARKER):
            case_id = line[len(CASE_MARKER) :].strip()
            continue
        start = _REPORT.match(line)
        if start:
            if pending:
                reports.append(Report(pending[0], "", pending[1]))
            pending = (start.group("what").strip(), case_id)
            continue
        location = _LOCATION.match(line)
        if location and pending:
            reports.append(Report(pending[0], location.group("where").strip(), pending[1]))
            pending = None
    if pending:
        reports.append(Report(pending[0], "", pending[1]))
    return reports


def _keep_log(op: str, implementation: str, tool: str, output: str) -> Path:
    """The tool's whole output, kept where a user can read every report (the last run of each op, implementation
    and tool)."""
    from opforge.building.extension import cache_root

    path = cache_root() / "sanitize" / f"{op}-{implementation}-{tool}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(output)
    return path


def describe_reports(tool: str, reports: list[Report], case_count: int, log: Path) -> str:
    cases = list(dict.fromkeys(r.case_id for r in reports))
    # A kernel without a bounds check reports once per faulting thread: one line per distinct report and place.
    groups: dict[tuple[str, str], list[str]] = {}
    for r in reports:
        groups.setdefault((r.what, r.where), []).append(r.case_id)
    shown = "\n".join(_describe_group(what, where, ids) for (what, where), ids in list(groups.items())[:SHOWN_REPORTS])
    left = len(groups) - SHOWN_REPORTS
    more = f"\n(and {left} more distinct report(s))" if left > 0 else ""
    hint = (
        ""
        if any(_HAS_LINE.search(r.where) for r in reports if r.where)
        else "\nNo source lines in the reports: build the op's CUDA sources with -lineinfo (opforge does for the "
        "sources a spec lists)."
    )
    return (
        f"{tool}: {len(reports)} report(s) in {len(cases)} of {case_count} CUDA cases under compute-sanitizer "
        f"(caching allocator off):\n{shown}{more}{hint}\nThe tool's whole output: {log}"
    )


def _describe_group(what: str, where: str, case_ids: list[str]) -> str:
    times = f"{len(case_ids)}x " if len(case_ids) > 1 else ""
    at = f" at {where}" if where else ""
    distinct = list(dict.fromkeys(case_ids))
    named = ", ".join(distinct[:SHOWN_CASES]) + (
        f" and {len(distinct) - SHOWN_CASES} more" if len(distinct) > SHOWN_CASES else ""
    )
    return f"- {times}{what}{at} (case{'s' if len(distinct) > 1 else ''} {named})"


def _case_json(case: Case) -> dict[str, Any]:
    data = asdict(case)
    data["shapes"] = [[name, list(shape)] for name, shape in case.shapes]
    data["values"] = [[name, value] for name, value in case.values]
    return data


def _asked(tool: str) -> Callable[[OptIns], bool]:
    def asked(opt_ins: OptIns) -> bool:
        return tool in opt_ins.get(SANITIZE.name, ())

    return asked


def parse_tools(text: str) -> tuple[str, ...]:
    """`--sanitize memcheck,racecheck` or `--sanitize all`."""
    tools = TOOLS if text.strip() == "all" else tuple(t.strip() for t in text.split(",") if t.strip())
    for tool in tools:
        if tool not in TOOLS:
            raise UsageError("--sanitize", f"one of {', '.join(TOOLS)} or all", repr(tool), "Fix the --sanitize value.")
    return tools


SANITIZE = CheckOption(
    "sanitize",
    "Also run the op's CUDA cases under compute-sanitizer with these tools: memcheck, racecheck, initcheck, "
    "synccheck (comma-separated), or all.",
    metavar="TOOLS",
    parse=parse_tools,
)


CHECKS = tuple(
    Check(
        tool,
        f"the op's CUDA cases under compute-sanitizer --tool {tool} (opt-in: --sanitize {tool})",
        sanitized_cases,
        _run_tool(tool),
        devices=("cuda",),
        opt_in=OptIn(_asked(tool)),
        rerun_flags=(SANITIZE.flag, tool),
        options=(SANITIZE,),
    )
    for tool in TOOLS
)
