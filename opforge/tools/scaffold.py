"""`opforge new NAME`: an op that passes `opforge check` the moment it is written, at one of the seed article's
stages. python: a Python prototype registered with torch.library.custom_op (fake, autograd, vmap) and its spec.
cpp: the same plus C++ CPU kernels registered under the op's own name; the prototype stays, as a second
implementation the spec checks. cuda: the same plus a CUDA kernel. Moving a scaffold to a later stage keeps the
Python module and rewrites the spec only where it is still as an earlier stage wrote it.

The op is x * sigmoid(x) (SiLU): short, smooth, with a gradient that needs the input, which is the shape of most
first custom ops. Its math is in four marked places (the reference, the prototype, the C++ and CUDA kernels); the
file comments say what each piece of boilerplate is for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from opforge.core.errors import UsageError

STAGES = ("python", "cpp", "cuda")
# An op name that is a C++ and a Python identifier, as the schema needs.
_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


@dataclass(frozen=True)
class Scaffold:
    """What `new` wrote, and what it left as it was."""

    spec: Path
    written: tuple[Path, ...]
    kept: tuple[Path, ...]


def scaffold(name: str, directory: Path, stage: str, namespace: str) -> Scaffold:
    _check_names(name, namespace, stage)
    files = _files(name, namespace, stage)
    spec = directory / f"{name}.yaml"
    _refuse_edited_spec(spec, name, namespace, stage)
    directory.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for filename, text in files.items():
        path = directory / filename
        if path.exists() and path != spec:
            kept.append(path)  # the user's module or kernels: an upgrade never overwrites them
            continue
        path.write_text(text)
        written.append(path)
    return Scaffold(spec, tuple(written), tuple(kept))


def _check_names(name: str, namespace: str, stage: str) -> None:
    for what, value in (("NAME", name), ("--namespace", namespace)):
        if not _NAME.match(value):
            raise UsageError(
                what,
                "a lowercase identifier (letters, digits, underscores)",
                repr(value),
                "It names the op in C++ and Python: write e.g. my_swish.",
            )
    if stage not in STAGES:
        raise UsageError("--stage", f"one of {', '.join(STAGES)}", repr(stage), "Pick the stage to scaffold.")


def _refuse_edited_spec(spec: Path, name: str, namespace: str, stage: str) -> None:
    """An existing spec is rewritten only when it is exactly what an earlier (or this) stage wrote."""
    if not spec.exists():
        return
    generated = {_spec(name, namespace, s) for s in STAGES[: STAGES.index(stage) + 1]}
    if spec.read_text() not in generated:
        raise UsageError(
            "NAME",
            f"a new op, or a scaffold whose {spec.name} is as `opforge new` wrote it",
            f"{spec} edited since",
            f"Move it to the {stage} stage by hand: add the sources to `load.sources` and the prototype to "
            "`implementations` (see `opforge new` in a scratch directory for the exact lines).",
        )


def _files(name: str, namespace: str, stage: str) -> dict[str, str]:
    files = {f"{name}.yaml": _spec(name, namespace, stage), f"{name}.py": _module(name, namespace)}
    if stage in ("cpp", "cuda"):
        files[f"{name}.cpp"] = _cpp(name, namespace)
    if stage == "cuda":
        files[f"{name}.cu"] = _cuda(name, namespace)
    return files


# ------------------------------------------------------------------------------------------------ templates


def _spec(name: str, ns: str, stage: str) -> str:
    native = stage != "python"
    sources = {"cpp": f"[{name}.cpp]", "cuda": f"[{name}.cpp, {name}.cu]"}.get(stage)
    op = name if native else f"{name}_prototype"
    lines = [
        f"# {ns}::{name}(x) = x * sigmoid(x), scaffolded by `opforge new {name} --stage {stage}`. Change the math in",
        f"# {name}.py (reference, prototype){' and the kernels' if native else ''}, and keep every claim below true.",
        f"op: {ns}::{op}",
        f'schema: "{ns}::{op}(Tensor x) -> Tensor"',
        "load:",
        f"  python: [{name}]",
    ]
    if sources:
        lines.append(f"  sources: {sources}")
    if native:
        lines += ["implementations:", f"  prototype: {name}:{name}_prototype"]
    lines += [
        f"reference: {name}:reference",
        "inputs:",
        "  # 0-d, empty, no multiple of a vector width, a 2-D odd shape.",
        "  x: {shapes: [[], [0], [7], [33, 65]], low: -6, high: 6, requires_grad: true}",
        "dtypes: [float32, float64, float16, bfloat16]",
        f"devices: [{'cpu, cuda' if stage == 'cuda' else 'cpu'}]",
        "layouts: [contiguous, noncontiguous]",
        "claims: {differentiable: true, double_backward: true, vmap: true}",
        "error_inputs:",
        "  - description: integer x",
        "    inputs: {x: {dtype: int32}}",
        "    error: RuntimeError",
        '    match: "x must be float32, float64, float16 or bfloat16"',
    ]
    return "\n".join(lines) + "\n"


def _module(name: str, ns: str) -> str:
    return f'''"""{ns}::{name}(x) = x * sigmoid(x): the reference, the Python prototype, and (once the C++ library
is loaded) the Python side of the native op: its fake, autograd and vmap rules. Scaffolded by `opforge new`."""

from __future__ import annotations

import torch
from torch import Tensor

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def reference(x: Tensor) -> Tensor:
    """What the op must compute; opforge calls it on float64 copies of the inputs. THE MATH (1 of 4)."""
    return x * torch.sigmoid(x)


def _gradient(grad: Tensor, x: Tensor) -> Tensor:
    """d/dx x * sigmoid(x) = s + x * s * (1 - s), in differentiable torch ops: double backward comes for free."""
    s = torch.sigmoid(x)
    return grad * (s + x * s * (1 - s))


def _check(x: Tensor) -> None:
    if x.dtype not in FLOATING:
        raise RuntimeError(f"{ns}::{name}: x must be float32, float64, float16 or bfloat16, got {{x.dtype}}")


# ------------------------------------------------------------------------------------------ the prototype


@torch.library.custom_op("{ns}::{name}_prototype", mutates_args=())
def {name}_prototype(x: Tensor) -> Tensor:
    """The op in Python, in x's dtype. THE MATH (2 of 4)."""
    _check(x)
    return x * torch.sigmoid(x)


