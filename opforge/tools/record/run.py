"""`opforge record`: run a command with the calls of custom ops recorded, then write a spec per op.

COMMAND runs as it would on its own (its stdin, stdout and stderr, its working directory), with two additions to its
environment: a directory first on PYTHONPATH holding a `sitecustomize.py` and a copy of opforge.tools.record.hook (so
that every Python process it starts records, opforge installed there or not; a sitecustomize.py further down the path
still runs, after ours), and the OPFORGE_RECORD_* settings. Each recorded process writes its calls there as they come;
once COMMAND has exited, whatever its exit status, the calls are merged and the specs written
(opforge.tools.record.specs, without importing torch: the recording's cost after COMMAND is a Python start and file
copies), and COMMAND's exit status is the result's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opforge.tools.record import hook
from opforge.tools.record.specs import WrittenSpec, read_recording, write_specs

HOOK_MODULE = "_opforge_record_hook"

SITECUSTOMIZE = f'''"""Written by `opforge record`: installs the recording of custom-op calls
(opforge.tools.record.hook), then runs the sitecustomize this one hides, if there is one."""
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    import {HOOK_MODULE}

    {HOOK_MODULE}.install_from_environment()
except Exception as _exc:  # never break the program
    _sys.stderr.write("opforge record: the recording could not start: %r\\n" % (_exc,))


def _chain():
    import importlib.machinery
    import importlib.util

    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin and _os.path.dirname(spec.origin) != _here:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain()
'''


@dataclass(frozen=True)
class RecordResult:
    """What a recording did: COMMAND's exit status (128 + the signal's number where a signal ended it, 127 where it
    could not start), the specs written, and why it could not start, if so."""

    exit_code: int
    specs: tuple[WrittenSpec, ...]
    out: Path
    not_started: str = ""
    warnings: tuple[str, ...] = ()


def record(
    command: list[str],
    out: Path,
    namespaces: tuple[str, ...] = (),
    max_calls: int = hook.DEFAULT_MAX_CALLS,
    max_elements: int = hook.DEFAULT_MAX_ELEMENTS,
) -> RecordResult:
    boot = Path(tempfile.mkdtemp(prefix="opforge-record-"))
    calls = boot / "calls"
    calls.mkdir()
    try:
        shutil.copyfile(hook.__file__, boot / f"{HOOK_MODULE}.py")
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(boot), *[p for p in [env.get("PYTHONPATH", "")] if p]])
        env[hook.ENV_DIR] = str(calls)
        env[hook.ENV_NAMESPACES] = ",".join(namespaces)
        env[hook.ENV_MAX_CALLS] = str(max_calls)
        env[hook.ENV_MAX_ELEMENTS] = str(max_elements)
        exit_code, not_started = _run(command, env)
        warnings = tuple(
            line for path in sorted(calls.glob("warnings-*.txt")) for line in path.read_text().splitlines() if line
        )
        ops = read_recording(calls, max_calls)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        specs = tuple(write_specs(ops, out, command, when)) if ops else ()
        return RecordResult(exit_code, specs, out, not_started, warnings)
    finally:
        shutil.rmtree(boot, ignore_errors=True)


def _run(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """COMMAND's exit status as a shell gives it. Ctrl-C reaches COMMAND (one process group) and ends it; the
    calls it made before are still written."""
    try:
        process = subprocess.Popen(command, env=env)
    except OSError as exc:
        return 127, f"{command[0]}: {exc.strerror or exc}"
    while True:
        try:
            code = process.wait()
            break
        except KeyboardInterrupt:
            continue  # COMMAND got the SIGINT too: wait for it to end
    return (128 + -code if code < 0 and -code in signal.Signals._value2member_map_ else code), ""
