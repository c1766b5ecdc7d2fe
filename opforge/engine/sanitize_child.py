"""The child process of the sanitizer checks (opforge.checks.sanitize), run under compute-sanitizer as
`opforge.engine.sanitize_child JOB` (started by child.entry_point): load the op, then run each case (and its
gradients, for a differentiable op), printing a marker before each so that the tool's reports are blamed on it.
Every output is copied to the host (a consumer's read, which initcheck needs to see an unwritten element)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from opforge.cases.matrix import Case
from opforge.checks.sanitize import CASE_MARKER, Job


def child_main(job_path: str) -> int:
    import torch

    from opforge.checks.op_and_reference import argument, inputs_for
    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    job = Job(**json.loads(Path(job_path).read_text()))
    loaded = load_checked(load_spec(job.spec), job.cuda_arch)
    implementation = next(t for t in loaded.implementations if t.name == job.implementation)
    for data in job.cases:
        case = _case(data)
        print(CASE_MARKER + case.id, flush=True)
        try:
            inputs = inputs_for(loaded, case, job.seed, requires_grad=loaded.spec.differentiable)
            returned = implementation.fn(*inputs.args, **inputs.kwargs)
            outputs = [o for o in _tensors(returned)]
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
            print(f"OPFORGE-SANITIZE-ERROR {case.id} raised {type(exc).__name__}: {first_line}")
        sys.stdout.flush()
    return 0


def _case(data: dict) -> Case:
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
    """What child.entry_point runs: the job file's path is the one argument."""
    sys.exit(child_main(sys.argv[1]))


if __name__ == "__main__":
    main()
