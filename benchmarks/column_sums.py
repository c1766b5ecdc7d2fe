"""H200 bandwidth of the kernels built on opforge/csrc/cuda/column_sums.cuh (a row-wise gradient written and a
per-column gradient summed over the rows), each op called alone.

Run on a GPU machine from the repository root:
    python benchmarks/column_sums.py                   # both ops, torch.compile of custom_loss's backward too
    python benchmarks/column_sums.py --op custom_loss --no-compile
    python benchmarks/column_sums.py --device cpu --no-compile   # the CPU kernels, roughly (no cache flush)
Tuning a constant of the CUDA kernels: edit its constexpr value in the source and rerun; the build cache keys on
the sources (docs/measurements/tuned-constants.md lists the constants and what chose each value).

Contenders:
  custom_loss   opforge::custom_loss_grads_repeated(grad, pred, target), target repeated over pred's rows: rows x
                cols = 4096x4096, 32768x1024, 1024x16384, 256x65536, 65536x256; with --compile also torch.compile of
                the same two gradients written in ATen (dynamic=False)
  affine        opforge::affine_leaky_swish_backward at 32x256x56x56 and 256x64x112x112, NHWC and NCHW
in bfloat16 and float32. Timing is triton.testing.do_bench's (L2 flushed before every rep, median); on the CPU,
the median wall-clock time of 9 calls after one warm-up call. Bytes: grad and
the row-wise input read, the row-wise gradient written (the per-column operands and sums are not counted); "% copy"
is against a device-to-device copy of the same bytes timed the same way. custom_loss also reports the target
gradient's error against float64 (largest |got - expected| over the largest |expected|).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOSS_SHAPES = [(4096, 4096), (32768, 1024), (1024, 16384), (256, 65536), (65536, 256)]
AFFINE_SHAPES = [(32, 256, 56, 56), (256, 64, 112, 112)]
DTYPES = [torch.bfloat16, torch.float32]
# Every (shape, dtype) is its own compiled graph: raise dynamo's default of 8 so that none falls back to eager.
RECOMPILE_LIMIT = 64


def bench_ms(fn: Callable[[], object], device: str) -> float:
    if device == "cpu":
        return cpu_median_ms(fn)
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200)


def cpu_median_ms(fn: Callable[[], object], reps: int = 9) -> float:
    fn()
    samples = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)


def copy_ms(nbytes: int, device: str) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return bench_ms(partial(dst.copy_, src), device)


def loss_grads(grad: torch.Tensor, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both gradients of custom_loss against a per-feature target, in ATen (float terms, rounded once)."""
    d = pred.float() - target.float()
    grad_d = grad.float() * torch.where(d < 0, 2 * d, torch.sign(d))
    return grad_d.to(pred.dtype), (-grad_d.sum(0)).to(target.dtype)


def bench_custom_loss(with_compile: bool, device: str) -> None:
    import opforge.ops.custom_loss  # noqa: F401  (loads the native op)

    op = torch.ops.opforge.custom_loss_grads_repeated.default
    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    compiled = torch.compile(loss_grads, dynamic=False)
    for rows, cols in LOSS_SHAPES:
        for dtype in DTYPES:
            grad = torch.randn(rows, cols, device=device, dtype=dtype)
            pred = torch.randn_like(grad)
            target = torch.randn(cols, device=device, dtype=dtype)
            ms = bench_ms(partial(op, grad, pred, target), device)
            copy = copy_ms(3 * grad.numel() * grad.element_size(), device)
            compile_ms = bench_ms(partial(compiled, grad, pred, target), device) if with_compile else None
            versus = f"{compile_ms / ms:5.2f}x compile" if compile_ms is not None else ""
            _, got = op(grad, pred, target)
            _, expected = loss_grads(grad.double(), pred.double(), target.double())
            error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
            print(
                f"custom_loss {rows:>6}x{cols:<6} {str(dtype)[6:]:>8}: {ms * 1e3:7.1f} us {100 * copy / ms:5.1f}% copy "
                f"{versus}  target err {error:.1e}",
                flush=True,
            )


def bench_affine(device: str) -> None:
    import opforge.ops.affine_leaky_swish  # noqa: F401  (loads the native op)

    backward = torch.ops.opforge.affine_leaky_swish_backward.default
    for shape in AFFINE_SHAPES:
        for dtype in DTYPES:
            for layout, memory_format in (("NHWC", torch.channels_last), ("NCHW", torch.contiguous_format)):
                x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=memory_format)
                grad = torch.randn_like(x)
                scale = torch.randn(shape[1], device=device, dtype=dtype)
                shift = torch.randn_like(scale)
                ms = bench_ms(partial(backward, grad, x, scale, shift, 0.1), device)
                copy = copy_ms(3 * x.numel() * x.element_size(), device)
                size = "x".join(map(str, shape))
                print(
                    f"affine {size:>14} {str(dtype)[6:]:>8} {layout}: {ms * 1e3:7.1f} us {100 * copy / ms:5.1f}% copy",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=["custom_loss", "affine", "all"], default="all")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "benchmarks/column_sums.py: expected a CUDA device, found none. Run it on a GPU machine, or pass "
            "--device cpu for a smoke test."
        )
    if args.op in ("custom_loss", "all"):
        bench_custom_loss(args.compile, args.device)
    if args.op in ("affine", "all"):
        bench_affine(args.device)


if __name__ == "__main__":
    main()
