"""Speed of cpd.mx (block-scaled formats) as ratios to a plain float32 copy.

Run from the repository root:

    PYTHONPATH=. python benchmarks/bench_mx.py [--n 67108864] [--reps 5] [--device cpu] [--threads N]
                                               [--clock wall|cpu] [--only SUBSTRING]

Method: x = torch.randn(n) as (n / 1024, 1024) float32 (blocks along the last axis), out a
preallocated float32 tensor. Each operation is timed side by side with out.copy_(x) in the same
process, interleaved, ``reps`` times; the ratio of the medians is printed, with the machine (CPU
model, host ISA level and the extension's build, or the GPU name) and the load average. The
issue's goals (issue 14): cpd.mx.cast of 2^26 floats to MXFP8 (nearest) <= 2x copy; MXFP4
encode to packed codes + scales <= 2x copy. A cast returning a new 256 MiB tensor pays the page
faults of fresh memory (x.clone() alone is several copies on Linux without huge pages), so the
casts are timed with out= (a preallocated result, as the copy has), and once without. ``--torch`` adds the pure-torch path (the fallback)
for the first rows, for comparison. ``--clock cpu`` times with the calling thread's CPU time
(``time.thread_time``: with ``--threads 1`` the work runs on that thread, and time the machine
gives to other processes is not counted -- the figure to take on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from cpd import _cpu, _mx_engine, mx
from cpd.rounding import Rounding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import Table  # noqa: E402


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"GPU: {torch.cuda.get_device_name(device)}"
    return _cpu.machine_line() + f"; {torch.get_num_threads()} threads"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ratio(fn, copy, reps: int, device: str, clock=time.perf_counter) -> tuple[float, float]:
    """(median(fn) / median(copy), median(fn) in seconds), the two interleaved."""
    fn(), copy()
    tf, tc = [], []
    for _ in range(reps):
        for f, ts in ((fn, tf), (copy, tc)):
            sync(device)
            t = clock()
            f()
            sync(device)
            ts.append(clock() - t)
    return statistics.median(tf) / statistics.median(tc), statistics.median(tf)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 26)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--torch", action="store_true", help="also time the pure-torch path (slow)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: time.perf_counter; cpu: the calling thread's CPU time (use with --threads 1)")
    p.add_argument("--only", default="", help="time only the operations whose name contains this")
    args = p.parse_args()
    if args.clock == "cpu" and args.device != "cpu":
        p.error("--clock cpu times CPU work; use --clock wall with --device cuda")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.n // 1024, 1024, device=args.device)
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    copy = lambda: out.copy_(x)  # noqa: E731
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    setup = (f"n = {x.numel()}, reps = {args.reps}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
             f"clock {args.clock}")
    enc4, enc8 = mx.encode(x, mx.MXFP4), mx.encode(x, mx.MXFP8_E4M3)
    cases = [("cast MXFP8_E4M3 nearest, out=", lambda: mx.cast(x, mx.MXFP8_E4M3, out=out2)),
             ("cast MXFP8_E4M3 nearest (new tensor)", lambda: mx.cast(x, mx.MXFP8_E4M3)),
             ("x.clone() (a new tensor, for scale)", lambda: x.clone()),
             ("cast MXFP8_E5M2 nearest, out=", lambda: mx.cast(x, mx.MXFP8_E5M2, out=out2)),
             ("cast MXFP4 nearest, out=", lambda: mx.cast(x, mx.MXFP4, out=out2)),
             ("cast NVFP4 nearest, out=", lambda: mx.cast(x, mx.NVFP4, out=out2)),
             ("encode MXFP4 -> packed codes + scales", lambda: mx.encode(x, mx.MXFP4)),
             ("encode NVFP4 -> packed codes + scales", lambda: mx.encode(x, mx.NVFP4)),
             ("encode MXFP8_E4M3 -> codes + scales", lambda: mx.encode(x, mx.MXFP8_E4M3)),
             ("decode MXFP4 (packed)", lambda: mx.decode(enc4)),
             ("decode MXFP8_E4M3", lambda: mx.decode(enc8)),
             ("cast MXFP8_E4M3 stochastic", lambda: mx.cast(x, mx.MXFP8_E4M3, "stochastic"))]
    if args.torch:
        zero = torch.zeros(2, dtype=torch.int64)
        cases += [("pure torch: cast MXFP8_E4M3 nearest",
                   lambda: _mx_engine.cast(None, x, zero, mx.MXFP8_E4M3, Rounding.NEAREST)),
                  ("pure torch: encode MXFP4",
                   lambda: _mx_engine.encode(None, x, zero, mx.MXFP4, Rounding.NEAREST, True))]
    tab = Table("bench_mx", ["operation", "x copy", "Gelem/s"], machine=machine(args.device), setup=setup)
    for name, fn in cases:
        if args.only not in name:
            continue
        r, t = ratio(fn, copy, args.reps, args.device, clock)
        tab.row(name, f"{r:.2f}", f"{x.numel() / t / 1e9:.3f}")
    tab.save()


if __name__ == "__main__":
    main()
