"""The worker process of `opforge fuzz` (`python -m opforge.fuzz.worker`): it forks a child that plans the search
(loads the op, builds it if needed, draws the spec's samples, reports the search space) and exits, then forks the
children that judge examples, one at a time; when a child dies (a segfault, an abort, a kill after a hang) it
reports how and forks the next one. A crash therefore loses nothing and costs little (a fork and the op's load from
its built library: 15 to 65 ms here), which lets hypothesis shrink crashing examples as it shrinks the others.

This process never loads the op, draws a sample or runs any torch op: whatever runs here is inherited by every
child it forks afterwards. A process that has used OpenMP's threads hangs its forked children in their next OpenMP
call (libgomp is not fork-safe: a `samples:` function's torch.log_softmax on a large tensor made every child hang,
and every example was discarded as too costly to judge); one that has made a CUDA context cannot hand it to them.
Each child loads the op itself, and makes its own threads and context.

The messages of opforge.core.protocol, one per line: the parent sends a FuzzJob first, then a FuzzExample per
example; the planning child answers Space (the search space) or LoadError, each judging child Ready (its pid), then
per example ExampleStart (before running it, so a crash is charged to it), Timed after the first reference call and
op call, and Judged (saying whether the child now exits for a fresh one); this process sends Died when a child died.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opforge.core.child import describe_exit
from opforge.core.errors import EXIT_FAILED, EXIT_INTERNAL, OpforgeError
from opforge.core.protocol import (
    Died,
    ExampleStart,
    FuzzExample,
    FuzzJob,
    Judged,
    LoadError,
    Ready,
    Space,
    Timed,
    send,
)

if TYPE_CHECKING:
    from opforge.building.op import LoadedOp

# A child's exit code after it reported a load error (an "error" event): nothing to judge, no child to fork again.
_NOT_LOADED = 7


def main() -> None:
    channel = os.dup(1)
    os.dup2(2, 1)  # whatever the op prints goes to stderr, not into the protocol
    faulthandler.enable()
    # The parent asks a child past its oracles' limit where it is (FuzzWorker._judging); the forked children inherit it.
    faulthandler.register(signal.SIGUSR1, all_threads=False)
    # is_available() without creating a CUDA context, which a forked child could not use.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    job = FuzzJob.from_line(_read_line(0))
    if not _planned(job, channel):
        return
    while True:
        pid = os.fork()
        if pid == 0:
            _serve(job, channel)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, _NOT_LOADED):
            return  # the parent closed our stdin (the search is over), or the op did not load
        send(channel, Died(describe_exit(os.waitstatus_to_exitcode(status))))


def _planned(job: FuzzJob, channel: int) -> bool:
    """Whether a child loaded the op and reported the search space (Space); else it reported why not (LoadError),
    or died, which is reported here."""
    pid = os.fork()
    if pid == 0:
        _plan(job, channel)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, _NOT_LOADED):  # as `opforge check` reports a worker that dies loading the op: a crash
        message = f"the op's process died while loading the op: {describe_exit(code)}"
        send(channel, LoadError(message, EXIT_FAILED, died=True))
    return code == 0


def _plan(job: FuzzJob, channel: int) -> None:
    """The planning child: the op loaded (and built), the search space sent. Never returns."""
    code = 0
    try:
        loaded = _load(job.spec, job.cuda_arch)
        send(channel, Space(_space(loaded)))
    except OpforgeError as exc:
        send(channel, LoadError(str(exc), exc.exit_code))
        code = _NOT_LOADED
    sys.stdout.flush()
    os._exit(code)


def _load(spec_path: str, cuda_arch: str | None) -> LoadedOp:
    from opforge.loading.checked import load_checked
    from opforge.loading.spec import load_spec

    return load_checked(load_spec(spec_path), cuda_arch)


def _space(loaded: LoadedOp) -> dict[str, Any]:
    spec = loaded.spec
    tensors = spec.tensor_inputs()
    floating = ("float16", "bfloat16", "float32", "float64")
    return {
        "pairings": [
            [[t.name, list(shape)] for t in tensors if (shape := t.shapes[i]) is not None]
            for i in range(spec.shape_count)
        ],
        # Every floating input opforge samples, a spec's `special_values: false` notwithstanding: that keeps
        # special values out of `opforge check`'s matrix, and fuzz looks past the matrix. Generated ones keep
        # their generator's values.
        "special_inputs": [t.name for t in tensors if t.generator is None and (t.dtype or "float32") in floating],
        "sampled": spec.samples is not None,
    }


def _serve(job: FuzzJob, channel: int) -> None:
    """A judging child: the op loaded, then examples until stdin closes, then exit 0. Never returns."""
    from opforge.cases.matrix import kept_case
    from opforge.engine.worker import device_error
    from opforge.fuzz.oracles import Judge
    from opforge.spec.model import Regression

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        loaded = _load(job.spec, job.cuda_arch)
    except OpforgeError as exc:  # it loaded in the planning child: a load that differs from one fork to the next
        send(channel, LoadError(str(exc), EXIT_INTERNAL))
        os._exit(_NOT_LOADED)
    judge = Judge(loaded)
    send(channel, Ready(os.getpid()))
    while line := _read_line(0):
        request = FuzzExample.from_line(line)
        example = request.example
        shapes = tuple((name, tuple(shape)) for name, shape in example["shapes"])
        kept = Regression(**{**example, "shapes": shapes, "values": tuple(map(tuple, example["values"]))})
        case = kept_case(loaded.spec, kept, "fuzz")
        send(channel, ExampleStart(replace(case, fill="").id))
        verdict = judge(
            case,
            request.oracles,
            lambda phase, seconds: send(channel, Timed(phase, seconds)),
        )
        # A sticky CUDA error (an illegal address) leaves this child's context unusable: the next example needs a
        # fresh child, and the parent is told so with the verdict.
        restart = device_error() is not None
        send(channel, Judged(verdict, restart))
        if restart:
            os._exit(3)
    sys.stdout.flush()
    os._exit(0)


def _read_line(fd: int) -> str:
    """One line from `fd`, read a byte at a time: a buffered reader could swallow the next example, which a child
    that then crashes would take with it."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode()


if __name__ == "__main__":
    main()
