"""Loading an op written elsewhere: an existing extension package checked unmodified, spec mistakes found before a
build, clear errors where the build cannot happen, one spec's error not stopping the others, a fixed fake kernel seen
by the next run, a missing fake kernel explained, and a run that ran nothing never passing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import FIXTURES, describe, in_process, run_spec
from typer.testing import CliRunner

from opforge.cli import app
from opforge.core.errors import EXIT_NOTHING_RAN

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, in_process(args), env={"NO_COLOR": "1"})


def test_an_existing_extension_package_is_checked_unmodified():
    report = run_spec(FIXTURES / "ext_package" / "mul_add.yaml")
    failed = [r for r in report.results if r.status.failed]
    assert not failed, describe(failed)
    assert {r.check for r in report.results} >= {"correctness", "opcheck:test_faketensor", "gradcheck"}


def test_a_wrong_reference_is_reported_before_the_build(tmp_path):
    # The sources would fail to compile (exit 3): the reference's error comes first, without compiling them.
    shutil.copytree(FIXTURES / "build_error", tmp_path / "op")
    spec = tmp_path / "op" / "broken.yaml"
    spec.write_text(spec.read_text().replace("broken_module:reference", "broken_module:nope"))
    result = invoke("check", str(spec))
    assert result.exit_code == 2, result.output
    assert "reference: expected a callable 'nope' in module 'broken_module'" in result.output
    assert "compiling" not in result.output and not list((tmp_path / "op").glob("*.so"))


def test_a_schema_syntax_error_is_reported_before_the_build(tmp_path):
    shutil.copytree(FIXTURES / "build_error", tmp_path / "op")
    spec = tmp_path / "op" / "broken.yaml"
    spec.write_text(spec.read_text().replace("(Tensor x) -> Tensor", "(Tensor x -> Tensor"))
    result = invoke("check", str(spec))
    assert result.exit_code == 2 and "schema: expected a valid operator schema" in result.output, result.output


def test_a_missing_bench_section_is_reported_before_the_build(tmp_path):
    shutil.copytree(FIXTURES / "build_error", tmp_path / "op")
    result = invoke("bench", str(tmp_path / "op" / "broken.yaml"))
    assert result.exit_code == 2, result.output
    assert "expected a `bench:` section" in result.output and "compiling" not in result.output


def test_cuda_only_sources_where_cuda_cannot_be_built_are_a_clear_build_error(tmp_path):
    import torch

    if torch.version.cuda:
        pytest.skip("this torch can build CUDA")
    (tmp_path / "only.cu").write_text("// never compiled here\n")
    spec = tmp_path / "only.yaml"
    spec.write_text(
        textwrap.dedent("""\
        op: cudaonly::op
        schema: "cudaonly::op(Tensor x) -> Tensor"
        load: {sources: [only.cu]}
        reference: ref:reference
        inputs: {x: {shapes: [[7]]}}
        dtypes: [float32]
        """)
    )
    (tmp_path / "ref.py").write_text("def reference(x):\n    return x\n")
    result = invoke("check", str(spec))
    assert result.exit_code == 3, result.output
    assert "expected at least one source this machine can build, got only CUDA sources (only.cu)" in result.output
    assert "internal error" not in result.output


def test_a_spec_that_does_not_load_is_one_error_result_and_the_other_ops_still_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("op: [not, a, name\n")
    result = invoke("check", str(bad), str(FIXTURES / "good.yaml"), "--check", "correctness", "--json", "r.json")
    assert result.exit_code == 2, result.output
    ops = {op["op"]: op for op in json.loads((tmp_path / "r.json").read_text())["ops"]}
    assert [r["status"] for r in ops["bad"]["results"]] == ["error"] and ops["bad"]["load_exit_code"] == 2
    assert ops["good"]["results"] and {r["status"] for r in ops["good"]["results"]} == {"pass"}
    assert "bad.yaml:" in ops["bad"]["results"][0]["message"] and "valid YAML" in result.output


_CACHE_OP = """
import torch

EXTRA_ROWS = {extra}


