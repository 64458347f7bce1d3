"""Speed of cpd's CUDA kernels as ratios to torch's own device work of the same size.

Run from the repository root on a machine with a CUDA GPU and the ``cuda`` extra:

    PYTHONPATH=. python benchmarks/bench_gpu.py [--reps 20] [--quick]

Measurements (CUDA events on the current stream, median of ``reps`` after one warm-up, each
operation timed side by side with its baseline in the same process, interleaved):

* cast, nearest and stochastic, of 2^26 float32 to E5M2 / E4M3 / BF16, against ``out.copy_(x)``
  on the device (goal: nearest <= 1.15x, stochastic <= 1.3x);
* cpd.matmul 1024^3 and 4096^3, mul=E5M2 into acc=(5, 10), and Kahan into BF16, against float32
  ``torch.mm`` with TF32 off (goal at 4096^3, E5M2/(5,10): <= 20x);
* the emulated allreduce of 64 workers x 2^22 float32 (cpd.allreduce, E5M2 ring, and BF16 ring)
  against ``torch.stack(ws).sum(0)``.

Prints the GPU's name, CUDA/NVRTC versions and a table; without a GPU it says so and exits 0.
``--quick`` uses smaller sizes (2^22 elements, 1024^3 only, 16 x 2^20).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import cpd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import record  # noqa: E402


def event_time(fn, reps: int) -> list[float]:
    """Per-call seconds of ``reps`` calls of fn, timed with CUDA events (one warm-up call first)."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def side_by_side(fn, base, reps: int) -> tuple[float, float]:
    """(median seconds of fn, median seconds of base), the two interleaved call by call."""
    fn()
    base()
    a, b = [], []
    for _ in range(reps):
        a += event_time(fn, 1)
        b += event_time(base, 1)
    return statistics.median(a), statistics.median(b)


def table(rows) -> str:
    header = ["operation", "size", "cpd", "baseline", "baseline op", "ratio"]
    cells = [header] + [[r[0], r[1], f"{r[2] * 1e3:.3f} ms", f"{r[3] * 1e3:.3f} ms", r[4], f"{r[2] / r[3]:.2f}x"]
                        for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="smaller sizes")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU (torch.cuda.is_available() is False); nothing to measure.")
        return 0
    from cpd import _cuda

    dev = torch.device("cuda")
    reason = _cuda.unusable_reason(dev)
    name = torch.cuda.get_device_name(dev)
    cc = torch.cuda.get_device_capability(dev)
    print(f"GPU: {name} (sm_{cc[0]}{cc[1]}), torch {torch.__version__} (CUDA {torch.version.cuda})")
    if reason is not None:
        print(f"bench_gpu: cpd's kernels cannot run here ({reason}); nothing to measure.")
        return 0
    print(f"NVRTC {'.'.join(map(str, _cuda.nvrtc_version()))}, target {_cuda.target_for(*cc)}\n")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []

    n = 1 << (22 if args.quick else 26)
    x = torch.randn(n, device=dev, generator=g) * 100
    out = torch.empty_like(x)
    for fmt in (cpd.E5M2, cpd.E4M3, cpd.BF16):
        for mode in ("nearest", "stochastic"):
            t, b = side_by_side(lambda: cpd.cast(x, fmt, mode, out=out), lambda: out.copy_(x), args.reps)
            rows.append((f"cast {fmt.name} {mode}", f"2^{n.bit_length() - 1}", t, b, "out.copy_(x)"))

    for size in ((1024,) if args.quick else (1024, 4096)):
        a = torch.randn(size, size, device=dev, generator=g)
        bm = torch.randn(size, size, device=dev, generator=g)
        for label, kw in (("E5M2 -> (5,10)", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10))),
                          ("Kahan BF16", dict(acc=cpd.BF16, kahan=True))):
            reps = max(3, args.reps // (4 if size > 1024 else 1))
            t, b = side_by_side(lambda: cpd.matmul(a, bm, **kw), lambda: torch.mm(a, bm), reps)
            rows.append((f"matmul {label}", f"{size}^3", t, b, "torch.mm fp32"))

    workers, m = (16, 1 << 20) if args.quick else (64, 1 << 22)
    ws = [torch.randn(m, device=dev, generator=g) for _ in range(workers)]
    for fmt in (cpd.E5M2, cpd.BF16):
        t, b = side_by_side(lambda: cpd.allreduce(ws, fmt), lambda: torch.stack(ws).sum(0), max(3, args.reps // 4))
        rows.append((f"allreduce ring {fmt.name}", f"{workers} x 2^{m.bit_length() - 1}", t, b, "stack().sum(0)"))

    print(table(rows))
    record("bench_gpu", ["operation", "size", "cpd ms", "baseline ms", "baseline", "ratio"],
           [[r[0], r[1], f"{r[2] * 1e3:.3f}", f"{r[3] * 1e3:.3f}", r[4], f"{r[2] / r[3]:.2f}"] for r in rows],
           machine=f"GPU: {name} (sm_{cc[0]}{cc[1]}), CUDA {torch.version.cuda}", setup=f"reps {args.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
