"""cpd.matmul time / torch.mm time on CPU, side by side in one process.

    python benchmarks/bench_matmul.py [--size 256] [--repeat 3] [--threads N]
    CPD_CPU_ARCH=x86-64-v2 python benchmarks/bench_matmul.py   # another ISA level

The first line names the CPU and the ISA level the extension was built for. Each line gives the
loop cuda/cpu/matmul.cpp picks (plan_for): "h16" binary16 lanes (AVX512-FP16 adds, or float32
lanes rounded by the F16C / FCVT conversion), "f32" float32 lanes, "f32 sr" stochastic float32
lanes (matmul_sr.h), "f32 directed" float32 lanes in the processor's rounding direction
(matmul_directed.h), "f64" float64 lanes, "generic" one output at a time.

The last line is the floor under the stochastic rows: the Philox4x32-10 blocks their word
contract draws (one per multiply-add, two with Kahan), drawn alone by the same vector Philox.

Prints one line per (mul, acc, options): the best of ``repeat`` runs of cpd.matmul, the best of
many runs of torch.mm (timed before and after, to be robust to a busy machine), and the ratio.
``--clock cpu`` times CPU seconds of the process (all its threads) instead of wall seconds: on a
machine shared with other work the ratio of CPU times stays the ratio of work done (use it with
``--threads 1``, where it is also the wall-time ratio on an idle core).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import cpd
from cpd import _cpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import Table  # noqa: E402

LANES = {0: "generic", 16: "h16", 32: "f32", 33: "f32 sr", 34: "f32 directed", 64: "f64"}


def lanes(kw) -> str:
    ext = _cpu.extension()
    if ext is None:
        return "fallback"
    mul, acc = kw.get("mul"), kw["acc"]
    mode = cpd.Rounding(kw.get("rounding", "nearest")).code
    return LANES[ext.matmul_lanes(mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc), mode,
                                  False)]

CASES = [
    ("None", "FP32 (the default)", dict(acc=cpd.FP32)),
    ("E4M3", "FP32", dict(mul=cpd.E4M3, acc=cpd.FP32)),
    ("E5M2", "FP32", dict(mul=cpd.E5M2, acc=cpd.FP32)),
    ("None", "FP32 kahan", dict(acc=cpd.FP32, kahan=True)),
    ("E4M3", "FP32 kahan", dict(mul=cpd.E4M3, acc=cpd.FP32, kahan=True)),
    ("None", "BF16", dict(acc=cpd.BF16)),
    ("None", "TF32", dict(acc=cpd.TF32)),
    ("E5M2", "(5,10)", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10))),
    ("E5M2", "(5,10) kahan", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), kahan=True)),
    ("E5M2", "(6,7)", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(6, 7))),
    ("E5M2", "(6,7) kahan", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(6, 7), kahan=True)),
    ("E4M3", "BF16", dict(mul=cpd.E4M3, acc=cpd.BF16)),
    ("None", "FP16 fma", dict(acc=cpd.FP16, fma=True)),
    ("E5M2", "(5,10) block=32", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), block=32)),
    ("None", "FP16 fma stochastic", dict(acc=cpd.FP16, fma=True, rounding="stochastic")),
    ("E4M3", "BF16 stochastic", dict(mul=cpd.E4M3, acc=cpd.BF16, rounding="stochastic")),
    ("E5M2", "(5,10) kahan stochastic", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), kahan=True,
                                           rounding="stochastic")),
    ("None", "FP32 toward_zero", dict(acc=cpd.FP32, rounding="toward_zero")),
    ("E4M3", "FP32 down", dict(mul=cpd.E4M3, acc=cpd.FP32, rounding="down")),
    ("None", "BF16 up", dict(acc=cpd.BF16, rounding="up")),
    ("E5M2", "(5,10) kahan toward_zero", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), kahan=True,
                                            rounding="toward_zero")),
]


FLOOR_ROW = "Philox blocks alone (stochastic floor)"


def strided_words(ext, count: int, chunk: int = 1 << 14):
    """A function drawing `count` Philox4x32-10 blocks with the matmul's vector Philox (strided
    form, cuda/cpu/philox_simd.h): the words the stochastic rows' contract draws, one block per
    multiply-add (two with Kahan: numerics.h, "Accumulation"), with no rounding around them."""
    w = torch.empty(4 * chunk, dtype=torch.int32)

    def run():
        for b0 in range(0, count, chunk):
            m = min(chunk, count - b0)
            ext.philox_simd_out(w[: 4 * m], 2 * b0, 2, m, 1234, 0, True)
    return run


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def _time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = _clock()
        fn()
        times.append(_clock() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--only", default=None, help="run only the rows whose 'mul acc' text contains this")
    p.add_argument("--clock", choices=sorted(CLOCK), default="wall", help="wall seconds or process CPU seconds")
    args = p.parse_args()
    global _clock
    _clock = CLOCK[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.size
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    tab = Table("bench_matmul", ["case", "loop", "cpd ms", "torch.mm ms", "x torch.mm"], machine=_cpu.machine_line(),
                setup=f"{n}x{n}x{n} float32, {torch.get_num_threads()} threads, {args.clock} clock")
    for mul, acc, kw in CASES:
        if args.only and args.only not in f"{mul} {acc}":
            continue
        t_mm = _time(lambda: torch.mm(a, b), max(args.repeat, 50))
        t_cpd = _time(lambda: cpd.matmul(a, b, **kw), args.repeat)
        t_mm = min(t_mm, _time(lambda: torch.mm(a, b), max(args.repeat, 50)))
        tab.row(f"mul={mul} acc={acc}", lanes(kw), f"{t_cpd * 1e3:.2f}", f"{t_mm * 1e3:.3f}", f"{t_cpd / t_mm:.1f}")
    ext = _cpu.extension()
    ran_sr = any(kw.get("rounding") == "stochastic" and (not args.only or args.only in f"{mul} {acc}")
                 for mul, acc, kw in CASES)
    if ext is not None and ran_sr:
        # The stochastic rows cannot go below their Philox words: n^3 blocks, one thread's worth
        # (the ratio is the floor of a one-rounding-per-step row; Kahan draws twice as many).
        t_mm = _time(lambda: torch.mm(a, b), max(args.repeat, 50))
        t_w = _time(strided_words(ext, n ** 3), args.repeat)
        t_mm = min(t_mm, _time(lambda: torch.mm(a, b), max(args.repeat, 50)))
        tab.row(FLOOR_ROW, "philox", f"{t_w * 1e3:.2f}", f"{t_mm * 1e3:.3f}", f"{t_w / t_mm:.1f}")
    tab.save()


if __name__ == "__main__":
    main()
