"""H200 bandwidth of opforge's CUDA kernels against a device copy, eager PyTorch, torch.compile and the seed kernel.

Run on a GPU machine from the repository root:
    python benchmarks/cuda_bandwidth.py [--sizes 20,22,24,26,28] [--json out.json] [--markdown out.md]

Bandwidth counts each input read once and the output written once: forward 1 read + 1 write, leaky_swish backward
2 reads + 1 write, custom_loss forward 2 + 1 and backward 3 + 1. Times are triton.testing.do_bench medians (it
flushes L2 before each rep). The copy bound is a device-to-device copy of the same number of bytes moved.
Sizes up to 2^22 are also timed as CUDA-graph throughput (see graph_ms), without launch cost or event resolution.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


def interleaved_medians(contenders: dict, rounds: int, time_ms=median_ms) -> dict[str, tuple[float, float]]:
    """Each contender's median `time_ms(fn)` over `rounds` rounds that alternate the contenders (so clock and
    thermal drift hit all alike), and the spread of its round results, (max - min) / median."""
    import statistics

    samples: dict[str, list[float]] = {who: [] for who in contenders}
    for _ in range(rounds):
        for who, fn in contenders.items():
            samples[who].append(time_ms(fn))
    out = {}
    for who, values in samples.items():
        middle = statistics.median(values)
        out[who] = (middle, (max(values) - min(values)) / middle)
    return out


# do_bench times one call between two events: at 2^20 elements a call lasts 3-8 us, so the launch and the events'
# resolution weigh as much as the kernel (medians sat on the same few values: 749.0 GB/s for two different cases).
# Up to SMALL elements each contender is therefore also timed as the throughput of a CUDA graph that calls it once
# on each of several distinct sets of inputs, the sets together GRAPH_L2_MULTIPLE times the L2, so that every
# call reads cold inputs as under do_bench's flush; a sample is one replay's time over the calls in it.
GRAPH_L2_MULTIPLE = 4
GRAPH_MIN_SETS = 4
GRAPH_REPLAYS = 50
GRAPH_ROUNDS = 3


def graph_sets(nbytes: int) -> int:
    """Input sets one graph rotates through: enough that the sets together outsize the L2 GRAPH_L2_MULTIPLE times."""
    from opforge.bench.timing import l2_bytes

    return max(GRAPH_MIN_SETS, -(-GRAPH_L2_MULTIPLE * l2_bytes(torch.cuda.current_device()) // nbytes))


def graph_ms(fn, input_sets: list[tuple]) -> float:
    """Median time per call of `fn` replayed in a CUDA graph over `input_sets`, one call per set."""
    import statistics

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles (torch.compile) and warms up before capture, as CUDA graphs require
        for inputs in input_sets[:3]:
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for inputs in input_sets:
            fn(*inputs)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(GRAPH_REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(input_sets))
    del graph
    return statistics.median(times)


def interleaved_graph_ms(contenders: dict, make_inputs, nbytes: int) -> dict[str, tuple[float, float]]:
    """interleaved_medians of graph_ms, every contender over the same input sets, in GRAPH_ROUNDS rounds."""
    input_sets = [make_inputs() for _ in range(graph_sets(nbytes))]
    return interleaved_medians(contenders, GRAPH_ROUNDS, lambda fn: graph_ms(fn, input_sets))


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


@dataclass(frozen=True)
class Case:
    name: str
    nbytes: int  # moved per call: every input read once, the output written once
    make_inputs: Callable[[], tuple]  # a fresh set of the call's tensor arguments
    contenders: dict  # who -> fn(*inputs)


def leaky_swish_cases(n: int, dtype) -> list[Case]:
    from opforge.ops.leaky_swish import _backward, leaky_swish, reference

    def ref_backward(g, x, alpha):
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s) + alpha)

    def x_only():
        return (torch.randn(n, device="cuda", dtype=dtype),)

    def grad_and_x():
        return (torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype))

    compiled, compiled_bwd = torch.compile(reference), torch.compile(ref_backward)
    fwd = {
        "opforge": lambda x: leaky_swish(x, 0.1),
        "eager": lambda x: reference(x, 0.1),
        "torch.compile(ref)": lambda x: compiled(x, 0.1),
    }
    if dtype == torch.float32 and n < 2**31 and SEED_KERNEL_LOADED:
        fwd["seed kernel"] = lambda x: torch.ops.seed.leaky_swish(x, 0.1)
    bwd = {
        "opforge": lambda g, x: _backward(g, x, 0.1),
        "eager": lambda g, x: ref_backward(g, x, 0.1),
        "torch.compile(ref)": lambda g, x: compiled_bwd(g, x, 0.1),
    }
    size = dtype.itemsize
    return [Case("leaky_swish fwd", 2 * n * size, x_only, fwd), Case("leaky_swish bwd", 3 * n * size, grad_and_x, bwd)]


def custom_loss_cases(n: int, dtype) -> list[Case]:
    from opforge.ops.custom_loss import _backward, custom_loss, reference

    def ref_backward(g, p, t):
        d = p - t
        return g * torch.where(d < 0, 2 * d, torch.sign(d))

    def tensors(count: int):
        return lambda: tuple(torch.randn(n, device="cuda", dtype=dtype) for _ in range(count))

    compiled, compiled_bwd = torch.compile(reference), torch.compile(ref_backward)
    fwd = {"opforge": custom_loss, "eager": reference, "torch.compile(ref)": compiled}
    bwd = {"opforge": _backward, "eager": ref_backward, "torch.compile(ref)": compiled_bwd}
    size = dtype.itemsize
    return [
        Case("custom_loss fwd", 3 * n * size, tensors(2), fwd),
        Case("custom_loss bwd", 4 * n * size, tensors(3), bwd),
    ]


def load_seed_kernel() -> None:
    global SEED_KERNEL_LOADED
    from torch.utils import cpp_extension

    build = Path(os.environ.get("OPFORGE_CACHE", "/tmp")) / "seed_kernel"
    build.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        "seed_kernel",
        [str(REPO / "benchmarks" / "seed_kernel.cu")],
        build_directory=str(build),
        is_python_module=False,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
    )
    SEED_KERNEL_LOADED = True


def measure(case: Case, n: int, dtype) -> dict:
    """One row: do_bench bandwidth of each contender against the copy bound and, up to SMALL elements, the same
    contenders' CUDA-graph throughput ("graph" columns)."""
    bound = copy_gbps(case.nbytes)
    row = {
        "case": case.name,
        "dtype": str(dtype).removeprefix("torch."),
        "log2_n": n.bit_length() - 1,
        "copy_GBps": round(bound, 1),
    }
    timed = {who: fn for who, fn in case.contenders.items() if who in BASELINES or who == "seed kernel"}
    inputs = case.make_inputs()
    calls = {who: functools.partial(fn, *inputs) for who, fn in timed.items()}
    for who, (ms, spread) in interleaved_medians(calls, rounds_for(n)).items():
        row[who] = round(gbps(case.nbytes, ms), 1)
        row[f"{who} spread %"] = round(100 * spread, 1)
    row["opforge_pct_of_copy"] = round(100 * row["opforge"] / bound, 1)
    if "torch.compile(ref)" in row:
        row["opforge / compile"] = round(row["opforge"] / row["torch.compile(ref)"], 3)
    if n <= SMALL:
        graphed = {who: fn for who, fn in timed.items() if who in ("opforge", "torch.compile(ref)")}
        for who, (ms, spread) in interleaved_graph_ms(graphed, case.make_inputs, case.nbytes).items():
            row[f"{who} graph"] = round(gbps(case.nbytes, ms), 1)
            row[f"{who} graph spread %"] = round(100 * spread, 1)
        if "torch.compile(ref) graph" in row:
            row["opforge / compile graph"] = round(row["opforge graph"] / row["torch.compile(ref) graph"], 3)
    return row


