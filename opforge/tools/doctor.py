"""`opforge doctor`: what a custom-op author's machine can build, run and measure, each finding with its fix.

The probes use the same discovery as the build (opforge.building.extension.detect_toolchain): what doctor reports is
what `opforge check` will meet. `--build` adds the probes that compile: an OpenMP program (without OpenMP, PyTorch's CPU
extensions silently run on one thread) and a tiny extension whose TORCH_CHECK message formats a number (on the H200
image of 2026-12-03, torch 2.11.0+cu130 with Ubuntu 24.04's g++, such a message segfaulted the process instead of
raising: docs/measurements/h200-message-crash-2026-12-03.txt).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

# A compiler or probe that has not answered by then is reported as hanging, not waited for.
PROBE_TIMEOUT_S = 120

# The releases that first accept a -std= flag torch passes (GCC's and Clang's release notes).
FIRST_COMPILERS_TAKING = {"c++20": " (GCC 10 and Clang 10 are the first to take -std=c++20)"}


class Level(str, Enum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was looked at, what was found, and what to do when it is not OK."""

    topic: str
    level: Level
    found: str
    fix: str = ""


@dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> bool:
        """Something needed to build or run the bundled ops is missing."""
        return any(f.level == Level.FAIL for f in self.findings)


def diagnose(build_probes: bool = False) -> Diagnosis:
    probes: list[Callable[[], Finding]] = [
        _torch,
        _compiler,
        _ninja,
        _cuda_toolkit,
        _gpus,
        _sanitizer,
        _build_cache,
        _inductor_cache,
        _cpu_threads,
        _huge_pages,
    ]
    if build_probes:
        probes += [_openmp, _extension_messages]
    return Diagnosis(tuple(probe() for probe in probes))


# ----------------------------------------------------------------------------------------------- the probes


def _torch() -> Finding:
    import torch

    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    abi = "new (cxx11)" if torch._C._GLIBCXX_USE_CXX11_ABI else "old (pre-cxx11)"
    return Finding("torch", Level.OK, f"{torch.__version__}, {cuda}, C++ ABI {abi}, Python {sys.version.split()[0]}")


def _compiler() -> Finding:
    """The C++ compiler torch.utils.cpp_extension calls: $CXX, else `c++`, and whether it takes the -std= that torch
    passes to every extension build (C++17 up to torch 2.11, C++20 by 2.13: an older GCC fails on the flag alone)."""
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    standard = _extension_standard()
    wanted = f"a {standard.upper()} compiler" if standard else "a C++ compiler"
    if path is None:
        return Finding(
            "C++ compiler",
            Level.FAIL,
            f"expected `{name}` on PATH, got nothing",
            f"Install {wanted} (apt install g++, or the build-essential package) or point CXX at one.",
        )
    version = _first_line([path, "--version"])
    built_with = _torch_compiler()
    note = f"; torch was built with {built_with}" if built_with else ""
    if standard is None:
        return Finding("C++ compiler", Level.OK, f"{path}: {version}{note}")
    probe = _run([path, f"-std={standard}", "-x", "c++", "-fsyntax-only", "-"], stdin="int main() { return 0; }\n")
    if probe.returncode != 0:
        return Finding(
            "C++ compiler",
            Level.FAIL,
            f"expected {path} ({version}) to accept -std={standard}, which torch passes to every extension build, "
            f"got: {_tail(probe.stderr)}",
            f"Install {wanted}{FIRST_COMPILERS_TAKING.get(standard, '')} and point CXX at it"
            f"{f'; torch was built with {built_with}' if built_with else ''}.",
        )
    return Finding("C++ compiler", Level.OK, f"{path}: {version}{note}; extensions build as -std={standard}")


def _extension_standard() -> str | None:
    """The -std= torch.utils.cpp_extension passes (its most frequent one), read from its source: torch exposes it
    nowhere else."""
    import inspect

    from torch.utils import cpp_extension

    found = re.findall(r"-std=(c\+\+\d+)", inspect.getsource(cpp_extension))
    return max(set(found), key=found.count) if found else None


def _torch_compiler() -> str | None:
    import torch

    match = re.search(r"^\s*- GCC ([\d.]+)", torch.__config__.show(), re.MULTILINE)
    return f"GCC {match.group(1)}" if match else None


def _ninja() -> Finding:
    path = shutil.which("ninja")
    if path is None:
        return Finding(
            "ninja",
            Level.FAIL,
            "expected ninja on PATH, got nothing (torch.utils.cpp_extension.load builds with it)",
            "pip install ninja (in the same environment as torch).",
        )
    return Finding("ninja", Level.OK, f"{path} {_first_line([path, '--version'])}")


