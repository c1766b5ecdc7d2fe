"""CPU leaky_swish forward at 2^24 float32 vs the eager composite and torch.compile of it.

Run: python benchmarks/cpu_leaky_swish.py [--threads 2] [--log2-size 24] [--rounds 3]
Each round times every contender once with torch.utils.benchmark (adaptive autorange); rounds interleave the
contenders so a noisy neighbour hits them alike. Prints the best round's median per contender, in milliseconds,
and every round's figure.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils import benchmark


def composite(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * torch.sigmoid(x) + alpha * x


def median_ms(fn, x: torch.Tensor, threads: int) -> float:
    timer = benchmark.Timer(stmt="fn(x, 0.1)", globals={"fn": fn, "x": x}, num_threads=threads)
    return timer.adaptive_autorange(min_run_time=2.0).median * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log2-size", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from opforge.ops.leaky_swish import leaky_swish

    x = torch.randn(2**args.log2_size)
    compiled = torch.compile(composite)
    compiled(x, 0.1)
    contenders = {
        "eager composite": composite,
        "torch.compile(composite)": compiled,
        "opforge::leaky_swish": leaky_swish,
    }
    rounds = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            rounds[name].append(median_ms(fn, x, args.threads))
    rows = {name: min(figures) for name, figures in rounds.items()}
    print(f"torch {torch.__version__}, {args.threads} threads, 2^{args.log2_size} float32")
    for name, ms in rows.items():
        print(f"{name:28s} {ms:8.2f} ms   rounds: {', '.join(f'{f:.1f}' for f in rounds[name])}")
    print(
        f"speedup over eager: {rows['eager composite'] / rows['opforge::leaky_swish']:.2f}x, "
        f"over compile: {rows['torch.compile(composite)'] / rows['opforge::leaky_swish']:.2f}x"
    )


if __name__ == "__main__":
    main()
