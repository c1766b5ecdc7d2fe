"""Where `opforge check` spends its time: the per-check time table of a run, median over several runs.

    python benchmarks/check_speed.py leaky_swish [--runs 3] [-- EXTRA CHECK ARGS]
    python benchmarks/check_speed.py --all --runs 3

Each run is `opforge check ... --json FILE` in a fresh process (what an author runs after a kernel edit: warm, the
build cached; one untimed run first builds it). The table sums each check's row seconds (opcheck's sub-tests
under `opcheck`) as the JSON report records them, beside the run's wall time; the rest of the wall time is
starting the worker, importing torch and loading the op. Run from the repository root; the figures go to
docs/performance.md with the date, machine and torch version.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def one_run(targets: list[str], extra: list[str]) -> tuple[float, dict[str, float]]:
    """The run's wall time and seconds by check (summed over its rows, all ops together)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "opforge", "check", *targets, "--json", str(report), *extra],
            stdout=subprocess.DEVNULL,
            check=False,
        )
        wall = time.monotonic() - started
        data = json.loads(report.read_text())
    by_check: dict[str, float] = defaultdict(float)
    for op in data["ops"]:
        for result in op["results"]:
            by_check[result["check"].split(":", 1)[0]] += result["seconds"]
    return wall, by_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="ops or spec paths, as `opforge check` takes them")
    parser.add_argument("--all", action="store_true", help="every bundled op (`opforge check --all`)")
    parser.add_argument("--runs", type=int, default=3)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    targets = ["--all"] if args.all else args.targets
    one_run(targets, extra)  # builds what is not cached yet: not timed
    runs = [one_run(targets, extra) for _ in range(args.runs)]
    checks = sorted(
        {c for _, by_check in runs for c in by_check}, key=lambda c: -statistics.median(r[1].get(c, 0.0) for r in runs)
    )
    print(f"opforge check {' '.join(targets + extra)}: median of {args.runs} warm runs")
    print(f"{'check':<24}{'seconds':>10}")
    for check in checks:
        print(f"{check:<24}{statistics.median(r[1].get(check, 0.0) for r in runs):>10.1f}")
    rows = statistics.median(sum(r[1].values()) for r in runs)
    wall = statistics.median(w for w, _ in runs)
    print(f"{'all checks':<24}{rows:>10.1f}")
    print(f"{'wall':<24}{wall:>10.1f}   (runs: {', '.join(f'{w:.1f}' for w, _ in runs)})")


if __name__ == "__main__":
    main()