def _cuda_toolkit() -> Finding:
    from opforge.building.extension import detect_toolchain

    toolchain = detect_toolchain()
    if toolchain.torch_cuda is None:
        return Finding("CUDA toolkit", Level.INFO, "not needed: torch is a CPU-only build (CUDA sources are skipped)")
    if toolchain.skip_reason:
        return Finding(
            "CUDA toolkit",
            Level.WARN,
            f"torch is built for CUDA {toolchain.torch_cuda}, but {toolchain.skip_reason}",
            "Install the CUDA toolkit matching torch's CUDA version and set CUDA_HOME; until then the ops' .cu "
            "sources are left out of their builds.",
        )
    headers = ", ".join(str(d) for d in toolchain.cuda_include_dirs[:2]) or "none"
    more = f" and {len(toolchain.cuda_include_dirs) - 2} more" if len(toolchain.cuda_include_dirs) > 2 else ""
    return Finding(
        "CUDA toolkit",
        Level.OK,
        f"CUDA_HOME {toolchain.cuda_home} ({_nvcc_version(toolchain.cuda_home)}); pip CUDA headers: {headers}{more}",
    )


def _nvcc_version(cuda_home: Path | None) -> str:
    nvcc = cuda_home / "bin" / "nvcc" if cuda_home else None
    if nvcc is None or not nvcc.exists():
        return "no nvcc"
    match = re.search(r"release ([\d.]+)", _run_text([str(nvcc), "--version"]))
    return f"nvcc {match.group(1)}" if match else "nvcc of unknown version"


def _gpus() -> Finding:
    import torch

    from opforge.building.extension import arch_runs_on, detect_toolchain

    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if not torch.version.cuda else "no GPU visible (or no driver)"
        return Finding("GPUs", Level.INFO, f"none: {why}; CUDA cases are skipped with that reason")
    toolchain = detect_toolchain()
    archs = toolchain.cuda_archs
    devices = []
    missing = set()
    for i in range(torch.cuda.device_count()):
        capability = "{}.{}".format(*torch.cuda.get_device_capability(i))
        devices.append(f"cuda:{i} {torch.cuda.get_device_name(i)} (sm {capability})")
        if not any(arch_runs_on(arch, capability) for arch in archs):
            missing.add(capability)
    if not toolchain.cuda:
        # The CUDA toolkit line says what is missing and how to fix it.
        return Finding("GPUs", Level.INFO, f"{'; '.join(devices)}; no CUDA builds here: {toolchain.skip_reason}")
    found = f"{'; '.join(devices)}; builds target {', '.join(archs)}"
    if missing:
        archs_missing = ", ".join(sorted(missing))
        return Finding(
            "GPUs",
            Level.FAIL,
            f"{found}: no build for {archs_missing}",
            f"Unset TORCH_CUDA_ARCH_LIST (opforge then builds for the visible GPUs) or add {archs_missing}.",
        )
    return Finding("GPUs", Level.OK, found)


def _sanitizer() -> Finding:
    from opforge.checks.sanitize import sanitizer_path

    path = sanitizer_path()
    if path is None:
        return Finding(
            "compute-sanitizer",
            Level.INFO,
            "not found (needed only for `opforge check --sanitize`)",
            "It ships with the CUDA toolkit (bin/compute-sanitizer): install the toolkit or put it on PATH.",
        )
    return Finding("compute-sanitizer", Level.OK, path)


def _build_cache() -> Finding:
    from opforge.building.extension import cache_root

    return _cache("opforge build cache", cache_root(), "OPFORGE_CACHE")


def _inductor_cache() -> Finding:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return _cache("inductor cache", Path(cache_dir()), "TORCHINDUCTOR_CACHE_DIR")


def _cache(topic: str, path: Path, variable: str) -> Finding:
    if not path.exists():
        return Finding(topic, Level.OK, f"{path} (not created yet; set {variable} to move it)")
    probe = path if path.is_dir() else path.parent
    if not os.access(probe, os.W_OK):
        return Finding(topic, Level.FAIL, f"{path} is not writable", f"Set {variable} to a writable directory.")
    return Finding(topic, Level.OK, f"{path}, {_megabytes(path):.0f} MB (set {variable} to move it)")


