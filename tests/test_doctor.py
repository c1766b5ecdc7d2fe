"""`opforge doctor`: each finding OK/INFO/WARN/FAIL with its fix, exit 1 when the bundled ops could not be built or
run, and the probes shown failing on a faked broken machine."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from opforge.cli import app
from opforge.tools import doctor
from opforge.tools.doctor import Level

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "100", **(env or {})})


def test_this_machine_can_build_the_bundled_ops():
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    for topic in ("torch", "C++ compiler", "ninja", "CUDA toolkit", "GPUs", "opforge build cache", "inductor cache"):
        assert topic in result.output
    assert "OK: this machine can build and run the bundled ops" in result.output


def test_a_machine_without_compiler_or_ninja_fails_with_the_fixes(tmp_path):
    result = invoke("doctor", env={"PATH": str(tmp_path), "CXX": "c++"})
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "FAIL C++ compiler expected `c++` on PATH, got nothing" in text
    assert f"fix: Install a {doctor._extension_standard().upper()} compiler" in text
    assert "FAIL ninja" in text and "pip install ninja" in text
    assert "FAIL: C++ compiler, ninja: the bundled ops cannot be built or run here" in text


def test_the_compiler_takes_the_standard_torch_builds_extensions_with():
    finding = doctor._compiler()
    standard = doctor._extension_standard()
    assert standard in ("c++17", "c++20"), standard
    assert finding.level == Level.OK and finding.found.endswith(f"extensions build as -std={standard}")


def _compiler_rejecting(tmp_path: Path, flag: str) -> Path:
    """A `c++` that prints a version and refuses `flag` as GCC 9 refuses -std=c++20, else runs the real compiler."""
    fake = tmp_path / "c++"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "c++ (GCC) 9.4.0"; exit 0; fi\n'
        f'for a in "$@"; do [ "$a" = {flag} ] && echo "c++: error: unrecognized command-line option \'$a\'" >&2 '
        "&& exit 1; done\n"
        f'exec {shutil.which("c++")} "$@"\n'
    )
    fake.chmod(0o755)
    return fake


def test_a_compiler_older_than_torchs_standard_fails_with_the_release_that_takes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "_extension_standard", lambda: "c++20")
    monkeypatch.setenv("CXX", str(_compiler_rejecting(tmp_path, "-std=c++20")))
    finding = doctor._compiler()
    assert finding.level == Level.FAIL, finding
    assert "(c++ (GCC) 9.4.0) to accept -std=c++20, which torch passes to every extension build" in finding.found
    assert "unrecognized command-line option '-std=c++20'" in finding.found
    assert finding.fix.startswith("Install a C++20 compiler (GCC 10 and Clang 10 are the first to take -std=c++20)")


def test_the_same_compiler_passes_under_a_torch_that_builds_as_cxx17(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "_extension_standard", lambda: "c++17")
    monkeypatch.setenv("CXX", str(_compiler_rejecting(tmp_path, "-std=c++20")))
    finding = doctor._compiler()
    assert finding.level == Level.OK and finding.found.endswith("extensions build as -std=c++17"), finding


def test_a_compiler_without_openmp_fails_the_build_probe(tmp_path, monkeypatch):
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\necho 'fatal error: omp.h: No such file or directory' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    finding = doctor._openmp()
    assert finding.level == Level.FAIL and "omp.h: No such file" in finding.found
    assert "OpenMP runtime" in finding.fix


def test_an_error_message_that_kills_the_process_is_a_warning_the_bundled_ops_are_safe_from(monkeypatch):
    monkeypatch.setattr(doctor, "MESSAGE_PROBE_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    finding = doctor._extension_messages()
    assert finding.level == Level.WARN
    assert f"killed the process (signal {int(signal.SIGSEGV)})" in finding.found
    assert "Build with the compiler torch was built with" in finding.fix


def test_an_error_message_that_raises_is_ok_and_one_that_builds_nothing_names_the_error(monkeypatch):
    raised = "print('raised: opforge doctor: expected 99 dimensions, got 1 of shape [3]')"
    monkeypatch.setattr(doctor, "MESSAGE_PROBE_CHILD", raised)
    assert doctor._extension_messages().level == Level.OK
    monkeypatch.setattr(doctor, "MESSAGE_PROBE_CHILD", "raise SystemExit('error: no such compiler')")
    broken = doctor._extension_messages()
    assert broken.level == Level.FAIL and "exit 1: error: no such compiler" in broken.found


def test_openmp_builds_and_runs_here():
    finding = doctor._openmp()
    assert finding.level == Level.OK and "parallel region ran" in finding.found


def test_transparent_huge_pages_always_warns_for_cpu_benchmarks(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("[always] madvise never\n")
    warned = doctor._huge_pages(setting)
    assert warned.level == Level.WARN and "madvise" in warned.fix
    setting.write_text("always [madvise] never\n")
    assert doctor._huge_pages(setting) == doctor.Finding("transparent huge pages", Level.OK, "madvise")


@pytest.mark.parametrize(
    "arch_list, verdict",
    [
        ("9.0a", Level.OK),
        ("9.0", Level.OK),
        ("8.0+PTX", Level.OK),
        ("8.0;8.6", Level.FAIL),
        ("9.0a;10.0", Level.OK),
    ],
)
def test_the_gpu_line_knows_which_builds_run_on_which_gpu(monkeypatch, arch_list, verdict):
    """On the H200 image TORCH_CUDA_ARCH_LIST is 9.0a: that build runs on sm 9.0 and must not be flagged."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr("opforge.building.extension.find_cuda_home", lambda: Path("/usr/local/cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    finding = doctor._gpus()
    assert finding.level == verdict, finding
    assert (verdict == Level.FAIL) == ("no build for 9.0" in finding.found)
