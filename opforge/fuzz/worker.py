"""The worker process of `opforge fuzz` (`python -m opforge.fuzz.worker`): it loads the op once, then forks a
child that runs examples one at a time; when a child dies (a segfault, an abort, a kill after a hang) it reports
how and forks the next one, in milliseconds instead of the seconds a fresh `import torch` and op load take. A crash
therefore loses nothing and costs little, which lets hypothesis shrink crashing examples as it shrinks the others.

This process never runs an op itself: a process that has used OpenMP's threads hangs its forked children, and
one that has made a CUDA context cannot hand it to them. Each child makes its own.

Protocol, one JSON object per line: the parent sends {"spec", "cuda_arch"} first, then one {"example", "oracles"}
per example; this process answers "loaded" (the search space) or "error", each child "ready" (its pid), then per
example "start" (before running it, so a crash is charged to it) and "verdict" (saying whether the child now exits
for a fresh one); "died" when a child died.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from opforge.child import describe_exit
from opforge.errors import OpforgeError
from opforge.results import strict_json

if TYPE_CHECKING:
    from opforge.loading import LoadedOp


def main() -> None:
    channel = os.dup(1)
    os.dup2(2, 1)  # whatever the op prints goes to stderr, not into the protocol
    faulthandler.enable()
    # is_available() without creating a CUDA context, which a forked child could not use.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    job = json.loads(_read_line(0) or "{}")
    try:
        loaded = _load(job["spec"], job.get("cuda_arch"))
    except OpforgeError as exc:
        _send(channel, {"event": "error", "message": str(exc), "exit_code": exc.exit_code})
        return
    _send(channel, {"event": "loaded", "space": _space(loaded)})
    while True:
        pid = os.fork()
        if pid == 0:
            _serve(loaded, channel)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return  # the parent closed our stdin: the search is over
        _send(channel, {"event": "died", "how": describe_exit(os.waitstatus_to_exitcode(status))})


def _load(spec_path: str, cuda_arch: str | None) -> LoadedOp:
    from opforge.loading import load_op
    from opforge.spec.load import load_spec

    return load_op(load_spec(spec_path), cuda_arch)


def _space(loaded: LoadedOp) -> dict[str, Any]:
    spec = loaded.spec
    tensors = spec.tensor_inputs()
    floating = ("float16", "bfloat16", "float32", "float64")
    return {
        "pairings": [[[t.name, list(t.shapes[i])] for t in tensors] for i in range(spec.shape_count)],
        # Every floating input opforge samples, a spec's `special_values: false` notwithstanding: that keeps
        # special values out of `opforge check`'s matrix, and fuzz looks past the matrix. Generated ones keep
        # their generator's values.
        "special_inputs": [t.name for t in tensors if t.generator is None and (t.dtype or "float32") in floating],
        "sampled": spec.samples is not None,
    }


def _serve(loaded: LoadedOp, channel: int) -> None:
    """A child: examples until stdin closes, then exit 0. Never returns."""
    from opforge.cases import kept_case
    from opforge.engine.worker import device_error
    from opforge.fuzz.oracles import judge
    from opforge.spec.model import Regression

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _send(channel, {"event": "ready", "pid": os.getpid()})
    while line := _read_line(0):
        request = json.loads(line)
        example = request["example"]
        shapes = tuple((name, tuple(shape)) for name, shape in example["shapes"])
        kept = Regression(**{**example, "shapes": shapes, "values": tuple(map(tuple, example["values"]))})
        _send(channel, {"event": "start"})
        verdict = judge(
            loaded,
            kept_case(loaded.spec, kept, "fuzz"),
            tuple(request["oracles"]),
            lambda event, seconds: _send(channel, {"event": event, "seconds": seconds}),
        )
        # A sticky CUDA error (an illegal address) leaves this child's context unusable: the next example needs a
        # fresh child, and the parent is told so with the verdict.
        restart = device_error() is not None
        _send(channel, {"event": "verdict", **asdict(verdict), "restart": restart})
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


def _send(channel: int, event: dict[str, Any]) -> None:
    os.write(channel, (json.dumps(strict_json(event), allow_nan=False) + "\n").encode())


if __name__ == "__main__":
    main()