def _megabytes(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:  # a file removed while walking
                continue
    return total / 2**20


def _cpu_threads() -> Finding:
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = torch.get_num_threads()
    found = f"torch uses {threads} thread(s); {cores} core(s) available to this process"
    if threads == 1 and cores > 1:
        return Finding(
            "CPU threads",
            Level.WARN,
            found,
            "CPU kernels and benches run on one core: check OMP_NUM_THREADS and torch.set_num_threads.",
        )
    return Finding("CPU threads", Level.OK, found)


THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_pages(setting: Path = THP_SETTING) -> Finding:
    try:
        text = setting.read_text().strip()
    except OSError:
        return Finding("transparent huge pages", Level.INFO, "unknown (not Linux, or no sysfs)")
    chosen = re.search(r"\[(\w+)\]", text)
    mode = chosen.group(1) if chosen else text
    if mode == "always":
        return Finding(
            "transparent huge pages",
            Level.WARN,
            "always: large CPU buffers are backed by huge pages or not depending on fragmentation, which moves CPU "
            "bench timings from run to run",
            "For CPU benchmarks set it to madvise (echo madvise > /sys/kernel/mm/transparent_hugepage/enabled), "
            "or compare runs made back to back.",
        )
    return Finding("transparent huge pages", Level.OK, mode)


# --------------------------------------------------------------------------------------- the probes that build

OPENMP_PROGRAM = """
#include <omp.h>
#include <cstdio>
int main() {
  int threads = 0;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
  }
  std::printf("%d\\n", threads);
  return 0;
}
"""


def _openmp() -> Finding:
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        return Finding("OpenMP", Level.FAIL, "no C++ compiler to try it with", "See the C++ compiler line above.")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "omp.cpp", Path(tmp) / "omp"
        source.write_text(OPENMP_PROGRAM)
        built = _run([compiler, "-fopenmp", str(source), "-o", str(binary)])
        if built.returncode != 0:
            return Finding(
                "OpenMP",
                Level.FAIL,
                f"{compiler} -fopenmp failed: {_tail(built.stderr)}",
                "Install the compiler's OpenMP runtime (libgomp, or libomp for clang): without it opforge's CPU "
                "kernels do not build.",
            )
        threads = _run([str(binary)]).stdout.strip()
    return Finding("OpenMP", Level.OK, f"{compiler} -fopenmp builds; a parallel region ran {threads} thread(s)")


MESSAGE_PROBE_SOURCE = """
#include <ATen/core/Tensor.h>
#include <torch/library.h>

at::Tensor opforge_doctor_raise(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 99, "opforge doctor: expected 99 dimensions, got ", x.dim(), " of shape ", x.sizes());
  return x;
}

TORCH_LIBRARY(opforge_doctor, m) {
  m.def("raise_number(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge_doctor, CPU, m) {
  m.impl("raise_number", &opforge_doctor_raise);
}
"""

MESSAGE_PROBE_CHILD = textwrap.dedent(
    """
    import sys, torch
    from torch.utils.cpp_extension import load
    load(name="opforge_doctor_messages", sources=[sys.argv[1]], build_directory=sys.argv[2], is_python_module=False)
    try:
        torch.ops.opforge_doctor.raise_number(torch.zeros(3))
    except RuntimeError as exc:
        print("raised:", str(exc).splitlines()[0])
    """
)


def _extension_messages() -> Finding:
    """Builds (once, in the opforge cache) and calls an op whose TORCH_CHECK message formats a number, in a child
    process: a crash there would crash every op's error path."""
    from opforge.building.extension import cache_root

    directory = cache_root() / "doctor" / "messages"
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "raise_number.cpp"
    if not source.exists() or source.read_text() != MESSAGE_PROBE_SOURCE:
        source.write_text(MESSAGE_PROBE_SOURCE)
    child = _run([sys.executable, "-c", MESSAGE_PROBE_CHILD, str(source), str(directory)])
    if "raised: opforge doctor: expected 99 dimensions, got 1 of shape [3]" in child.stdout:
        return Finding("extension error messages", Level.OK, "a TORCH_CHECK message with a number raises")
    if child.returncode < 0:
        # A warning, not a failure: the bundled ops format their numbers without streams (opforge/csrc/message.h)
        # and run; a user's op whose error path streams a number crashes instead of raising.
        return Finding(
            "extension error messages",
            Level.WARN,
            f"a TORCH_CHECK message with a number killed the process (signal {-child.returncode}): this compiler and "
            "this torch build disagree on the C++ standard library",
            "Build with the compiler torch was built with (see the C++ compiler line), or a torch build made for "
            "this system's compiler; until then an op's error path that streams a number crashes (the bundled ops "
            "format numbers with std::to_string, opforge/csrc/message.h, and are safe).",
        )
    return Finding(
        "extension error messages",
        Level.FAIL,
        f"expected the probe extension to build and raise, got exit {child.returncode}: {_tail(child.stderr)}",
        "Fix the build error above (opforge's own builds will meet it too).",
    )


# ------------------------------------------------------------------------------------------------ helpers


def _run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"no answer in {PROBE_TIMEOUT_S} s")
    except OSError as exc:
        return subprocess.CompletedProcess(command, 127, "", str(exc))


def _run_text(command: list[str]) -> str:
    done = _run(command)
    return done.stdout + done.stderr


def _first_line(command: list[str]) -> str:
    lines = _run_text(command).strip().splitlines()
    return lines[0] if lines else "(no version printed)"


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
