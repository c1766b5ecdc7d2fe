"""The child process of the sanitizer checks (opforge.checks.sanitize), run under compute-sanitizer as
`opforge.engine.sanitize_child CHANNEL` (started by child.entry_point): its SanitizeJob on stdin, then load the op
and run each case (and its gradients, for a differentiable op). Before each case it sends CaseStarted with the size
of its output so far (its stdout: the file the tool writes its reports to, too), so that the reports that follow are
blamed on it; its events (opforge.core.protocol) go to the channel file CHANNEL, which the tool's output never
reaches. Every output is copied to the host (a consumer's read, which initcheck needs to see an unwritten element)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from opforge.cases.matrix import Case
from opforge.core.protocol import CaseRaised, CaseStarted, Done, Message, SanitizeJob, send


def child_main(job: SanitizeJob, say: Callable[[Message], None]) -> int:
    import torch

    from opforge.checks.op_and_reference import argument, inputs_for
    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    loaded = load_checked(load_spec(job.spec), job.cuda_arch)
    implementation = next(t for t in loaded.implementations if t.name == job.implementation)
    for data in job.cases:
        case = _case(dict(data))
        say(CaseStarted(case.id, output_size()))
        try:
            inputs = inputs_for(loaded, case, job.seed, requires_grad=loaded.spec.differentiable)
            returned = implementation.fn(*inputs.args, **inputs.kwargs)
            outputs = _tensors(returned)
            torch.cuda.synchronize()
            for value in outputs:
                value.detach().cpu()
            differentiable = [o for o in outputs if o.requires_grad]
            names = [t.name for t in loaded.spec.tensor_inputs() if t.requires_grad]
            wrt = [argument(inputs, loaded, n) for n in names]
            if differentiable and any(w.requires_grad for w in wrt):
                grads = torch.autograd.grad(
                    differentiable,
                    [w for w in wrt if w.requires_grad],
                    [torch.ones_like(o) for o in differentiable],
                    allow_unused=True,
                )
                torch.cuda.synchronize()
                for grad in grads:
                    if grad is not None:
                        grad.cpu()
        except Exception as exc:  # the op's own error is correctness's to report; the tool's reports are what count
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            say(CaseRaised(case.id, f"{type(exc).__name__}: {first_line}", output_size()))
    say(Done())
    return 0


def output_size() -> int:
    """Bytes in this process's output file so far: what the tool wrote (its reports of the cases before) and this
    process printed. Its own buffers are flushed first."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return os.fstat(1).st_size


def _case(data: dict[str, Any]) -> Case:
    shapes = tuple((name, tuple(shape)) for name, shape in data.pop("shapes"))
    values = tuple((name, value) for name, value in data.pop("values"))
    arguments = tuple(data.pop("sample_arguments"))
    return replace(
        Case(**{**data, "shapes": (), "values": ()}), shapes=shapes, values=values, sample_arguments=arguments
    )


def _tensors(value: Any) -> list[Any]:
    import torch

    values = value if isinstance(value, (tuple, list)) else (value,)
    return [v for v in values if isinstance(v, torch.Tensor)]


def main() -> None:
    """What child.entry_point runs: the job on stdin, the channel file's path the one argument."""
    channel = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
    job = SanitizeJob.from_line(sys.stdin.readline())
    sys.exit(child_main(job, lambda message: send(channel, message)))


if __name__ == "__main__":
    main()
