"""H200 bandwidth of opforge's CUDA kernels against a device copy, eager PyTorch, torch.compile and the seed kernel.

Run on a GPU machine from the repository root:
    python benchmarks/cuda_bandwidth.py [--sizes 20,22,24,26,28] [--json out.json] [--markdown out.md]
    python benchmarks/cuda_bandwidth.py --sweep [--sizes 20,24,28 --dtypes float32]   # compare tuned constants

Bandwidth counts each input read once and the output written once: forward 1 read + 1 write, leaky_swish backward
2 reads + 1 write, custom_loss forward 2 + 1 and backward 3 + 1. Times are triton.testing.do_bench medians (it
flushes L2 before each rep). The copy bound is a device-to-device copy of the same number of bytes moved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def median_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=200, return_mode="median")


# Below this many elements a kernel runs for microseconds and a single do_bench median moves by 10-15% between
# processes (H200 sweep, 2^20 float32: the same kernel measured 1125-1324 GB/s), so small sizes are timed in
# interleaved rounds and reported as the median of the round medians, with their spread.
SMALL = 2**22
SMALL_ROUNDS = 5


def rounds_for(n: int) -> int:
    return SMALL_ROUNDS if n <= SMALL else 1


def interleaved_medians(contenders: dict, rounds: int) -> dict[str, tuple[float, float]]:
    """Each contender's median time over `rounds` rounds that alternate the contenders (so clock and thermal drift
    hit all alike), and the spread of its round medians, (max - min) / median."""
    import statistics

    samples: dict[str, list[float]] = {who: [] for who in contenders}
    for _ in range(rounds):
        for who, fn in contenders.items():
            samples[who].append(median_ms(fn))
    out = {}
    for who, values in samples.items():
        middle = statistics.median(values)
        out[who] = (middle, (max(values) - min(values)) / middle)
    return out


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def copy_gbps(nbytes: int) -> float:
    # A copy of nbytes/2 bytes moves nbytes (read + write).
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return gbps(nbytes, median_ms(lambda: dst.copy_(src)))


# The contenders timed besides opforge's own kernel ("seed kernel" is timed whenever it is loaded).
BASELINES = {"opforge", "torch.compile(ref)", "eager"}
SEED_KERNEL_LOADED = False


def leaky_swish_cases(n: int, dtype):
    from opforge.ops.leaky_swish import _backward, leaky_swish, reference

    x = torch.randn(n, device="cuda", dtype=dtype)
    g = torch.randn(n, device="cuda", dtype=dtype)

    def ref_backward(g, x, alpha):
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s) + alpha)

    fwd = {"opforge": lambda: leaky_swish(x, 0.1), "eager": lambda: reference(x, 0.1)}
    compiled = torch.compile(reference)
    fwd["torch.compile(ref)"] = lambda: compiled(x, 0.1)
    if dtype == torch.float32 and n < 2**31 and SEED_KERNEL_LOADED:
        fwd["seed kernel"] = lambda: torch.ops.seed.leaky_swish(x, 0.1)
    compiled_bwd = torch.compile(ref_backward)
    bwd = {"opforge": lambda: _backward(g, x, 0.1), "eager": lambda: ref_backward(g, x, 0.1),
           "torch.compile(ref)": lambda: compiled_bwd(g, x, 0.1)}
    size = x.element_size()
    return [("leaky_swish fwd", 2 * n * size, fwd), ("leaky_swish bwd", 3 * n * size, bwd)]


def custom_loss_cases(n: int, dtype):
    from opforge.ops.custom_loss import _backward, custom_loss, reference

    p = torch.randn(n, device="cuda", dtype=dtype)
    t = torch.randn(n, device="cuda", dtype=dtype)
    g = torch.randn(n, device="cuda", dtype=dtype)

    def ref_backward(g, p, t):
        d = p - t
        return g * torch.where(d < 0, 2 * d, torch.sign(d))

    compiled, compiled_bwd = torch.compile(reference), torch.compile(ref_backward)
    fwd = {"opforge": lambda: custom_loss(p, t), "eager": lambda: reference(p, t),
           "torch.compile(ref)": lambda: compiled(p, t)}
    bwd = {"opforge": lambda: _backward(g, p, t), "eager": lambda: ref_backward(g, p, t),
           "torch.compile(ref)": lambda: compiled_bwd(g, p, t)}
    size = p.element_size()
    return [("custom_loss fwd", 3 * n * size, fwd), ("custom_loss bwd", 4 * n * size, bwd)]


def load_seed_kernel() -> None:
    global SEED_KERNEL_LOADED
    from torch.utils import cpp_extension

    build = Path(os.environ.get("OPFORGE_CACHE", "/tmp")) / "seed_kernel"
    build.mkdir(parents=True, exist_ok=True)
    cpp_extension.load("seed_kernel", [str(REPO / "benchmarks" / "seed_kernel.cu")], build_directory=str(build),
                       is_python_module=False, extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"])
    SEED_KERNEL_LOADED = True


def run(sizes, dtypes, ops) -> list[dict]:
    rows = []
    for log2 in sizes:
        n = 2**log2
        for dtype in dtypes:
            for make in ops:
                for name, nbytes, contenders in make(n, dtype):
                    bound = copy_gbps(nbytes)
                    row = {"case": name, "dtype": str(dtype).removeprefix("torch."), "log2_n": log2,
                           "copy_GBps": round(bound, 1)}
                    timed = {who: fn for who, fn in contenders.items() if who in BASELINES or who == "seed kernel"}
                    for who, (ms, spread) in interleaved_medians(timed, rounds_for(n)).items():
                        row[who] = round(gbps(nbytes, ms), 1)
                        row[f"{who} spread %"] = round(100 * spread, 1)
                    row["opforge_pct_of_copy"] = round(100 * row["opforge"] / bound, 1)
                    if "torch.compile(ref)" in row:
                        row["opforge / compile"] = round(row["opforge"] / row["torch.compile(ref)"], 3)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    columns = ["case", "dtype", "log2_n", "copy_GBps", "opforge", "opforge_pct_of_copy", "torch.compile(ref)",
               "opforge / compile", "opforge spread %", "torch.compile(ref) spread %", "eager", "seed kernel"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "–")) for c in columns) + " |")
    return "\n".join(lines)


# Variants of the tuned constants in opforge/csrc/cuda/elementwise.cuh that --sweep compares, as -D overrides.
SWEEP_VARIANTS = {
    "default": "",
    "streaming loads": "-DOPFORGE_CUDA_STREAMING_LOADS=1",
    "plain stores": "-DOPFORGE_CUDA_STREAMING_STORES=0",
    "multi-input 128 threads": "-DOPFORGE_CUDA_THREADS_MULTI=128",
    "multi-input 128 threads x 2 vectors": "-DOPFORGE_CUDA_THREADS_MULTI=128 -DOPFORGE_CUDA_UNROLL_MULTI=2",
    "multi-input 256 threads x 2 vectors": "-DOPFORGE_CUDA_UNROLL_MULTI=2",
    "multi-input 512 threads": "-DOPFORGE_CUDA_THREADS_MULTI=512",
}


def sweep(sizes: str, dtypes: str, ops: str) -> None:
    """Rebuild the kernels with each variant's constants (all builds in parallel), then time each variant in a child
    process of its own against torch.compile of the reference, one variant after another."""
    script = str(Path(__file__).resolve())
    builds = {name: subprocess.Popen([sys.executable, script, "--build-only", "--ops", ops], cwd=REPO,
                                     env=dict(os.environ, OPFORGE_EXTRA_CUDA_CFLAGS=flags),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for name, flags in SWEEP_VARIANTS.items()}
    for name, process in builds.items():
        output, _ = process.communicate()
        if process.returncode:
            print(f"sweep {name}: build failed\n{output[-2000:]}", flush=True)
    for name, flags in SWEEP_VARIANTS.items():
        command = [sys.executable, script, "--sizes", sizes, "--dtypes", dtypes, "--ops", ops, "--no-seed",
                   "--no-eager"]
        out = subprocess.run(command, env=dict(os.environ, OPFORGE_EXTRA_CUDA_CFLAGS=flags), cwd=REPO,
                             capture_output=True, text=True)
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                vs_compile = r["opforge"] / r["torch.compile(ref)"]
                print(f"sweep [{name}] {r['case']} {r['dtype']} 2^{r['log2_n']}: {r['opforge']} GB/s "
                      f"({r['opforge_pct_of_copy']}% of copy, {vs_compile:.3f}x torch.compile)", flush=True)
        if out.returncode:
            print(f"sweep {name}: failed\n{out.stderr[-2000:]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="20,22,24,26,28")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--ops", default="leaky_swish,custom_loss")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--no-seed", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="leave out the eager and torch.compile baselines")
    parser.add_argument("--no-eager", action="store_true", help="leave out the eager baseline")
    parser.add_argument("--build-only", action="store_true", help="build (or find cached) kernels and stop")
    args = parser.parse_args()
    if args.sweep:
        sweep(args.sizes, args.dtypes, args.ops)
        return
    if args.build_only:
        for op in args.ops.split(","):
            __import__(f"opforge.ops.{op}")
        return
    global BASELINES
    BASELINES = {"opforge"} | (set() if args.no_compile else {"torch.compile(ref)"}) | \
        (set() if args.no_compile or args.no_eager else {"eager"})
    if not args.no_seed:
        load_seed_kernel()
    makers = {"leaky_swish": leaky_swish_cases, "custom_loss": custom_loss_cases}
    rows = run([int(s) for s in args.sizes.split(",")], [getattr(torch, d) for d in args.dtypes.split(",")],
               [makers[o] for o in args.ops.split(",")])
    table = markdown(rows)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}\n{table}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