@{name}_prototype.register_fake
def _(x: Tensor) -> Tensor:
    """Shape, dtype and strides of the result: eager elementwise ops keep x's layout, so does the prototype."""
    _check(x)
    return torch.empty_like(x)


def _save_input(ctx, inputs, output) -> None:
    (x,) = inputs
    ctx.save_for_backward(x)


def _backward(ctx, grad: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return _gradient(grad, x)


{name}_prototype.register_autograd(_backward, setup_context=_save_input)
# Elementwise: under vmap the batch dimension passes through.
torch.library.register_vmap("{ns}::{name}_prototype", lambda info, in_dims, x: ({name}_prototype(x), in_dims[0]))

# ------------------------------------------------------------------------------- the native op, when built

if hasattr(torch.ops.{ns}, "{name}"):  # the spec's `load.sources` were built and loaded before this import
    native = torch.ops.{ns}.{name}.default

    @torch.library.register_fake("{ns}::{name}")
    def _(x: Tensor) -> Tensor:
        """The kernels write a contiguous result whatever x's layout."""
        _check(x)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    torch.library.register_autograd("{ns}::{name}", _backward, setup_context=_save_input)
    torch.library.register_vmap("{ns}::{name}", lambda info, in_dims, x: (native(x), in_dims[0]))
'''


def _cpp(name: str, ns: str) -> str:
    return f"""// {ns}::{name}(x) = x * sigmoid(x): the op's schema and its CPU kernel. Scaffolded by `opforge new`.
// The only TORCH_LIBRARY of namespace {ns}: other files add kernels with TORCH_LIBRARY_IMPL.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {{

// Elements per task below which at::parallel_for stays on one thread (ATen's own at::internal::GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;

at::Tensor {name}_cpu(const at::Tensor& x) {{
  const at::ScalarType t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              "{ns}::{name}: x must be float32, float64, float16 or bfloat16, got ", t, ".");
  const at::Tensor xc = x.contiguous();  // any layout in, one dense pass; the output is contiguous (the fake says so)
  at::Tensor out = at::empty(xc.sizes(), xc.options());
  const int64_t n = xc.numel();  // int64 indices: past 2^31 elements an int wraps
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "{ns}::{name}", [&] {{
    using acc_t = at::opmath_type<scalar_t>;  // float for half and bfloat16: one rounding, at the store
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* result = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {{
      for (int64_t i = begin; i < end; ++i) {{
        const acc_t v = static_cast<acc_t>(in[i]);
        result[i] = static_cast<scalar_t>(v / (acc_t(1) + std::exp(-v)));  // THE MATH (3 of 4)
      }}
    }});
  }});
  return out;
}}

}}  // namespace

TORCH_LIBRARY({ns}, m) {{
  m.def("{name}(Tensor x) -> Tensor");
}}

TORCH_LIBRARY_IMPL({ns}, CPU, m) {{
  m.impl("{name}", &{name}_cpu);
}}
"""


def _cuda(name: str, ns: str) -> str:
    return f"""// {ns}::{name}(x) = x * sigmoid(x) on CUDA. Scaffolded by `opforge new`: the current stream, a device
// guard, int64 indices in a grid-stride loop, nothing launched for an empty tensor, every launch checked.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace {{

constexpr int kThreads = 256;
// Blocks per SM the grid-stride loop is given: enough to fill an SM, few enough that each thread does several
// elements of a large tensor.
constexpr int kBlocksPerSm = 8;

template <typename scalar_t>
__global__ void {name}_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n) {{
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {{
    const acc_t v = static_cast<acc_t>(in[i]);
    out[i] = static_cast<scalar_t>(v / (acc_t(1) + ::exp(-v)));  // THE MATH (4 of 4)
  }}
}}

at::Tensor {name}_cuda(const at::Tensor& x) {{
  const at::ScalarType t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              "{ns}::{name}: x must be float32, float64, float16 or bfloat16, got ", t, ".");
  const c10::cuda::CUDAGuard guard(x.device());  // x's GPU, whichever is current
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty(xc.sizes(), xc.options());
  const int64_t n = xc.numel();
  if (n == 0) {{
    return out;  // a grid of 0 blocks is a launch error
  }}
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, sms * kBlocksPerSm));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "{ns}::{name}", [&] {{
    {name}_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(xc.const_data_ptr<scalar_t>(),
                                                           out.mutable_data_ptr<scalar_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }});
  return out;
}}

}}  // namespace

TORCH_LIBRARY_IMPL({ns}, CUDA, m) {{
  m.impl("{name}", &{name}_cuda);
}}
"""
