"""The benchmark of the benchmark: does `opforge bench` agree with itself, and with triton.testing.do_bench?

Both subcommands run from the repository root.

    python benchmarks/bench_fidelity.py spread RUN1.json RUN2.json RUN3.json [--min-elements 0]
        Per case timed in every run: how far each run's median is from the runs' mean (±%), and the summary.

    python benchmarks/bench_fidelity.py gpu --out DIR [--op leaky_swish] [--sizes 2**24,2**26,2**28]
            [--dtype float32 --dtype bfloat16] [--contender native --contender eager] [--runs 3] [--reuse-runs]
        Runs `opforge bench OP --device cuda --sizes ... --json DIR/run<i>.json` RUNS times back to back, each in a
        fresh process; then times the same cases in this process with triton.testing.do_bench (median; do_bench
        flushes L2 itself) and writes DIR/fidelity.md: the spread (target: every case within ±3%) and opforge's
        median over do_bench's (target: within 5%; a case whose CPU time per rep of do_bench's loop nears the rep's GPU
        time is shown but not counted: do_bench then times the CPU, see do_bench_comparison). With --reuse-runs a
        DIR/run<i>.json already there is read, not timed again: a machine that cuts a call at its time limit can
        finish the runs in one call and do_bench in the next.

Exit status: 0 when every target is met; 1 when a run failed (its log is named), a run file is missing or is not an
`opforge bench --json`, or a target is missed (each miss is printed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The targets this script checks (docs/performance.md): each case's median within ±3% of the runs' mean, and
# opforge's median within 5% of do_bench's.
SPREAD_TARGET = 0.03
DO_BENCH_TARGET = 0.05
# do_bench times the GPU only while the CPU stays ahead of it: a case counts when the CPU's time per rep of
# do_bench's own loop is under this share of the rep's GPU time (flush plus opforge's median). Not swept: a CPU
# within 10% of the GPU drains the queue whenever a rep runs slow. The rule it replaced compared the host time of
# one call on an idle GPU, without do_bench's own queuing, against the whole rep: leaky_swish's bfloat16 backward at
# 2^24 (111 µs against a 128.5 µs rep, H100, 2026-12-08) passed it, and do_bench's median was 1.65x opforge's.
CPU_SHARE_OF_REP = 0.9


class Failed(Exception):
    """A run or a target failed: the message says which; the script exits 1."""


def load_medians(path: Path) -> dict[str, tuple[float, int]]:
    try:
        data = json.loads(Path(path).read_text())
        return {r["id"]: (r["median_s"], r["elements"]) for r in data["results"] if r["status"] == "ok"}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Failed(
            f"{path}: expected the --json of an `opforge bench` run, got {type(exc).__name__}: {exc}. "
            "Pass a file written by `opforge bench ... --json`."
        ) from None


def spread_table(paths: list[Path], min_elements: int = 0) -> tuple[list[str], list[float]]:
    """Markdown rows (case, medians, worst deviation from the mean) and each case's worst deviation."""
    runs = [load_medians(p) for p in paths]
    common = [i for i in runs[0] if all(i in r for r in runs) and runs[0][i][1] >= min_elements]
    lines = [
        "| case | " + " | ".join(f"run {k + 1}" for k in range(len(runs))) + " | worst vs mean |",
        "|---|" + "---:|" * (len(runs) + 1),
    ]
    deviations = []
    for ident in common:
        medians = [r[ident][0] for r in runs]
        mean = statistics.fmean(medians)
        worst = max(abs(m / mean - 1) for m in medians)
        deviations.append(worst)
        lines.append(f"| `{ident}` | " + " | ".join(f"{m * 1e3:.4g} ms" for m in medians) + f" | ±{100 * worst:.1f}% |")
    return lines, deviations


def summary(deviations: list[float], runs: int) -> str:
    if not deviations:
        return "no case was timed in every run"
    within = {t: sum(d <= t / 100 for d in deviations) for t in (3, 10)}
    return (
        f"{len(deviations)} cases, {runs} runs: worst ±{100 * max(deviations):.1f}%, median "
        f"±{100 * statistics.median(deviations):.1f}% from the runs' mean; {within[3]} cases within ±3%, "
        f"{within[10]} within ±10%"
    )


def spread(args) -> list[str]:
    lines, deviations = spread_table(args.runs, args.min_elements)
    print("\n".join(lines))
    print("\n" + summary(deviations, len(args.runs)))
    return spread_misses(deviations)


