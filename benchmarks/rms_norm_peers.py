"""H200 bandwidth of opforge::rms_norm against its peers: F.rms_norm, torch.compile of the reference, Liger-Kernel.

Run on a GPU machine from the repository root (Liger-Kernel is a pure-Python wheel; install it without its
dependencies, or leave it in .whl/, where this script finds it and unpacks it into a temporary folder):
    pip install --no-deps .whl/liger_kernel-*.whl
    python benchmarks/rms_norm_peers.py [--json out.json] [--markdown out.md]
    python benchmarks/rms_norm_peers.py --shapes 4096x4096 --dtypes bfloat16 --modes bwd \
        --contender opforge --contender liger
Tuning a constant of the CUDA kernels: edit its constexpr value in the source and rerun; the build cache keys on
the sources (docs/measurements/tuned-constants.md lists the constants and what chose each value).

Contenders, each at rows x hidden = 4096x4096, 32768x4096, 8192x8192 in bfloat16 and float32:
  opforge      opforge.ops.rms_norm.rms_norm (forward), its autograd backward (rms_norm_backward)
  F.rms_norm   torch.nn.functional.rms_norm, eager
  compile      torch.compile(reference) (dynamic=False; inductor's kernels for the forward and the backward)
  liger        liger_kernel.transformers.rms_norm.LigerRMSNorm (Triton; its defaults: casting_mode="llama",
               in_place=True, i.e. its backward writes grad_x over the incoming gradient)
A peer that cannot be imported is skipped, with the reason.

Timing is triton.testing.do_bench's method: before every rep the L2 is flushed by zeroing a 256 MiB buffer, then the
GPU spins (torch.cuda._sleep) long enough for the whole call to be queued (a backward through autograd costs tens
of microseconds of host time), then CUDA events bracket the call; the median of the reps is reported. The backward
is `torch.autograd.grad(y, (x, weight), grad, retain_graph=True)` on a graph built once: the backward alone.

Bytes are those of specs/rms_norm.yaml: forward x + weight + y, backward grad + x + weight + grad_x + grad_weight
(1 / rms, the backward's partial sums and any other workspace are not counted, for anyone). "% copy" is against a
device-to-device copy moving the same number of bytes (a read and a write of half of them), timed the same way on
three pairs of buffers (the median of their medians).
Each contender's outputs are also compared with the float64 reference ("max err": the largest |got - expected|
over the largest |expected|, per output, worst of the outputs).
"""

from __future__ import annotations

import argparse
import glob
import json
import platform
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPES = [(4096, 4096), (32768, 4096), (8192, 8192)]
DTYPES = ["bfloat16", "float32"]
MODES = ["fwd", "bwd"]
IMPLS = ["opforge", "F.rms_norm", "compile", "liger"]
EPS = 1e-6

# 256 MiB, as triton.testing.do_bench: four times an H200's 60 MiB L2.
FLUSH_BYTES = 256 * 2**20
# The copy is timed on this many allocations and the median taken: timed on one, four of nine runs of the 8192x8192
# bfloat16 backward's copy came out 6-10% off the rest (H200, 2026-12-04), which moved the same 111.8-112.1 us
# backward between 87.8% and 96.6% "of the copy".
COPY_ALLOCATIONS = 3
# The spin before each rep lasts this many times the call's host-side launch time, and at least MIN_SPIN_S.
SPIN_MULTIPLE = 4
MIN_SPIN_S = 20e-6


# ------------------------------------------------------------------------------------------------------- timing


class Timer:
    """do_bench's method: flush L2, spin so the call is queued before the start event, time with events, median."""

    def __init__(self, reps: int, warmup: int, device: str = "cuda") -> None:
        self.reps = reps
        self.warmup = warmup
        self.device = device
        if device == "cuda":
            self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
            self.cycles_per_s = self._calibrate_spin()

    @staticmethod
    def _calibrate_spin() -> float:
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    @staticmethod
    def _host_seconds(fn: Callable[[], object]) -> float:
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
        torch.cuda.synchronize()
        return statistics.median(samples)

    def median_ms(self, fn: Callable[[], object]) -> tuple[float, list[float]]:
        for _ in range(self.warmup):
            fn()
        if self.device == "cpu":
            return self._cpu_median_ms(fn)
        spin = int(max(MIN_SPIN_S, SPIN_MULTIPLE * self._host_seconds(fn)) * self.cycles_per_s)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.reps)
        ]
        torch.cuda.synchronize()
        for start, end in events:
            self.flush.zero_()
            torch.cuda._sleep(spin)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples = [start.elapsed_time(end) for start, end in events]
        return statistics.median(samples), samples

    def _cpu_median_ms(self, fn: Callable[[], object]) -> tuple[float, list[float]]:
        # --device cpu is a smoke test of this script, not a measurement: no flush, wall-clock time.
        samples = []
        for _ in range(self.reps):
            begin = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(samples), samples


