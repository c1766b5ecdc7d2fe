"""Where the time of one opforge::rms_norm_backward goes, block by block, on a GPU: a per-block timeline.

Run on a GPU machine from the repository root:
    python benchmarks/rms_norm_timeline.py                       # 4096x4096 bfloat16 and float32
    python benchmarks/rms_norm_timeline.py --shapes 32768x4096 --dtypes bfloat16
    python benchmarks/rms_norm_timeline.py --raw blocks.txt     # also every block's line, for analysis elsewhere

It copies opforge/ and specs/ into a temporary folder, stamps backward_kernel (opforge/csrc/cuda/rms_norm.cu) and
the column sum it ends with (sum_partial_columns, opforge/csrc/cuda/column_sums.cuh) with the GPU's %globaltimer at
nine points, builds that copy under its own cache, and runs one warm-up call and one timed call (the L2 flushed
before it, as the benchmarks do) per shape, each in a process of its own. Thread 0 of every block prints its stamps
and the SM it ran on (%smid); this script prints, for each point, the earliest, median and latest block in
microseconds from the first block's start:

    start            the block began
    weight ready     the weight is in shared memory (its loads went out first, the first row step's right after)
    first row        the block's first row step is reduced
    loop end         the block's last row step is done (grad_x written)
    partial written  the block's row of partial weight-gradient sums is written (with several row groups per block,
                     every group has added its sums and the last group's stores may still be in flight)
    barrier passed   the grid-wide barrier let the block go on
    slices added     thread 0's loads of partial sums are back and added (its slice of its column tile)
    tile reduced     every slice of the tile is in shared memory
    end              the block's share of the partial rows' sum is written

and how long each block spent between points. A block with no column tile to sum (more blocks than tiles) has no
"slices added" or "tile reduced"; one with several tiles stamps its last. The stamps cost a few registers and a
printf at the end; the uninstrumented kernel is what `benchmarks/rms_norm_peers.py` times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNEL = "backward_kernel(const T* __restrict__ g"
POINTS = [
    "start",
    "weight ready",
    "first row",
    "loop end",
    "partial written",
    "barrier passed",
    "slices added",
    "tile reduced",
    "end",
]
SPANS = [
    (1, 2, "weight to first row"),
    (2, 3, "row steps after it"),
    (3, 4, "partial write"),
    (4, 5, "barrier wait"),
    (5, 6, "partial sums loaded"),
    (6, 7, "slices reduced"),
    (7, 8, "tile sums written"),
    (5, 8, "partial rows' sum"),
]

# (anchor in backward_kernel, the stamp goes before or after it, point index); each anchor must occur once in the
# kernel, i.e. between its signature and the next __global__.
STAMPS = [
    ("  __shared__ wide_t scratch[2]", "before", 0),
    ("  wide_t dw[S::kN][S::kVec];\n", "before", 1),
    ("    group_sum<S>(sums, scratch[parity]);\n", "after-first", 2),
    ("  if (partial == nullptr) {", "before", 3),
    ("  if (grad_weight != nullptr) {\n", "before", 4),
    ("    cooperative_groups::this_grid().sync();\n", "after", 5),
]
END = "blockIdx.x, gridDim.x, reinterpret_cast<double*>(shared));\n  }\n"

# sum_partial_columns' stamps (anchor, slot; the stamp goes before the anchor), by thread 0 of each block into a
# device array that backward_kernel prints: the column sum is a function of its own, shared with sum_partials' kernel
# (which writes them too, but the fused backward does not run it). Each anchor must occur once in column_sums.cuh.
SUM_STAMPS = [
    ("    // xor partners hold the same columns", 0),
    ("    if (threadIdx.x < width && pack < packs) {\n", 1),
]
SUM_ARRAY = "opforge_sum_timeline"
# Blocks whose sum stamps are kept: more than any resident grid.
SUM_BLOCKS = 8192
# The thread that writes, clears and prints a block's sum stamps.
SUM_OWNER = f"threadIdx.x == 0 && blockIdx.x < {SUM_BLOCKS}"


NOW = 'unsigned long long now; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));'


def stamp(point: int) -> str:
    return f"{{ {NOW} opforge_timeline[{point}] = now; }}"


def sum_stamp(slot: int) -> str:
    return f"if ({SUM_OWNER}) {{ {NOW} {SUM_ARRAY}[blockIdx.x][{slot}] = now; }}"


def instrument(source: str) -> str:
    """rms_norm.cu with backward_kernel's stamps and its thread 0's printf added."""
    kernel = source.index(KERNEL)
    following = source.index("__global__", kernel)
    head, body, tail = source[:kernel], source[kernel:following], source[following:]
    for anchor, where, point in STAMPS:
        if body.count(anchor) != 1:
            sys.exit(
                f"rms_norm_timeline: expected one {anchor.strip()!r} in backward_kernel, got {body.count(anchor)}. "
                "Update STAMPS to the kernel's code."
            )
        if point == 0:
            # A block with no tile leaves its sum stamps at 0, not at the warm-up call's values.
            mine = f"{SUM_ARRAY}[blockIdx.x]"
            clear = f"if ({SUM_OWNER}) {mine}[0] = {mine}[1] = 0;"
            body = body.replace(
                anchor, f"  unsigned long long opforge_timeline[7] = {{}};\n  {stamp(point)}\n  {clear}\n{anchor}"
            )
        elif where == "before":
            body = body.replace(anchor, f"  {stamp(point)}\n{anchor}")
        elif where == "after":
            body = body.replace(anchor, f"{anchor}      {stamp(point)}\n")
        else:
            body = body.replace(anchor, f"{anchor}    if (base == first) {stamp(point)}\n")
    report = (
        f"  {stamp(6)}\n"
        f"  if ({SUM_OWNER}) {{\n"
        "    const unsigned long long* s = opforge_timeline;\n"
        f"    const unsigned long long* sum = {SUM_ARRAY}[blockIdx.x];\n"
        "    unsigned sm;\n"
        '    asm("mov.u32 %0, %%smid;" : "=r"(sm));\n'
        '    printf("TIMELINE %lld %d %u %llu %llu %llu %llu %llu %llu %llu %llu %llu %u\\n",\n'
        "           static_cast<long long>(rows), hidden, blockIdx.x, s[0], s[1], s[2], s[3], s[4], s[5], sum[0],\n"
        "           sum[1], s[6], sm);\n"
        "  }\n"
    )
    if body.count(END) < 1:
        sys.exit("rms_norm_timeline: backward_kernel's last statement moved. Update END to the kernel's code.")
    body = body.replace(END, END + report, 1)
    return head + body + tail


def instrument_sums(source: str) -> str:
    """column_sums.cuh with sum_partial_columns' stamps and the device array they go to."""
    for anchor, slot in SUM_STAMPS:
        if source.count(anchor) != 1:
            sys.exit(
                f"rms_norm_timeline: expected one {anchor.strip()!r} in column_sums.cuh, got {source.count(anchor)}. "
                "Update SUM_STAMPS to sum_partial_columns' code."
            )
        source = source.replace(anchor, f"    {sum_stamp(slot)}\n{anchor}")
    namespace = "namespace opforge::cuda {\n"
    if source.count(namespace) != 1:
        sys.exit(
            "rms_norm_timeline: expected one 'namespace opforge::cuda {' in column_sums.cuh, got "
            f"{source.count(namespace)}. Update instrument_sums."
        )
    return source.replace(namespace, f"__device__ unsigned long long {SUM_ARRAY}[{SUM_BLOCKS}][2];\n\n{namespace}")


