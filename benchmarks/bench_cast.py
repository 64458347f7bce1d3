"""Speed of the CPU cast, encode and decode, as ratios to a plain float32 copy.

Run from the repository root:

    PYTHONPATH=. python benchmarks/bench_cast.py [--n 67108864] [--reps 7] [--threads 2]
    CPD_CPU_ARCH=x86-64-v2 PYTHONPATH=. python benchmarks/bench_cast.py   # another ISA level

The first line names the CPU and the ISA level the extension was built for (``CPD_CPU_ARCH``,
default the host: see cpd/_cpu.py).

Method: x = torch.randn(n) * 100 (float32) and a preallocated out. Each measurement is the
median wall time of `reps` runs; every operation is timed side by side with out.copy_(x) in the
same process (interleaved), and the ratio median(op) / median(copy) is printed. torch's own
float8_e5m2 copy_ is shown for comparison, and so are the Philox words of the stochastic casts
alone (one thread, no tensor read or written: with --threads 1 the floor under those casts).
encode/decode ratios are against the copy of the float32 input as well. ``--clock cpu`` times the process's CPU seconds instead of wall seconds
(for a machine shared with other work; use it with ``--threads 1``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import cpd._cpu as cpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import Table  # noqa: E402

FORMATS = [  # name, exp, man, bias
    ("e5m2", 5, 2, 15),
    ("e4m3", 4, 3, 7),
    ("fp16", 5, 10, 15),
    ("bf16", 8, 7, 127),
]
MODES = [("nearest", 0), ("stochastic", 1), ("toward_zero", 2), ("up", 3), ("down", 4)]


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def timed(fn) -> float:
    t0 = _clock()
    fn()
    return _clock() - t0


def ratio(fn, copy, reps: int) -> tuple[float, float]:
    """(median(fn) / median(copy), median(fn) seconds), interleaving the two."""
    fn()
    copy()  # warm-up
    a, b = [], []
    for _ in range(reps):
        a.append(timed(fn))
        b.append(timed(copy))
    ma, mb = statistics.median(a), statistics.median(b)
    return ma / mb, ma


def philox_words(m, n: int, chunk: int = 1 << 14):
    """A function writing the random words of elements 0 .. n (blocks of 4) chunk blocks at a time."""
    w = torch.empty(4 * chunk, dtype=torch.int32)
    blocks = n // 4

    def run():
        for b0 in range(0, blocks - chunk + 1, chunk):
            m.philox_simd_out(w, b0, 1, chunk, 1234, 0, False)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2**26)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave the default)")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="wall", help="wall seconds or process CPU seconds")
    ap.add_argument("--short", action="store_true", help="only the nearest and stochastic casts")
    args = ap.parse_args()
    global _clock
    _clock = CLOCK[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    m = cpu.extension()
    if m is None:
        raise SystemExit("the CPU extension could not be built")

    n = args.n
    torch.manual_seed(0)
    x = torch.randn(n) * 100
    out = torch.empty_like(x)
    copy = lambda: out.copy_(x)  # noqa: E731
    tab = Table("bench_cast", ["operation", "x copy", "Gelem/s"], machine=cpu.machine_line(),
                setup=f"n = {n}, threads = {torch.get_num_threads()}, reps = {args.reps}, {args.clock} clock")

    f8 = torch.empty(n, dtype=torch.float8_e5m2)
    r, t = ratio(lambda: f8.copy_(x), copy, args.reps)
    tab.row("torch float8_e5m2 copy_", f"{r:.2f}", f"{n / t / 1e9:.2f}")

    for name, e, mn, b in FORMATS:
        for mname, mode in MODES[:2] if args.short else MODES:
            fn = lambda: m.cast_out(x, out, e, mn, b, 0, True, mode, False, 32, 1234, 0)  # noqa: E731
            r, t = ratio(fn, copy, args.reps)
            tab.row(f"cast {name} {mname}", f"{r:.2f}", f"{n / t / 1e9:.2f}")

    # The floor under the stochastic casts: the Philox4x32-10 words of n elements alone (n / 4
    # blocks, one thread, written in chunks to a 256 KiB buffer that stays in cache: no tensor
    # traffic).
    r, t = ratio(philox_words(m, n), copy, args.reps)
    tab.row("Philox words alone, 1 thread (Gword/s)", f"{r:.2f}", f"{n / t / 1e9:.2f}")

    import cpd  # the public API on top: Python argument checks, custom-op dispatch, seed draw

    for mname in ("nearest", "stochastic"):
        r, t = ratio(lambda: cpd.cast(x, cpd.E5M2, mname, out=out), copy, args.reps)
        tab.row(f"cpd.cast(x, E5M2, {mname!r}, out=)", f"{r:.2f}", f"{n / t / 1e9:.2f}")

    if args.short:
        tab.save()
        return
    codes = torch.empty(n, dtype=torch.uint8)
    for name, e, mn, b in FORMATS:
        if 1 + e + mn > 8:
            continue
        fn = lambda: m.encode_out(x, codes, e, mn, b, 0, True, 0, False)  # noqa: E731
        r, t = ratio(fn, copy, args.reps)
        tab.row(f"encode {name} nearest -> uint8", f"{r:.2f}", f"{n / t / 1e9:.2f}")
        fn = lambda: m.decode_out(codes, out, e, mn, b, 0, True)  # noqa: E731
        r, t = ratio(fn, copy, args.reps)
        tab.row(f"decode {name} uint8 -> float32", f"{r:.2f}", f"{n / t / 1e9:.2f}")
    tab.save()


if __name__ == "__main__":
    main()