def spread_misses(deviations: list[float]) -> list[str]:
    if not deviations:
        return ["spread: expected cases timed in every run, got none"]
    worst = max(deviations)
    return (
        [
            f"spread: expected every case within ±{100 * SPREAD_TARGET:.0f}% of the runs' mean, "
            f"got ±{100 * worst:.1f}% ({sum(d > SPREAD_TARGET for d in deviations)} of {len(deviations)} cases outside)"
        ]
        if worst > SPREAD_TARGET
        else []
    )


def gpu(args) -> list[str]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = (
        ["--device", "cuda", "--sizes", args.sizes]
        + [a for d in args.dtype for a in ("--dtype", d)]
        + [a for i in args.contender for a in ("--contender", i)]
    )
    paths = []
    for i in range(1, args.runs + 1):
        path = out / f"run{i}.json"
        if args.reuse_runs and path.exists():
            print(f"reusing {path}", flush=True)
            paths.append(path)
            continue
        command = [sys.executable, "-m", "opforge", "bench", args.op, *common, "--json", str(path)]
        print("$", " ".join(command), flush=True)
        log_path = out / f"run{i}.txt"
        with open(log_path, "w") as log:
            code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        if code != 0 or not path.exists():
            raise Failed(
                f"run {i}: expected `opforge bench` to exit 0 and write {path}, got exit {code}"
                f"{'' if path.exists() else ' and no JSON'}. Read {log_path}."
            )
        paths.append(path)
    spread_lines, deviations = spread_table(paths)
    ours = load_medians(paths[0])
    theirs, flush_s = do_bench_medians(args.op, args.sizes, tuple(args.dtype), tuple(args.contender))
    report = [
        f"# opforge bench fidelity: {args.op}, sizes {args.sizes}, {args.runs} runs",
        "",
        "## Spread across runs (target: every case within ±3%)",
        "",
        summary(deviations, args.runs),
        "",
    ] + spread_lines
    report += ["", "## opforge (run 1) against triton.testing.do_bench (target: within 5%)", ""]
    table, misses = do_bench_comparison({i: m for i, (m, _) in ours.items()}, theirs, flush_s)
    report += table
    misses = spread_misses(deviations) + misses
    text = "\n".join(report) + "\n"
    (out / "fidelity.md").write_text(text)
    print(text)
    return misses


def do_bench_comparison(
    ours: dict[str, float], theirs: dict[str, tuple[float, float]], flush_s: float
) -> tuple[list[str], list[str]]:
    """Markdown lines comparing opforge's median (`ours`, by result id) with do_bench's (`theirs`: median, the CPU's
    time per rep of do_bench's loop), and the target's misses.

    do_bench queues flush, start event, call, end event with no synchronisation between reps, so it times the GPU
    only while the CPU keeps ahead: when the CPU's rep comes near the GPU's (its flush plus the call), the GPU
    drains, each start event fires before the call's kernels are queued, and the median holds CPU time. Such cases
    are shown, marked host-bound, and left out of the target: no fix to opforge can make it agree with a CPU time."""
    lines = ["| case | opforge | do_bench | ratio | CPU per rep | do_bench |", "|---|---:|---:|---:|---:|---|"]
    ratios, host_bound = [], 0
    for ident, (seconds, cpu_rep_s) in sorted((i, t) for i, t in theirs.items() if i in ours):
        ratio = ours[ident] / seconds
        gpu_bound = cpu_rep_s < CPU_SHARE_OF_REP * (flush_s + ours[ident])
        if gpu_bound:
            ratios.append(ratio)
        host_bound += not gpu_bound
        lines.append(
            f"| `{ident}` | {ours[ident] * 1e3:.4g} ms | {seconds * 1e3:.4g} ms | {ratio:.3f} | "
            f"{cpu_rep_s * 1e6:.0f} µs | {'times the GPU' if gpu_bound else 'host-bound, not counted'} |"
        )
    lines.append(
        f"\ndo_bench's flush: {flush_s * 1e6:.0f} µs of GPU time per rep; a case is host-bound when the CPU's time "
        f"per rep of do_bench's loop is at least {CPU_SHARE_OF_REP:.0%} of that plus opforge's median."
    )
    if not ratios:
        return lines, [
            f"do_bench: expected cases timed by both where do_bench times the GPU, got none ({host_bound} host-bound)"
        ]
    worst = max(ratios, key=lambda r: abs(r - 1))
    lines.append(f"\nworst ratio: {worst:.3f} over {len(ratios)} cases ({host_bound} host-bound left out)")
    if abs(worst - 1) > DO_BENCH_TARGET:
        return lines, [
            f"do_bench: expected opforge's medians within {100 * DO_BENCH_TARGET:.0f}% of do_bench's, "
            f"got a ratio of {worst:.3f}"
        ]
    return lines, []