# --------------------------------------------------------------------------------------------------- contenders


@dataclass
class Peer:
    """How to run one contender: its forward, given x and weight (its own copy where it keeps state)."""

    name: str
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    note: str = ""


def opforge_peer() -> Peer:
    from opforge.ops.rms_norm import rms_norm

    return Peer("opforge", lambda x, w: rms_norm(x, w, EPS))


def functional_peer() -> Peer:
    return Peer("F.rms_norm", lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS))


def compile_peer() -> Peer:
    from opforge.ops.rms_norm import reference

    compiled = torch.compile(reference, dynamic=False)
    return Peer("compile", lambda x, w: compiled(x, w, EPS), "torch.compile(reference, dynamic=False)")


def import_liger():
    """LigerRMSNorm, installed or unpacked from a wheel under .whl/. Not imported from the zip itself: the wheel's
    liger_kernel/ops/experimental has no __init__.py, and zipimport cannot import such a namespace package."""
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        return LigerRMSNorm, "installed"
    except ImportError as installed_error:
        wheels = sorted(glob.glob(str(REPO / ".whl" / "liger_kernel-*.whl")))
        if not wheels:
            raise installed_error
        unpacked = tempfile.mkdtemp(prefix="liger-")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            wheel.extractall(unpacked)
        sys.path.insert(0, unpacked)
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        return LigerRMSNorm, f"unpacked from {Path(wheels[-1]).name}"


def liger_peer() -> Peer:
    try:
        LigerRMSNorm, origin = import_liger()
        import liger_kernel.ops as liger_ops
    except Exception as exc:  # any import failure (missing triton, a broken install) skips this peer
        return Peer("liger", None, f"skipped: liger_kernel cannot be imported ({type(exc).__name__}: {exc})")
    function = getattr(liger_ops, "LigerRMSNormFunction", None)
    implementation = f"{function.__module__}.{function.__qualname__}" if function else "?"
    modules: dict[tuple, torch.nn.Module] = {}

    def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # The module as users build it, run with the point's weight in place of its parameter, so that the weight
        # gradient is taken with respect to the same tensor for every contender.
        key = (w.shape[0], w.dtype, w.device)
        if key not in modules:
            modules[key] = LigerRMSNorm(w.shape[0], eps=EPS).to(device=w.device, dtype=w.dtype)
        return torch.func.functional_call(modules[key], {"weight": w}, (x,))

    version = getattr(sys.modules.get("liger_kernel"), "__version__", "")
    return Peer("liger", forward, f"LigerRMSNorm {version} ({origin}; {implementation})".replace("  ", " "))


PEER_FACTORIES = {"opforge": opforge_peer, "F.rms_norm": functional_peer, "compile": compile_peer, "liger": liger_peer}


# --------------------------------------------------------------------------------------------------- one point


@dataclass
class Row:
    rows: int
    hidden: int
    dtype: str
    mode: str
    contender: str
    median_ms: float | None
    gbps: float | None
    pct_copy: float | None
    copy_gbps: float
    nbytes: int
    max_err: float | None
    note: str = ""
    samples_ms: list[float] = field(default_factory=list)


def nbytes_of(mode: str, rows: int, hidden: int, dtype: torch.dtype) -> int:
    size = dtype.itemsize
    if mode == "fwd":
        return (2 * rows * hidden + hidden) * size  # x, y, weight
    return (3 * rows * hidden + 2 * hidden) * size  # grad, x, grad_x, weight, grad_weight


def copy_gbps(timer: Timer, nbytes: int) -> float:
    """The copy's bandwidth: the median over COPY_ALLOCATIONS pairs of buffers, all alive at once (so each is memory
    of its own), of each pair's median time."""
    pairs = []
    for _ in range(COPY_ALLOCATIONS):
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=timer.device).random_(0, 255)
        pairs.append((src, torch.empty_like(src)))
    times = [timer.median_ms(lambda src=src, dst=dst: dst.copy_(src))[0] for src, dst in pairs]
    return nbytes / statistics.median(times) / 1e6


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().item() or 1.0
    return (got.double() - expected).abs().max().item() / scale


def reference_outputs(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    from opforge.ops.rms_norm import reference

    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = reference(x64, w64, EPS)
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), grad.double())
    return y64.detach(), gx64, gw64