def run(sizes, dtypes, ops) -> list[dict]:
    rows = []
    for log2 in sizes:
        n = 2**log2
        for dtype in dtypes:
            for make in ops:
                for case in make(n, dtype):
                    row = measure(case, n, dtype)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    columns = [
        "case",
        "dtype",
        "log2_n",
        "copy_GBps",
        "opforge",
        "opforge_pct_of_copy",
        "torch.compile(ref)",
        "opforge / compile",
        "opforge spread %",
        "torch.compile(ref) spread %",
        "opforge graph",
        "torch.compile(ref) graph",
        "opforge / compile graph",
        "opforge graph spread %",
        "torch.compile(ref) graph spread %",
        "eager",
        "seed kernel",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "-")) for c in columns) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="20,22,24,26,28")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--ops", default="leaky_swish,custom_loss")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--no-seed", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="leave out the eager and torch.compile baselines")
    parser.add_argument("--no-eager", action="store_true", help="leave out the eager baseline")
    args = parser.parse_args()
    global BASELINES
    BASELINES = (
        {"opforge"}
        | (set() if args.no_compile else {"torch.compile(ref)"})
        | (set() if args.no_compile or args.no_eager else {"eager"})
    )
    if not args.no_seed:
        load_seed_kernel()
    makers = {"leaky_swish": leaky_swish_cases, "custom_loss": custom_loss_cases}
    rows = run(
        [int(s) for s in args.sizes.split(",")],
        [getattr(torch, d) for d in args.dtypes.split(",")],
        [makers[o] for o in args.ops.split(",")],
    )
    table = markdown(rows)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}\n{table}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
