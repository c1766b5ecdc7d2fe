"""The benchmark of the benchmark: does `opforge bench` agree with itself, and with triton.testing.do_bench?

Both subcommands run from the repository root.

    python benchmarks/bench_fidelity.py spread RUN1.json RUN2.json RUN3.json [--min-elements 0]
        Per case timed in every run: how far each run's median is from the runs' mean (±%), and the summary.

    python benchmarks/bench_fidelity.py gpu --out DIR [--op leaky_swish] [--sizes 2**24,2**26,2**28]
            [--dtype float32 --dtype bfloat16] [--impl native --impl eager] [--runs 3]
        Runs `opforge bench OP --device cuda --sizes ... --json DIR/run<i>.json` RUNS times back to back, each in a
        fresh process; then times the same cases in this process with triton.testing.do_bench (median; do_bench
        flushes L2 itself) and writes DIR/fidelity.md: the spread (target: every case within ±3%) and opforge's
        median over do_bench's (target: within 5%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load_medians(path: Path) -> dict[str, tuple[float, int]]:
    data = json.loads(Path(path).read_text())
    return {r["id"]: (r["median_s"], r["elements"]) for r in data["results"] if r["status"] == "ok"}


def spread_table(paths: list[Path], min_elements: int = 0) -> tuple[list[str], list[float]]:
    """Markdown rows (case, medians, worst deviation from the mean) and each case's worst deviation."""
    runs = [load_medians(p) for p in paths]
    common = [i for i in runs[0] if all(i in r for r in runs) and runs[0][i][1] >= min_elements]
    lines = ["| case | " + " | ".join(f"run {k + 1}" for k in range(len(runs))) + " | worst vs mean |",
             "|---|" + "---:|" * (len(runs) + 1)]
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
    return (f"{len(deviations)} cases, {runs} runs: worst ±{100 * max(deviations):.1f}%, median "
            f"±{100 * statistics.median(deviations):.1f}% from the runs' mean; {within[3]} cases within ±3%, "
            f"{within[10]} within ±10%")


def spread(args) -> None:
    lines, deviations = spread_table(args.runs, args.min_elements)
    print("\n".join(lines))
    print("\n" + summary(deviations, len(args.runs)))


def gpu(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--device", "cuda", "--sizes", args.sizes] + [a for d in args.dtype for a in ("--dtype", d)] + \
        [a for i in args.impl for a in ("--impl", i)]
    paths = []
    for i in range(1, args.runs + 1):
        path = out / f"run{i}.json"
        command = [sys.executable, "-m", "opforge", "bench", args.op, *common, "--json", str(path)]
        print("$", " ".join(command), flush=True)
        with open(out / f"run{i}.txt", "w") as log:
            subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
        paths.append(path)
    spread_lines, deviations = spread_table(paths)
    ours = load_medians(paths[0])
    from triton.testing import do_bench

    theirs = medians_by(lambda call: do_bench(call, return_mode="median") / 1e3, args.op, args.sizes,
                        tuple(args.dtype), tuple(args.impl), set(ours), "cuda")
    report = [f"# opforge bench fidelity: {args.op}, sizes {args.sizes}, {args.runs} runs", "",
              "## Spread across runs (target: every case within ±3%)", "", summary(deviations, args.runs), ""] + \
        spread_lines
    report += ["", "## opforge (run 1) against triton.testing.do_bench (target: within 5%)", "",
               "| case | opforge | do_bench | ratio |", "|---|---:|---:|---:|"]
    ratios = []
    for ident, seconds in sorted(theirs.items()):
        ratio = ours[ident][0] / seconds
        ratios.append(ratio)
        report.append(f"| `{ident}` | {ours[ident][0] * 1e3:.4g} ms | {seconds * 1e3:.4g} ms | {ratio:.3f} |")
    if ratios:
        report.append(f"\nworst ratio: {max(ratios, key=lambda r: abs(r - 1)):.3f} over {len(ratios)} cases")
    text = "\n".join(report) + "\n"
    (out / "fidelity.md").write_text(text)
    print(text)


def medians_by(timer, op: str, sizes: str, dtypes: tuple[str, ...], impls: tuple[str, ...], ids: set[str],
               device: str) -> dict[str, float]:
    """timer(call) (seconds) of the very callables opforge bench times, for each id it timed."""
    import torch

    from opforge.bench.model import BenchResult
    from opforge.bench.runner import (BenchFilters, compiled_reference, contenders, mode_callable, parse_sizes,
                                      plan_points)
    from opforge.cases import make_inputs
    from opforge.loading import load_op
    from opforge.spec import find_spec, load_spec

    loaded = load_op(load_spec(find_spec(op)))
    filters = BenchFilters(devices=(device,), dtypes=dtypes, impls=impls, sizes=parse_sizes([sizes]))
    medians = {}
    for point in plan_points(loaded.spec, filters, (device,)):
        inputs = make_inputs(loaded.spec, loaded.arguments, point.case, 0, requires_grad=point.mode != "fwd")
        for contender in contenders(loaded, filters):
            ident = BenchResult(loaded.spec.name, contender.name, contender.role, device, point.dtype, point.mode,
                                point.label, point.elements, "ok").id
            if ident not in ids:
                continue
            fn = contender.fn if contender.fn is not None else compiled_reference(loaded)
            call = mode_callable(loaded, fn, inputs, point.mode, 0)
            medians[ident] = timer(call)
            print(f"{ident}: {medians[ident] * 1e3:.4g} ms", flush=True)
        del inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    return medians


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
    # torch.compile is left out by default: its compilations (two per point) would push three runs of 2^24..2^28
    # past ten minutes; the eager reference is the other, very different, kernel to compare.
    g.add_argument("--impl", action="append", default=None)
    args = parser.parse_args()
    if args.command == "gpu":
        args.dtype = args.dtype or ["float32", "bfloat16"]
        args.impl = args.impl or ["native", "eager"]
    {"spread": spread, "gpu": gpu}[args.command](args)


if __name__ == "__main__":
    main()