RUN_ONE = """
import sys, torch
sys.path.insert(0, {root!r})
import opforge.ops.rms_norm  # noqa: F401
from opforge.bench.timing import flush_bytes_for, l2_bytes
rows, hidden, dtype = {rows}, {hidden}, torch.{dtype}
x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
w = torch.randn(hidden, device="cuda", dtype=dtype)
g = torch.randn_like(x)
flush = torch.empty(flush_bytes_for(l2_bytes(0)), dtype=torch.uint8, device="cuda")
backward = torch.ops.opforge.rms_norm_backward.default
backward(g, x, w, 1e-6)
torch.cuda.synchronize()
flush.zero_()
backward(g, x, w, 1e-6)
torch.cuda.synchronize()
"""


def summarize(lines: list[str]) -> str:
    if not lines:
        # Rows longer than the register-resident shapes (bfloat16: 16384) go through backward_loop_kernel.
        return (
            "  expected a line per block from backward_kernel, got none: this shape runs another kernel "
            "(backward_loop_kernel past 16384 bfloat16 elements per row), which has no stamps."
        )
    stamps = [[int(v) for v in line.split()[4 : 4 + len(POINTS)]] for line in lines]
    origin = min(s[0] for s in stamps)
    out = [f"  {len(stamps)} blocks; us from the first block's start (earliest / median / latest block)"]
    # 0: the block never got there (no column tile to sum).
    for k, name in enumerate(POINTS):
        values = [(s[k] - origin) / 1000 for s in stamps if s[k]]
        out.append(f"  {name:>16}: {spread(values, 7)}")
    for a, b, name in SPANS:
        values = [(s[b] - s[a]) / 1000 for s in stamps if s[a] and s[b]]
        out.append(f"  {name:>22}: {spread(values, 6)} us")
    return "\n".join(out)


def spread(values: list[float], width: int) -> str:
    """earliest / median / latest, or what there is none of."""
    if not values:
        return "no block"
    return f"{min(values):{width}.2f} / {statistics.median(values):{width}.2f} / {max(values):{width}.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="4096x4096", help="rows x hidden, comma-separated")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument(
        "--raw", type=Path, help="append the timed call's lines here (rows hidden block, 9 stamps, sm, dtype)"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("rms_norm_timeline: expected a CUDA device, found none. Run it on the GPU machine.", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="rms_norm_timeline-") as tmp:
        root = Path(tmp)
        for part in ("opforge", "specs"):
            shutil.copytree(REPO / part, root / part)
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
        kernel = root / "opforge" / "csrc" / "cuda" / "rms_norm.cu"
        kernel.write_text(instrument(kernel.read_text()))
        sums = root / "opforge" / "csrc" / "cuda" / "column_sums.cuh"
        sums.write_text(instrument_sums(sums.read_text()))
        env = dict(os.environ, OPFORGE_CACHE=str(root / "cache"))
        build = [sys.executable, "-m", "opforge", "build", "specs/rms_norm.yaml"]
        subprocess.run(build, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
        for shape in args.shapes.split(","):
            rows, hidden = (int(v) for v in shape.split("x"))
            for dtype in args.dtypes.split(","):
                code = RUN_ONE.format(root=str(root), rows=rows, hidden=hidden, dtype=dtype)
                done = subprocess.run(
                    [sys.executable, "-c", code], cwd=root, env=env, check=True, capture_output=True, text=True
                )
                # Both calls print one line per block (device printf, flushed in order at the synchronizations):
                # the second half is the timed call's.
                lines = [line for line in done.stdout.splitlines() if line.startswith("TIMELINE")]
                timed = lines[len(lines) // 2 :]
                print(f"{rows}x{hidden} {dtype}:")
                print(summarize(timed))
                if args.raw is not None:
                    with args.raw.open("a") as raw:
                        raw.writelines(f"{line} {dtype}\n" for line in timed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
