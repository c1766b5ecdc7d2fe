"""`opforge fuzz`'s figures for docs/performance.md: examples per second on an op, and the time to find each
fuzz fixture's bug (tests/fixtures/fuzz_ops) over several seeds, with the minimal example each shrank to.

    python benchmarks/fuzz_speed.py rate specs/leaky_swish.yaml [--budget 60]
    python benchmarks/fuzz_speed.py find [--seeds 5] [--budget 60]

Run from the repository root. Times start once the op is loaded (the budget's start), as `opforge fuzz` counts."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opforge.fuzz.options import FuzzOptions  # noqa: E402
from opforge.fuzz.search import fuzz  # noqa: E402
from opforge.loading.spec import load_spec  # noqa: E402

FIXTURES = ("doubles_short_tail", "logsumexp_naive", "row_sum_scratch", "row_max_buffered")


def rate(spec_path: str, budget: float) -> None:
    with tempfile.TemporaryDirectory() as db:
        report = fuzz(load_spec(spec_path), FuzzOptions(budget=budget, seed=0, database=Path(db)))
    print(
        f"{report.op}: {report.examples} examples in {report.seconds:.1f} s = {report.examples / report.seconds:.1f}"
        f"/s, {len(report.failures)} failures"
    )


def find(seeds: int, budget: float) -> None:
    for fixture in FIXTURES:
        spec = load_spec(REPO / "tests" / "fixtures" / "fuzz_ops" / f"{fixture}.yaml")
        found, minimal = [], []
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as db:
                options = FuzzOptions(budget=budget, seed=seed, exit_first=True, database=Path(db))
                report = fuzz(spec, options)
            if report.failures:
                found.append(report.failures[0].found_after)
                example = report.failures[0].example
                minimal.append(f"{dict(example.shapes)['x']} {example.fill or ''}".strip())
        median = f"{statistics.median(found):.1f} s" if found else "-"
        times = ", ".join(f"{t:.1f}" for t in found)
        print(f"{fixture}: found {len(found)}/{seeds}, median {median} ({times}); minimal: {'; '.join(minimal)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("rate")
    one.add_argument("spec")
    one.add_argument("--budget", type=float, default=60)
    many = sub.add_parser("find")
    many.add_argument("--seeds", type=int, default=5)
    many.add_argument("--budget", type=float, default=60)
    args = parser.parse_args()
    if args.command == "rate":
        rate(args.spec, args.budget)
    else:
        find(args.seeds, args.budget)


if __name__ == "__main__":
    main()
