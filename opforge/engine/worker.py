"""The child process of an isolated run (see opforge.engine.isolated): load one op, run its tasks from a
given index on, and stream what happens to the parent as the events of opforge.core.protocol.

Forked by the fork server (opforge.engine.forkserver) or started as a process of its own, alike: the CheckJob as one
line on stdin, the protocol on a duplicate of the original stdout. fd 1 then points at stderr, so whatever the op's
own code prints (Python or C++) lands in the stderr the parent keeps the tail of, never in the protocol.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from opforge.core.errors import OpforgeError
from opforge.core.protocol import (
    Done,
    End,
    EnvironmentEvent,
    Event,
    Internal,
    Loaded,
    LoadError,
    Restart,
    Result,
    Start,
    Step,
    Sweep,
    TaskHeader,
    encode,
)
from opforge.core.results import CaseResult
from opforge.engine.plan import CheckJob

if TYPE_CHECKING:
    from opforge.engine.plan import Plan

Send = Callable[[Event], None]


def main() -> None:
    job_line = sys.stdin.readline()
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    # A crash then leaves the Python stack in the stderr tail the parent reports.
    faulthandler.enable()

    def send(event: Event) -> None:
        channel.write(encode(event))

    try:
        # The job is read inside: a job this worker cannot read (another opforge version's) is an internal error.
        run(CheckJob.from_line(job_line), send)
    except OpforgeError as exc:
        send(LoadError(str(exc), exc.exit_code))
    except Exception as exc:  # reported to the parent, which turns it into opforge's internal-error exit
        send(Internal(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    channel.flush()


def run(job: CheckJob, send: Send) -> None:
    from opforge.core.environment import environment
    from opforge.engine.plan import build_info, check_context, plan_op, reported_results
    from opforge.engine.tasks import run_tasks
    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    send(EnvironmentEvent(environment()))
    spec = load_spec(job.spec)
    filters, settings = job.filters, job.settings
    loaded = load_checked(spec, job.cuda_arch, on_step=lambda message: send(Step(message)))
    plan = plan_op(loaded, filters, settings)
    start_cuda(plan)
    if job.start == 0 and job.part == 0:
        headers = tuple(
            TaskHeader(
                implementation=task.implementation.name,
                case_id=task.case.id,
                dtype=task.case.dtype,
                device=task.case.device,
                layout=task.case.layout,
                seed=task.case.seed(settings.seed),
                results=tuple(reported_results(filters, spec, task)),
                group=task.group,
            )
            for task in plan.tasks
        )
        send(Loaded(len(plan.tasks), headers, build_info(loaded), tuple(plan.skipped)))
    else:
        send(Loaded(len(plan.tasks)))
    unusable: list[str] = []

    def finish_task(index: int, results: list[CaseResult]) -> None:
        # The device check belongs to the task: its kernels may still be running, and a hang or a crash in the
        # synchronize must be charged to it (the parent holds the task in flight until End), not to loading.
        reason = device_error()
        for result in results:
            send(Result(result))
        send(End(index))
        if reason:
            unusable.append(reason)

    def device_usable(index: int) -> bool:
        if unusable:
            send(Restart(unusable[0]))
        return not unusable

    context = check_context(
        loaded, settings, job.time_limit, on_sweep=lambda case: send(Sweep(case.id, case.dtype, case.layout))
    )
    ran_to_the_end = run_tasks(
        context,
        plan,
        filters,
        settings,
        job.start,
        part=(job.part, job.parts),
        on_start=lambda index: send(Start(index)),
        on_results=finish_task,
        after_task=device_usable,
    )
    if ran_to_the_end or not unusable:
        send(Done())


def start_cuda(plan: Plan) -> None:
    """Creates the CUDA context of each device the tasks use while the worker is still loading (under the load's time
    limit): on a busy machine that takes seconds, and a spec's per-check `timeout:` is for the op, not for it."""
    devices = sorted({task.case.device for task in plan.tasks if task.case.device.startswith("cuda")})
    if not devices:
        return
    import torch

    if not torch.cuda.is_available():
        return  # the tasks' results say why they cannot run
    for device in devices:
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)


def device_error() -> str | None:
    """Why this process's CUDA context is unusable, or None. After an illegal memory access every later CUDA call
    fails with the same error, so the tasks that follow must run in a fresh process."""
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
