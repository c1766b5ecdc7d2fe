"""The child process of an isolated run (see opforge.isolation): load one op, run its planned rows from a given
index on, and stream what happens to the parent as JSON lines.

Started by opforge.isolation (see _WORKER_BOOTSTRAP there) with the job as one JSON line on stdin. The protocol goes
to a duplicate of the original stdout; fd 1 is then pointed at stderr, so whatever the op's own code prints (Python
or C++) lands in the stderr the parent keeps the tail of, never in the protocol.

Events: environment, step (build messages), loaded (row count; the planned rows and the skipped results when
starting from row 0), start / result... / end (one planned row), restart (the device is unusable: go on in a fresh
process), done, error (an OpforgeError: the op's spec or build is wrong), internal (anything else: a bug).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Send = Callable[..., None]


def main() -> None:
    job = json.loads(sys.stdin.readline())
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    # A crash then leaves the Python stack in the stderr tail the parent reports.
    faulthandler.enable()

    def send(event: str, **data: Any) -> None:
        channel.write(json.dumps({"event": event, **data}, default=str) + "\n")

    from opforge.errors import OpforgeError

    try:
        run(job, send)
    except OpforgeError as exc:
        send("error", message=str(exc), exit_code=exc.exit_code)
    except Exception as exc:  # reported to the parent, which turns it into opforge's internal-error exit
        send("internal", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    channel.flush()


def run(job: dict, send: Send) -> None:
    from opforge.checks import CheckContext
    from opforge.loading import load_op
    from opforge.results import result_json
    from opforge.runner import Filters, build_info, environment, plan_op, reported_rows, run_rows
    from opforge.spec import load_spec

    send("environment", environment=environment())
    spec = load_spec(job["spec"])
    filters = Filters.from_json(job["filters"])
    loaded = load_op(spec, job["cuda_arch"], on_step=lambda message: send("step", message=message))
    plan = plan_op(loaded, filters)
    start = job["start"]
    if start == 0:
        rows = [
            {
                "target": row.target.name,
                "case_id": row.case.id,
                "dtype": row.case.dtype,
                "device": row.case.device,
                "seed": row.case.seed(filters.seed),
                "rows": reported_rows(filters, spec, row),
            }
            for row in plan.rows
        ]
        send(
            "loaded",
            count=len(plan.rows),
            rows=rows,
            build=build_info(loaded),
            skipped=[result_json(r) for r in plan.skipped],
        )
    else:
        send("loaded", count=len(plan.rows))
    unusable: list[str] = []

    def finish_row(index: int, results) -> None:
        # The device check belongs to the row: its kernels may still be running, and a hang or a crash in the
        # synchronize must be charged to it (the parent holds the row in flight until `end`), not to loading.
        reason = device_error()
        for result in results:
            send("result", result=result_json(result))
        send("end", index=index)
        if reason:
            unusable.append(reason)

    def device_usable(index: int) -> bool:
        if unusable:
            send("restart", reason=unusable[0])
        return not unusable

    context = CheckContext(loaded, filters.seed, job["time_limit"])
    if (
        run_rows(
            context,
            plan,
            filters,
            start,
            on_start=lambda i: send("start", index=i),
            on_results=finish_row,
            after_row=device_usable,
        )
        or not unusable
    ):
        send("done")


def device_error() -> str | None:
    """Why this process's CUDA context is unusable, or None. After an illegal memory access every later CUDA call
    fails with the same error, so the rows that follow must run in a fresh process."""
    if "torch" not in sys.modules:
        return None
    import torch

    if not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # the sticky error surfaces as a RuntimeError (torch.AcceleratorError in newer torch)
        return str(exc).splitlines()[0]
    return None


if __name__ == "__main__":
    main()