@torch.library.custom_op("cacheprobe::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return x.new_empty((x.shape[0] + EXTRA_ROWS,) + tuple(x.shape[1:]))


def reference(x):
    return x * 2
"""


@pytest.mark.slow
def test_a_fixed_fake_kernel_is_seen_by_the_next_run_not_a_cached_graph(tmp_path):
    (tmp_path / "cacheop.py").write_text(_CACHE_OP.format(extra=1))
    spec = tmp_path / "cacheop.yaml"
    spec.write_text(
        textwrap.dedent("""\
        op: cacheprobe::double
        schema: "cacheprobe::double(Tensor x) -> Tensor"
        load: {python: [cacheop]}
        reference: cacheop:reference
        inputs: {x: {shapes: [[7], [5, 6]]}}
        dtypes: [float32]
        # x * 2 keeps a transposed input's strides, which this fake does not: a bug of its own, not this test's.
        layouts: [contiguous]
        differentiable: false
        checks: [compile]
        """)
    )
    # Each run in worker processes (-j 1), as a user's two runs are: the fix must reach the next process.
    broken = invoke("check", str(spec), "-j", "1")
    assert broken.exit_code == 1 and "expected size 7==8" in broken.output, broken.output
    (tmp_path / "cacheop.py").write_text(_CACHE_OP.format(extra=0))
    fixed = invoke("check", str(spec), "-j", "1")
    assert fixed.exit_code == 0, fixed.output


def test_a_missing_fake_kernel_says_to_register_one(tmp_path):
    (tmp_path / "nofake.py").write_text(
        textwrap.dedent("""\
        import torch

        lib = torch.library.Library("nofakeprobe", "DEF")
        lib.define("double(Tensor x) -> Tensor")
        lib.impl("double", lambda x: x * 2, "CPU")


        def reference(x):
            return x * 2
        """)
    )
    spec = tmp_path / "nofake.yaml"
    spec.write_text(
        textwrap.dedent("""\
        op: nofakeprobe::double
        schema: "nofakeprobe::double(Tensor x) -> Tensor"
        load: {python: [nofake]}
        reference: nofake:reference
        inputs: {x: {shapes: [[7]]}}
        dtypes: [float32]
        layouts: [contiguous]
        differentiable: false
        checks: [opcheck, compile]
        """)
    )
    result = invoke("check", str(spec), "--json", "r.json")
    assert result.exit_code == 1, result.output
    rows = json.loads((tmp_path / "r.json").read_text())["ops"][0]["results"]
    for check in ("opcheck:test_faketensor", "compile"):
        [row] = [r for r in rows if r["check"] == check]
        assert row["status"] == "fail" and "The op has no fake (meta) kernel" in row["message"], row
        assert "torch.library.register_fake" in row["message"]


# ------------------------------------------------------------------------------------------------- nothing ran


@pytest.mark.parametrize(
    "args",
    [
        ("--dtype", "int32"),  # valid, but the spec does not claim it
        ("-k", "no-such-result"),
    ],
    ids=["unclaimed-dtype", "keyword-matching-nothing"],
)
def test_a_run_that_checks_nothing_exits_5_never_0(args):
    result = invoke("check", str(FIXTURES / "good.yaml"), "--check", "correctness", *args)
    assert result.exit_code == EXIT_NOTHING_RAN, result.output
    assert "NOTHING RAN" in result.output and "expected at least one check to run, got none" in result.output


def test_a_cuda_run_of_a_cpu_only_spec_exits_5():
    result = invoke("check", str(FIXTURES / "good.yaml"), "--device", "cuda", "--check", "correctness")
    assert result.exit_code == EXIT_NOTHING_RAN, result.output


@pytest.mark.slow
def test_loading_imports_what_an_ops_first_call_would_so_the_first_case_is_timed_alone():
    """A torch.library op's first call imports torch._dynamo (1.7 s here, many times that on a loaded machine): the
    load pays it, under the load's limit, not the first case under its own (or each forked fuzz child)."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(FIXTURES)!r})
        from opforge.building.op import load_op
        from opforge.loading.spec import load_spec
        load_op(load_spec({str(FIXTURES / "good.yaml")!r}))
        print("torch._dynamo" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("True"), out.stdout + out.stderr