def do_bench_medians(
    op: str, sizes: str, dtypes: tuple[str, ...], contenders: tuple[str, ...]
) -> tuple[dict[str, tuple[float, float]], float]:
    """do_bench's median and the CPU's time per rep of do_bench's own loop for the very calls `opforge bench` times,
    by result id (opforge's own run with do_bench as its timer), and the GPU time of do_bench's L2 flush."""
    from triton.testing import do_bench

    from opforge.bench.timing import Timing

    def timer(call, device, options, reset) -> Timing:
        if reset is not None:  # do_bench has no hook between reps to restore the arguments
            raise ValueError(f"{op} mutates its arguments, which do_bench cannot restore between reps")
        noted, starts = noting_starts(call)
        median_s = do_bench(noted, return_mode="median") / 1e3
        return Timing((median_s,), "triton.testing.do_bench", 1, "do_bench", host_s=cpu_seconds_per_rep(starts))

    return medians_timed_by(timer, op, sizes, dtypes, contenders, "cuda"), do_bench_flush_seconds()


def noting_starts(call, clock=time.perf_counter):
    """`call` wrapped to note the clock as each call starts, and the list it notes into."""
    starts: list[float] = []

    def noted():
        starts.append(clock())
        return call()

    return noted, starts


def cpu_seconds_per_rep(starts: list[float]) -> float:
    """The CPU's time per rep of do_bench's timed loop: the median gap between consecutive calls' starts over the
    last half of the calls. do_bench runs its warmup (a quarter of its reps' time, no flush) before its reps, so
    the last half of the calls are all reps, each with do_bench's own flush and event queuing around the call."""
    last = starts[len(starts) // 2 :]
    if len(last) < 2:
        raise ValueError(f"expected do_bench to call the op at least 3 times, got {len(starts)}")
    return statistics.median(b - a for a, b in itertools.pairwise(last))


def medians_timed_by(
    timer, op: str, sizes: str, dtypes: tuple[str, ...], contenders: tuple[str, ...], device: str
) -> dict[str, tuple[float, float | None]]:
    """The median and the host time (`Timing.host_s`) `timer` gives each case of an `opforge bench` run, by result
    id: the same cases, inputs and verification as the runs it is compared with, only the timer swapped."""
    from opforge.bench.plan import BenchFilters, parse_sizes
    from opforge.bench.runner import run_bench
    from opforge.bench.timing import TimingOptions
    from opforge.loading.spec import find_spec, load_spec

    filters = BenchFilters(devices=(device,), dtypes=dtypes, contenders=contenders, sizes=parse_sizes([sizes]))
    run = run_bench([load_spec(find_spec(op))], filters, TimingOptions(), timer=timer)
    for r in run.results:
        print(f"{r.id}: {r.median_s * 1e3:.4g} ms" if r.timed else f"{r.id}: {r.status} {r.message}", flush=True)
    return {r.id: (r.median_s, r.timing.host_s) for r in run.results if r.timed}


def do_bench_flush_seconds() -> float:
    """GPU time of the L2 flush do_bench runs before each rep (zeroing a 256 MB buffer), median of 20."""
    import torch

    from opforge.bench.timing import MIN_FLUSH_BYTES  # the size of do_bench's buffer

    cache = torch.empty(MIN_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        cache.zero_()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("spread")
    s.add_argument("runs", nargs="+", type=Path)
    s.add_argument("--min-elements", type=int, default=0)
    g = sub.add_parser("gpu")
    g.add_argument("--out", required=True)
    g.add_argument("--op", default="leaky_swish")
    g.add_argument("--sizes", default="2**24,2**26,2**28")
    g.add_argument("--dtype", action="append", default=None)
    g.add_argument("--runs", type=int, default=3)
    g.add_argument("--reuse-runs", action="store_true")
    # torch.compile is left out by default: its compilations (two per point) would push three runs of 2^24..2^28
    # past ten minutes; the eager reference is the other, very different, kernel to compare.
    g.add_argument("--contender", action="append", default=None)
    args = parser.parse_args()
    if args.command == "gpu":
        args.dtype = args.dtype or ["float32", "bfloat16"]
        args.contender = args.contender or ["native", "eager"]
    try:
        misses = {"spread": spread, "gpu": gpu}[args.command](args)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    for miss in misses:
        print(f"target missed: {miss}", file=sys.stderr)
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
