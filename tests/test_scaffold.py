"""`opforge new`: each stage's scaffold passes `opforge check` as written, a later stage adds its implementation to
the same spec, and a spec the user edited is never overwritten. (The CUDA stage's kernel compiles in .ci/run's
compile gate; it runs where a GPU is.) Each test uses an op name of its own: ops register once per process."""

from __future__ import annotations

import pytest
from helpers import in_process
from typer.testing import CliRunner

from opforge.cli import app

# The quick tier (`pytest -m "not slow"`) leaves these out. Scaffolded ops are built (C++) and checked whole.
pytestmark = pytest.mark.slow

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def test_the_python_stage_passes_every_check(tmp_path):
    made = invoke("new", "scaffold_py", "--dir", str(tmp_path / "op"))
    assert made.exit_code == 0, made.output
    assert {p.name for p in (tmp_path / "op").iterdir()} == {"scaffold_py.yaml", "scaffold_py.py"}
    # Every check, in a full-precision dtype and a low-precision one (the stages' dtype handling is the same code).
    checked = invoke("check", str(tmp_path / "op" / "scaffold_py.yaml"), "--dtype", "float32", "--dtype", "bfloat16")
    assert checked.exit_code == 0, checked.output
    assert "OK:" in checked.output


def test_the_cpp_stage_adds_its_kernel_to_the_same_spec_and_passes(tmp_path):
    directory = tmp_path / "op"
    assert invoke("new", "scaffold_cc", "--dir", str(directory)).exit_code == 0
    module = (directory / "scaffold_cc.py").read_text()
    upgraded = invoke("new", "scaffold_cc", "--dir", str(directory), "--stage", "cpp")
    assert upgraded.exit_code == 0, upgraded.output
    assert "kept" in upgraded.output and (directory / "scaffold_cc.py").read_text() == module
    spec = (directory / "scaffold_cc.yaml").read_text()
    assert "op: myops::scaffold_cc\n" in spec and "sources: [scaffold_cc.cpp]" in spec
    assert "prototype: scaffold_cc:scaffold_cc_prototype" in spec
    checked = invoke("check", str(directory / "scaffold_cc.yaml"), "--dtype", "bfloat16")
    assert checked.exit_code == 0, checked.output
    rows = checked.output
    assert "native" in rows and "prototype" in rows and "opcheck:aot_dynamic" in rows


def test_the_cuda_stage_writes_a_kernel_with_the_habits_and_claims_cuda(tmp_path):
    assert invoke("new", "scaffold_cu", "--dir", str(tmp_path), "--stage", "cuda").exit_code == 0
    kernel = (tmp_path / "scaffold_cu.cu").read_text()
    for habit in (
        "getCurrentCUDAStream()",
        "c10::cuda::CUDAGuard",
        "int64_t i = static_cast<int64_t>(blockIdx.x)",
        "C10_CUDA_KERNEL_LAUNCH_CHECK()",
        "if (n == 0)",
        "AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16",
    ):
        assert habit in kernel
    spec = (tmp_path / "scaffold_cu.yaml").read_text()
    assert "sources: [scaffold_cu.cpp, scaffold_cu.cu]" in spec and "devices: [cpu, cuda]" in spec


def test_a_spec_the_user_edited_is_not_overwritten(tmp_path):
    assert invoke("new", "scaffold_ed", "--dir", str(tmp_path)).exit_code == 0
    spec = tmp_path / "scaffold_ed.yaml"
    spec.write_text(spec.read_text().replace("low: -6", "low: -3"))
    refused = invoke("new", "scaffold_ed", "--dir", str(tmp_path), "--stage", "cpp")
    assert refused.exit_code == 2, refused.output
    assert "edited since" in refused.output and "by hand" in refused.output
    assert "low: -3" in spec.read_text() and not (tmp_path / "scaffold_ed.cpp").exists()


def test_a_name_that_is_no_identifier_is_a_usage_error(tmp_path):
    result = invoke("new", "My-Op", "--dir", str(tmp_path))
    assert result.exit_code == 2
    assert "NAME: expected a lowercase identifier" in " ".join(result.output.split())
    assert invoke("new", "ok_name", "--dir", str(tmp_path), "--stage", "rust").exit_code == 2