def time_point(timer: Timer, peers: list[Peer], rows: int, hidden: int, dtype_name: str, modes: list[str]) -> list[Row]:
    # compile's graphs start afresh at each point, as a model compiled for one shape gets them. Dynamo keeps the
    # graphs of one function together and past its recompile limit (8) runs it eagerly without a word: the 18
    # graphs of 3 shapes x 3 dtypes x fwd/bwd left every point after 32768x4096 float32 timing eager as "compile"
    # (the 4.0-12.2x speedups over compile of the H100 run of 2026-12-07).
    torch._dynamo.reset()
    dtype = getattr(torch, dtype_name)
    device = timer.device
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(hidden, device=device, dtype=torch.float32, generator=gen)).to(dtype)
    grad = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    expected = reference_outputs(x, w, grad)
    out = []
    for mode in modes:
        nbytes = nbytes_of(mode, rows, hidden, dtype)
        copy = copy_gbps(timer, nbytes)
        for peer in peers:
            row = Row(rows, hidden, dtype_name, mode, peer.name, None, None, None, copy, nbytes, None, peer.note)
            if peer.forward is not None:
                try:
                    fill_row(row, timer, peer, x, w, grad, expected, mode)
                except Exception as exc:  # one contender failing (out of memory, a compile error) costs its row only
                    row.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            out.append(row)
            print_row(row)
    return out


def fill_row(row: Row, timer: Timer, peer: Peer, x, w, grad, expected, mode: str) -> None:
    if mode == "fwd":
        y = peer.forward(x, w)
        row.max_err = relative_error(y, expected[0])
        ms, samples = timer.median_ms(lambda: peer.forward(x, w))
    else:
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        # Liger's backward writes grad_x over the incoming gradient: every contender gets its own copy of it.
        own_grad = grad.clone()
        y = peer.forward(xr, wr)
        gx, gw = torch.autograd.grad(y, (xr, wr), own_grad.clone(), retain_graph=True)
        row.max_err = max(relative_error(gx, expected[1]), relative_error(gw, expected[2]))
        ms, samples = timer.median_ms(lambda: torch.autograd.grad(y, (xr, wr), own_grad, retain_graph=True))
    row.median_ms, row.samples_ms = ms, samples
    row.gbps = row.nbytes / ms / 1e6
    row.pct_copy = 100 * row.gbps / row.copy_gbps


# ------------------------------------------------------------------------------------------------------ output


def print_row(row: Row) -> None:
    if row.median_ms is None:
        print(f"  {row.rows}x{row.hidden} {row.dtype} {row.mode} {row.contender}: {row.note}", flush=True)
    else:
        print(
            f"  {row.rows}x{row.hidden} {row.dtype} {row.mode} {row.contender}: {row.median_ms * 1e3:.1f} us, "
            f"{row.gbps:.0f} GB/s, {row.pct_copy:.1f}% of copy, max err {row.max_err:.2e}",
            flush=True,
        )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| rows x hidden | dtype | mode | contender | median (us) | GB/s | % copy | opforge speedup | max err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ours = {(r.rows, r.hidden, r.dtype, r.mode): r.median_ms for r in rows if r.contender == "opforge"}
    for r in rows:
        if r.median_ms is None:
            lines.append(f"| {r.rows}x{r.hidden} | {r.dtype} | {r.mode} | {r.contender} | - | - | - | - | {r.note} |")
            continue
        mine = ours.get((r.rows, r.hidden, r.dtype, r.mode))
        speedup = f"{r.median_ms / mine:.2f}x" if mine and r.contender != "opforge" else "-"
        lines.append(
            f"| {r.rows}x{r.hidden} | {r.dtype} | {r.mode} | {r.contender} | {r.median_ms * 1e3:.1f} | "
            f"{r.gbps:.0f} | {r.pct_copy:.1f} | {speedup} | {r.max_err:.1e} |"
        )
    return "\n".join(lines)


def environment(peers: list[Peer], device: str) -> dict:
    env = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "peers": {p.name: p.note for p in peers},
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sms=props.multi_processor_count)
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def parse_shape(text: str) -> tuple[int, int]:
    rows, hidden = text.lower().split("x")
    return int(rows), int(hidden)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", default=",".join(f"{r}x{h}" for r, h in SHAPES), help="rows x hidden, e.g. 4096x4096"
    )
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--contender", action="append", choices=IMPLS, help="only these contenders (repeatable)")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write every row, with its samples, here")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test of this script")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("rms_norm_peers: expected a CUDA device, found none. Run it on the GPU machine.", file=sys.stderr)
        return 1
    peers = [PEER_FACTORIES[name]() for name in (args.contender or IMPLS)]
    for peer in peers:
        if peer.note:
            print(f"{peer.name}: {peer.note}")
    timer = Timer(args.reps, args.warmup, args.device)
    results: list[Row] = []
    for rows, hidden in map(parse_shape, args.shapes.split(",")):
        for dtype in args.dtypes.split(","):
            print(f"{rows}x{hidden} {dtype}", flush=True)
            results += time_point(timer, peers, rows, hidden, dtype, args.modes.split(","))
            if args.device == "cuda":
                torch.cuda.empty_cache()
    table = markdown(results)
    print()
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(
            json.dumps({"environment": environment(peers, args.device), "rows": [asdict(r) for r in results]}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
